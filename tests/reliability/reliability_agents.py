"""Agents of the reliability tests, loaded by ``lightning-rl runner --agent reliability_agents:<name>``
(this folder is put on the worker's ``PYTHONPATH``) or called in-process. Real agents, not fakes."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from lightning_rl.agent import LLM


def hang(task: dict[str, Any], llm: LLM) -> float:
    """Writes its pid to ``task["marker"]`` and hangs (the test kills the worker)."""
    Path(task["marker"]).write_text(str(os.getpid()))
    time.sleep(600)
    return 1.0


async def blocking_sometimes(task: dict[str, Any], llm: LLM) -> float:
    """An async agent with a bug: on ``task["block"]`` it calls ``time.sleep`` and freezes the loop."""
    if task.get("marker"):
        Path(task["marker"]).write_text(str(os.getpid()))
    if task.get("block"):
        time.sleep(task.get("seconds", 600))  # the bug the watchdog exists for
        return 0.0
    await asyncio.sleep(task.get("seconds", 0.2))
    return 1.0


async def quick(task: dict[str, Any], llm: LLM) -> float:
    await asyncio.sleep(0.05)
    return 1.0


async def leaks_a_key(task: dict[str, Any], llm: LLM) -> float:
    """Fails the way a real agent does: an exception message that quotes a secret."""
    raise RuntimeError(
        "upstream answered 401 to POST https://admin:hunter2secret@api.example.com/v1 with "
        "Authorization: Bearer sk-proj-abcdefghijklmnopqrstuvwx and api_key=AKIAABCDEFGHIJKLMNOP"
    )


async def calls_the_model(task: dict[str, Any], llm: LLM) -> float:
    """One real model call through the rollout's gateway URL; the reward is a function of the reply."""
    client = llm.async_openai_client(max_retries=2)
    try:
        reply = await client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": task["q"]}], **dict(llm.sampling)
        )
    finally:
        await client.close()
    return (len(reply.choices[0].message.content or "") % 5) / 4
