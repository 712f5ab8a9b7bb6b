"""Agents loaded by ``lightning-rl runner --agent runner_agents:<name>`` in the process tests.

This folder is put on the worker's ``PYTHONPATH``; the functions are real agents, not fakes.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from lightning_rl.agent import LLM
from lightning_rl.tracing import current_rollout, emit_signal


def hang_on_first_attempt(task: dict[str, Any], llm: LLM) -> float:
    """Writes a marker with its pid and hangs on attempt 1 (the test kills the worker); succeeds after."""
    ctx = current_rollout()
    assert ctx is not None
    if ctx.attempt_number == 1:
        Path(task["marker"]).write_text(str(os.getpid()))
        time.sleep(120)
    emit_signal("recovered", float(ctx.attempt_number))
    return 1.0


async def quick(task: dict[str, Any], llm: LLM) -> float:
    """Sleeps a little and returns the task's value."""
    await asyncio.sleep(0.2)
    return float(task["x"])
