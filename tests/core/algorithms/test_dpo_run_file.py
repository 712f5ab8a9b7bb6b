"""``lightning-rl train examples/calculator/dpo.toml`` runs end to end in a short configuration.

Real components throughout (tiny model, engine, gateway, SQLite store, runner, the unchanged calculator
agent). The warm start is skipped here (it takes minutes), so the untrained model's rewards mostly tie
and a step may find no pair; the preference update itself is tested in tests/core/training/test_dpo.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from lightning_rl.cli import main  # noqa: E402
from lightning_rl.demo.calculator import make_tasks  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "calculator" / "dpo.toml"


def test_train_runs_the_dpo_run_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    val = tmp_path / "val.jsonl"
    val.write_text("".join(t.model_dump_json() + "\n" for t in make_tasks(3, seed=99)))
    run_dir = tmp_path / "run"
    overrides = [
        "warm_start=null",
        f"run_dir={run_dir}",
        f"val_tasks={val}",
        "algorithm.steps=2",
        "algorithm.batch_size=2",
        "algorithm.group_size=3",
        "algorithm.concurrency=6",
        "algorithm.max_tokens=16",
        "algorithm.val_every=0",
        "algorithm.tensorboard=false",
        "algorithm.pairing=all",
    ]
    argv = ["train", str(EXAMPLE), "--quiet", *[a for o in overrides for a in ("--set", o)]]
    assert main(argv) == 0
    assert "held-out reward" in capsys.readouterr().out
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/reward_mean" in r]
    assert [r["step"] for r in train] == [1, 2]
    assert all("train/dpo_pairs" in r and r["train/n_rollouts"] + r["train/failed_rollouts"] == 6 for r in train)
    assert all("train/loss" in r for r in train if r["train/dpo_pairs"] > 0)
    config = json.loads((run_dir / "config.json").read_text())
    assert (config["update_rule"], config["unit"], config["pairing"], config["beta"]) == ("dpo", "rollout", "all", 0.1)
    assert (run_dir / "checkpoints" / "latest").read_text() == "step_00002"
