"""Metrics go to metrics.jsonl always and to TensorBoard event files when tensorboard is installed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_rl.trainer.metrics import MetricsLogger, plot_reward_curve


def test_metrics_reach_jsonl_and_tensorboard(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = MetricsLogger(tmp_path, tensorboard=True)
    logger.log({"step": 1, "train/reward_mean": 0.25, "train/loss": float("nan")})
    logger.log({"step": 2, "train/reward_mean": 0.75, "val/reward_mean": 0.5})
    logger.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    scalars = events.Tags()["scalars"]
    assert "train/reward_mean" in scalars and "val/reward_mean" in scalars
    assert "train/loss" not in scalars  # NaN is not plotted
    points = [(e.step, e.value) for e in events.Scalars("train/reward_mean")]
    assert points == [(1, 0.25), (2, 0.75)]
    png = plot_reward_curve(logger.history, tmp_path / "curve.png")
    assert png is not None and png.stat().st_size > 0


def test_tensorboard_off_writes_no_event_files(tmp_path: Path) -> None:
    logger = MetricsLogger(tmp_path, tensorboard=False)
    logger.log({"step": 1, "train/reward_mean": 0.5})
    logger.close()
    assert not (tmp_path / "tensorboard").exists()
