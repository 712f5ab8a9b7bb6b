"""Fixtures for the training tests: the tiny model (built once, cached) and a fresh policy from it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from lightning_rl.agent import LLM

pytest.importorskip("torch")
pytest.importorskip("transformers")

if TYPE_CHECKING:
    from lightning_rl.engine.hf import TransformersEngine
    from lightning_rl.types import Transition


@pytest.fixture(scope="session")
def tiny_model_path() -> Path:
    from lightning_rl.engine.tiny import default_tiny_model

    return default_tiny_model()


def sampled_transitions(engine: TransformersEngine, n: int = 8) -> list[Transition]:
    """``n`` short arithmetic prompts, one sampled completion each (seeded), with the engine's logprobs."""

    from lightning_rl.engine.base import SamplingParams
    from lightning_rl.types import Transition

    async def run() -> list[Transition]:
        prompts = [engine.encode_text(f"question {i}: what is {i} plus {i}?") for i in range(n)]
        outs = await asyncio.gather(
            *(engine.generate(p, SamplingParams(max_tokens=12, seed=i)) for i, p in enumerate(prompts))
        )
        return [
            Transition(
                prompt_ids=p, response_ids=o.token_ids, response_logprobs=o.logprobs, rollout_id=f"r{i}", attempt_id="a"
            )
            for i, (p, o) in enumerate(zip(prompts, outs, strict=True))
        ]

    return asyncio.run(run())


async def length_agent(task: dict[str, Any], llm: LLM) -> float:
    """One chat call; the reward depends on what was sampled (so a group has variance)."""
    client = llm.async_openai_client(max_retries=0)
    try:
        reply = await client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": task["q"]}], **dict(llm.sampling)
        )
    finally:
        await client.close()
    return (len(reply.choices[0].message.content or "") % 5) / 4
