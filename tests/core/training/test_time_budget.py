"""``TrainerConfig.time_budget_s`` ends a run on training time (validation excluded), and
``Trainer.evaluate`` scores a model without training it (the SFT sweep of benchmarks/beyond_imitation.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lightning_rl.backends.torch_backend import TorchBackendConfig
from lightning_rl.trainer import Trainer, TrainerConfig
from lightning_rl.types import Task

from .conftest import length_agent


def _config(tmp_path: Path, model: Path, **overrides: Any) -> TrainerConfig:
    base: dict[str, Any] = {
        "model": str(model),
        "run_dir": str(tmp_path / "run"),
        "steps": 50,
        "batch_size": 2,
        "group_size": 2,
        "max_tokens": 6,
        "val_every": 1,
        "tensorboard": False,
        "progress": False,
        "backend": TorchBackendConfig(lr=1e-3),
    }
    return TrainerConfig(**{**base, **overrides})


def test_the_time_budget_stops_training_and_still_validates_at_the_end(tmp_path: Path, tiny_model_path: Path) -> None:
    tasks = [Task(input={"q": f"tell me about {w}"}) for w in ("cats", "rain", "tea")]
    result = Trainer(_config(tmp_path, tiny_model_path, time_budget_s=1e-3)).fit(length_agent, tasks, tasks[:2])
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/elapsed_s" in r]
    assert len(steps) == 1 and steps[0]["train/elapsed_s"] == pytest.approx(steps[0]["train/step_s"])
    assert [r["step"] for r in rows if "val/reward_mean" in r] == [0.0, 1.0]  # before, and after the last step
    assert result.val_after is not None
    with pytest.raises(ValueError, match="time_budget_s"):
        _config(tmp_path, tiny_model_path, time_budget_s=0.0)


def test_no_step_starts_that_would_end_past_the_budget_at_the_last_steps_pace(
    tmp_path: Path, tiny_model_path: Path
) -> None:
    tasks = [Task(input={"q": f"tell me about {w}"}) for w in ("cats", "rain", "tea")]
    budget = 2.0
    Trainer(_config(tmp_path, tiny_model_path, time_budget_s=budget, val_every=0)).fit(length_agent, tasks)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [(r["train/elapsed_s"], r["train/step_s"]) for r in rows if "train/elapsed_s" in r]
    assert len(steps) >= 2  # a tiny-model step takes well under a second
    # every step after which training went on had room for one more step at its own pace ...
    assert all(elapsed + pace <= budget for elapsed, pace in steps[:-1])
    # ... and the last one did not (unless the step limit ended the run first)
    if len(steps) < 50:
        assert steps[-1][0] + steps[-1][1] > budget


def test_evaluate_scores_the_model_without_training_it(tmp_path: Path, tiny_model_path: Path) -> None:
    tasks = [Task(input={"q": f"tell me about {w}"}) for w in ("cats", "rain")]
    score = Trainer(_config(tmp_path, tiny_model_path, val_temperature=0.0)).evaluate(length_agent, tasks)
    assert 0.0 <= score <= 1.0
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["val/n_rollouts"] for r in rows] == [2.0] and not any("train/reward_mean" in r for r in rows)
