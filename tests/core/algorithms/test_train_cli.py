"""``lightning-rl train`` runs each example run file end to end (GRPO, SFT, APO), in a short configuration.

Real components throughout: the tiny model on the embedded engine, the gateway, the SQLite store in
the run folder, the runner and the unchanged agents. The calculator files skip their warm start here
(it takes minutes), so SFT selects the best attempt per task instead of the right answers.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from lightning_rl.cli import main  # noqa: E402
from lightning_rl.demo.calculator import make_tasks  # noqa: E402
from lightning_rl.store.sqlite import SQLiteStore  # noqa: E402
from lightning_rl.types import Resources  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

SHORT = [
    "warm_start=null",
    "algorithm.steps=2",
    "algorithm.batch_size=2",
    "algorithm.group_size=3",
    "algorithm.concurrency=6",
    "algorithm.max_tokens=16",
    "algorithm.val_every=0",
    "algorithm.tensorboard=false",
]


def _val_file(tmp_path: Path) -> Path:
    path = tmp_path / "val.jsonl"
    path.write_text("".join(t.model_dump_json() + "\n" for t in make_tasks(3, seed=99)))
    return path


async def _latest_resources(path: Path) -> Resources:
    store = SQLiteStore(path)
    try:
        return await store.get_resources()
    finally:
        await store.close()


def _rows(run_dir: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("algorithm", ["grpo", "sft"])
def test_train_runs_the_calculator_run_files(
    algorithm: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    overrides = [*SHORT, f"run_dir={run_dir}", f"val_tasks={_val_file(tmp_path)}"]
    if algorithm == "sft":  # the untrained tiny model never answers right: imitate each task's best attempt
        overrides += ["algorithm.min_reward=null", "algorithm.top_k=1"]
    store = tmp_path / "elsewhere.sqlite" if algorithm == "grpo" else run_dir / "store.sqlite"
    if algorithm == "grpo":  # a store named by the file instead of the run folder's
        overrides.append(f"store={store}")
    argv = ["train", str(EXAMPLES / "calculator" / f"{algorithm}.toml"), "--quiet"]
    assert main([*argv, *[a for o in overrides for a in ("--set", o)]]) == 0
    assert "held-out reward" in capsys.readouterr().out
    train = [r for r in _rows(run_dir) if "train/reward_mean" in r]
    assert [r["step"] for r in train] == [1, 2]
    assert all(r["train/n_rollouts"] + r["train/failed_rollouts"] == 6 for r in train)
    assert [r["model_version"] for r in train] == [train[0]["model_version"], train[0]["model_version"] + 1]
    if algorithm == "sft":
        assert all(r["train/selected_rollouts"] == 2 for r in train)  # top-1 of each of the 2 tasks
        assert all("train/loss" in r for r in train if r["train/n_updated_transitions"] > 0)
        assert any(r["train/n_updated_transitions"] > 0 for r in train)
    # the run folder of the demo: config, metrics, curve, store, checkpoint, and the file as run
    for name in ("config.json", "metrics.jsonl", "reward_curve.png", "train_config.json"):
        assert (run_dir / name).exists(), name
    assert store.stat().st_size > 0 and (run_dir / "store.sqlite").exists() == (algorithm == "sft")
    # every resources version records the weights it served: the last (final validation) the final weights
    latest = asyncio.run(_latest_resources(store))
    assert latest.extra == {
        "model_version": train[-1]["model_version"],
        "update_rule": "sft" if algorithm == "sft" else "policy_gradient",
    }
    assert (run_dir / "checkpoints" / "latest").read_text() == "step_00002"
    assert json.loads((run_dir / "config.json").read_text())["update_rule"] == (
        "sft" if algorithm == "sft" else "policy_gradient"
    )
    assert json.loads((run_dir / "train_config.json").read_text())["algorithm"]["steps"] == 2


def test_train_runs_the_apo_run_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("lightning_rl.algorithms.apo")
    run_dir = tmp_path / "apo"
    overrides = [
        f"algorithm.run_dir={run_dir}",
        "algorithm.rounds=1",
        "algorithm.candidates_per_round=1",
        "algorithm.tasks_per_eval=2",
        "algorithm.tensorboard=false",
    ]
    argv = ["train", str(EXAMPLES / "apo" / "config.toml"), "--quiet"]
    assert main([*argv, *[a for o in overrides for a in ("--set", o)]]) == 0
    assert "held-out reward" in capsys.readouterr().out
    assert (run_dir / "metrics.jsonl").exists() and (run_dir / "train_config.json").exists()


def test_train_runs_the_autogen_calc_agent_run_file(tmp_path: Path) -> None:
    pytest.importorskip("autogen_agentchat")
    run_dir = tmp_path / "calc"
    overrides = [*SHORT, f"run_dir={run_dir}", "val_tasks=null"]
    argv = ["train", str(EXAMPLES / "calc_agent" / "config.toml"), "--quiet"]
    assert main([*argv, *[a for o in overrides for a in ("--set", o)]]) == 0
    train = [r for r in _rows(run_dir) if "train/reward_mean" in r]
    assert [r["step"] for r in train] == [1, 2] and all(r["train/n_rollouts"] == 6 for r in train)
