"""``benchmarks/phase_memory.py``: a run's per-step phase peaks, read back from the metrics.jsonl it logged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import load_benchmark


def _run(folder: Path, records: list[dict[str, float]]) -> Path:
    folder.mkdir()
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def test_phase_memory_prints_a_row_per_run_and_phase(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_benchmark("phase_memory")
    a = _run(
        tmp_path / "a",
        [
            {"step": 0.0, "mem/validation_peak_gb": 2.5},
            {
                "step": 1.0,
                "mem/rollouts_peak_gb": 2.2,
                "mem/publish_peak_gb": 1.7,
                "mem/step_end/malloc_in_use_gb": 0.9,
            },
            {"step": 2.0, "mem/rollouts_peak_gb": 2.4, "mem/publish_peak_gb": 1.8},
            {"step": 2.0, "mem/rollouts_peak_gb": 2.6},  # logged twice in a step: the larger is its peak
        ],
    )
    b = _run(tmp_path / "b", [{"step": 1.0, "mem/rollouts_peak_gb": 3.1}])
    bench.main([f"before={a}", f"after={b}", "--phases", "publish,rollouts,step_end/malloc_in_use"])
    out = capsys.readouterr().out
    assert out.startswith("Generated ")
    assert "| run | phase | step 1 | step 2 |" in out
    assert "| before | publish | 1.70 | 1.80 |" in out
    assert "| before | rollouts | 2.20 | 2.60 |" in out
    assert "| after | rollouts | 3.10 |  |" in out
    assert "| before | step_end/malloc_in_use | 0.90 |  |" in out  # what a step left, by kind


def test_phase_memory_says_which_folder_has_no_metrics(tmp_path: Path) -> None:
    bench = load_benchmark("phase_memory")
    with pytest.raises(SystemExit):
        bench.main([f"x={tmp_path}"])


def test_phase_memory_times_sum_the_steps_and_set_apart_the_kl_updates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_benchmark("phase_memory")
    run = _run(
        tmp_path / "run",
        [
            {"step": 0.0, "val/reward_mean": 0.1},  # an evaluation: no training time
            {"step": 1.0, "train/rollout_s": 10.0, "train/update_s": 20.0, "train/elapsed_s": 31.0},
            {
                "step": 2.0,
                "train/rollout_s": 12.0,
                "train/update_s": 25.0,
                "train/kl_to_start": 0.05,
                "train/elapsed_s": 69.0,
            },
        ],
    )
    assert bench.phase_seconds(run / "metrics.jsonl") == {
        "rollouts": 22.0,
        "updates": 45.0,
        "kl_updates": 25.0,
        "training": 69.0,
        "steps": 2.0,
    }
    bench.main([f"r={run}", "--phases", "update", "--times"])
    assert "| r | 2 | 22 s | 45 s | 25 s | 69 s |" in capsys.readouterr().out
