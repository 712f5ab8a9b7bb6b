"""Agents run by ``lightning-rl runner`` worker processes in the trainer fault tests.

This folder is put on the workers' ``PYTHONPATH``; these are real agents, not fakes.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from lightning_rl.agent import LLM


async def dies_once(task: dict[str, Any], llm: LLM) -> float:
    """One real model call; on the task marked ``die``, the first time, the worker process kills itself
    (SIGKILL: no cleanup, no goodbye to the store) right after that call, mid-rollout."""
    client = llm.async_openai_client(max_retries=0)
    try:
        reply = await client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": task["q"]}], **dict(llm.sampling)
        )
    finally:
        await client.close()
    marker = Path(task["marker"])
    if task.get("die") and not marker.exists():
        marker.write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    return (len(reply.choices[0].message.content or "") % 5) / 4
