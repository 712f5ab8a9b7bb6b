"""The LightningRL loop end to end on CPU: store -> gateway -> runner -> agent -> adapter -> update -> publish.

A real tiny model, the real gateway on loopback, the real openai client inside the agent, a real
SQLite store; only the task is synthetic. Rewards are a deterministic function of the sampled text
so groups have variance and the update has non-zero advantages.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from lightning_rl import semconv
from lightning_rl.agent import LLM
from lightning_rl.backends.torch_backend import TorchBackendConfig
from lightning_rl.store.sqlite import SQLiteStore
from lightning_rl.trainer import Trainer, TrainerConfig
from lightning_rl.types import Task

from .conftest import length_agent


def _config(tmp_path: Path, tiny_model_path: Path, **overrides: Any) -> TrainerConfig:
    base: dict[str, Any] = {
        "model": str(tiny_model_path),
        "run_dir": str(tmp_path / "run"),
        "steps": 2,
        "batch_size": 3,
        "group_size": 4,
        "max_tokens": 8,
        "val_every": 0,
        "tensorboard": False,
        "progress": False,
        "rollout_timeout_s": 30,
        "backend": TorchBackendConfig(lr=1e-2, old_logprobs="sampled"),
    }
    base.update(overrides)
    return TrainerConfig(**base)


def test_two_grpo_steps_change_the_served_weights_and_write_metrics(tmp_path: Path, tiny_model_path: Path) -> None:
    tasks = [Task(input={"q": f"say something about {w}"}) for w in ("cats", "dogs", "rain", "tea")]
    started = time.perf_counter()
    result = Trainer(_config(tmp_path, tiny_model_path)).fit(length_agent, tasks, val_tasks=tasks[:2])
    assert time.perf_counter() - started < 60
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/reward_mean" in r]
    assert [r["step"] for r in train] == [1, 2]
    for row in train:
        assert row["train/n_rollouts"] == 12 and row["train/failed_rollouts"] == 0
        assert row["train/n_transitions"] == 12
        assert row["train/n_updated_transitions"] > 0 and "train/loss" in row and "train/clip_frac" in row
    v0 = train[0]["model_version"] - 1  # the engine's version before training
    assert [r["model_version"] for r in train] == [v0 + 1, v0 + 2]
    assert result.val_before is not None and result.val_after is not None
    assert (result.run_dir / "reward_curve.png").stat().st_size > 0

    # the rollouts of step 2 were served by the weights published after step 1
    async def versions_by_step() -> dict[str, set[int]]:
        store = SQLiteStore(result.run_dir / "store.sqlite")
        try:
            spans = await store.query_spans(name=semconv.SPAN_LLM_CALL)
            out: dict[str, set[int]] = {}
            for s in spans:
                step = s.rollout_id.split("-")[1]
                out.setdefault(step, set()).add(int(s.attributes[semconv.MODEL_VERSION]))
            return out
        finally:
            await store.close()

    versions = asyncio.run(versions_by_step())
    assert versions["s1"] == {v0} and versions["s2"] == {v0 + 1}

    # the checkpoint holds weights that differ from the initial model
    from transformers import AutoModelForCausalLM

    initial = AutoModelForCausalLM.from_pretrained(tiny_model_path).state_dict()
    saved = torch.load(result.run_dir / "checkpoints" / "step_00002" / "policy.pt", weights_only=False)["model"]
    assert any(not torch.equal(initial[k], saved[k]) for k in initial)


async def faulty_agent(task: dict[str, Any], llm: LLM) -> float:
    """Raises on some tasks, hangs past the timeout on others, works on the rest."""
    if task["kind"] == "raise":
        raise RuntimeError("agent bug")
    if task["kind"] == "hang":
        await asyncio.sleep(60)
    return await length_agent(task, llm)


def test_failures_and_hangs_are_counted_and_excluded_and_training_goes_on(
    tmp_path: Path, tiny_model_path: Path
) -> None:
    kinds = ["ok", "ok", "ok", "raise", "hang"]  # 20% raise, 20% hang
    tasks = [Task(input={"q": f"task {i}", "kind": k}) for i, k in enumerate(kinds)]
    cfg = _config(tmp_path, tiny_model_path, steps=1, batch_size=5, group_size=2, rollout_timeout_s=3.0)
    result = Trainer(cfg).fit(faulty_agent, tasks)
    (row,) = [r for r in result.history if "train/reward_mean" in r]
    assert row["train/failed_rollouts"] == 2  # the raising task's group
    assert row["train/timed_out_rollouts"] == 2  # the hanging task's group, timed out by the store
    assert row["train/n_rollouts"] == 6 and row["train/n_transitions"] == 6


def test_resume_continues_from_the_latest_checkpoint(tmp_path: Path, tiny_model_path: Path) -> None:
    tasks = [Task(input={"q": "hello"}), Task(input={"q": "world"})]
    cfg = _config(tmp_path, tiny_model_path, steps=1, batch_size=2, group_size=2)
    Trainer(cfg).fit(length_agent, tasks)
    cfg2 = _config(tmp_path, tiny_model_path, steps=2, batch_size=2, group_size=2, resume=True)
    result = Trainer(cfg2).fit(length_agent, tasks)
    steps = [r["step"] for r in result.history if "train/reward_mean" in r]
    assert steps == [2]  # step 1 came from the checkpoint
    assert result.history[-1]["model_version"] == 3  # v1 saved; resumed weights republished as v2; step 2 -> v3


def test_bad_trainer_config_is_rejected() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        TrainerConfig(batch_size=0)
    with pytest.raises(ValueError, match="temperature"):
        TrainerConfig(temperature=0.0)
