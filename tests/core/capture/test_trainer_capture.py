"""The trainer on captured calls: an agent whose model is a hosted endpoint trains the tiny policy.

The agent never calls the gateway; capture records its calls as text, the loop re-tokenises them
with the policy's tokenizer (``retokenize_samples``), and the torch backend updates on them with
recomputed old logprobs (a hosted model's logprobs are not the policy's).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from lightning_rl.agent import LLM
from lightning_rl.capture import retokenize_samples
from lightning_rl.credit import RolloutSample
from lightning_rl.gateway import running_gateway
from lightning_rl.testing import FakeUpstream
from lightning_rl.types import Transition, TransitionText

from .conftest import captured

pytest.importorskip("torch")

REPLIES = itertools.cycle(["short", "a longer reply", "mid one", "x"])


@pytest.fixture(scope="module")
def tiny_model_path() -> Path:
    from lightning_rl.engine.tiny import default_tiny_model

    return default_tiny_model()


@pytest.fixture
def hosted_url() -> Iterator[str]:
    """The fake upstream served from its own thread and loop (the trainer runs its own loop)."""
    ready = threading.Event()
    stop: asyncio.Event | None = None
    url: list[str] = []

    async def serve() -> None:
        nonlocal stop
        stop = asyncio.Event()
        async with running_gateway(FakeUpstream(responder=lambda body: next(REPLIES)).app) as base:
            url.append(f"{base}/v1")
            ready.set()
            await stop.wait()

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(60)
    yield url[0]
    assert stop is not None
    loop.call_soon_threadsafe(stop.set)
    thread.join(30)
    loop.close()


async def hosted_agent(task: dict[str, Any], llm: LLM) -> float:
    """Asks the hosted model (not ``llm``: it is not behind the gateway); reward from the reply's length."""
    client = openai.AsyncOpenAI(base_url=task["url"], api_key="sk-hosted", max_retries=0)
    try:
        reply = await client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": task["q"]}]
        )
    finally:
        await client.close()
    return (len(reply.choices[0].message.content or "") % 5) / 4


def _one_short_step(model: Path, run_dir: Path) -> dict[str, Any]:
    """Trainer settings of one step of 2 tasks x 2 rollouts on the tiny policy."""
    return {
        "model": str(model),
        "run_dir": str(run_dir),
        "steps": 1,
        "batch_size": 2,
        "group_size": 2,
        "max_tokens": 8,
        "val_every": 0,
        "tensorboard": False,
        "progress": False,
        "rollout_timeout_s": 60,
    }


def _tasks(hosted_url: str) -> list[Any]:
    from lightning_rl.types import Task

    return [Task(input={"q": f"tell me about {w}", "url": hosted_url}) for w in ("cats", "tea")]


async def test_the_trainer_updates_the_policy_on_captured_calls(
    tmp_path: Path, hosted_url: str, tiny_model_path: Path
) -> None:
    from lightning_rl.backends.torch_backend import TorchBackendConfig
    from lightning_rl.trainer import Trainer, TrainerConfig

    config = TrainerConfig(
        **_one_short_step(tiny_model_path, tmp_path / "run"),
        backend=TorchBackendConfig(lr=1e-2, old_logprobs="recompute"),
    )
    tasks = _tasks(hosted_url)
    async with captured("openinference"):
        result = await asyncio.to_thread(Trainer(config).fit, hosted_agent, tasks)
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    [train] = [r for r in rows if "train/reward_mean" in r]
    assert train["train/n_rollouts"] == 4 and train["train/failed_rollouts"] == 0
    assert train["train/n_transitions"] == 4
    assert train["train/n_updated_transitions"] > 0 and "train/loss" in train  # the update ran on re-tokenised calls


async def test_sft_from_traces_imitates_the_best_captured_calls(
    tmp_path: Path, hosted_url: str, tiny_model_path: Path
) -> None:
    """SFT uses captured calls as they are (re-tokenised text): the best attempt per task is imitated."""
    from lightning_rl.algorithms import SFT, SFTConfig

    config = SFTConfig(**_one_short_step(tiny_model_path, tmp_path / "sft"), min_reward=None, top_k=1)
    tasks = _tasks(hosted_url)
    async with captured("openllmetry"):
        result = await asyncio.to_thread(SFT(config).fit, hosted_agent, tasks)
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    [train] = [r for r in rows if "train/reward_mean" in r]
    assert train["train/n_rollouts"] == 4 and train["train/selected_rollouts"] == 2  # the best of each task
    assert train["train/optimizer_steps"] >= 1 and train["train/loss"] > 0  # fine-tuned on the captured text


def test_retokenize_samples_needs_a_tokenizer_only_when_there_is_text_to_tokenize() -> None:
    exact = Transition(prompt_ids=[1], response_ids=[2], rollout_id="r", attempt_id="a")
    text = Transition(
        prompt_ids=[],
        response_ids=[],
        rollout_id="r",
        attempt_id="a",
        exact_tokens=False,
        text=TransitionText(source="openinference"),
    )
    # the gateway's calls keep the engine's ids, even an empty response
    empty = Transition(prompt_ids=[1], response_ids=[], rollout_id="r", attempt_id="a", text=TransitionText())
    assert retokenize_samples([RolloutSample("r", "g", 1.0, [exact, empty])], None) == 0
    with pytest.raises(ValueError, match="need the policy's tokenizer"):
        retokenize_samples([RolloutSample("r", "g", 1.0, [exact, text])], None)
