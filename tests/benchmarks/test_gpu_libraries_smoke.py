"""``benchmarks/gpu_libraries.py`` end to end, in its own process (the drop is once per process)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.usefixtures("smollm2")
def test_gpu_libraries_prints_the_resident_set_before_and_after_the_drop() -> None:
    pytest.importorskip("torch")
    run = subprocess.run(
        [sys.executable, str(BENCHMARKS / "gpu_libraries.py"), "--threads", "2", "--tokens", "8"],
        capture_output=True,
        text=True,
        cwd=BENCHMARKS,
    )
    if "a GPU is present" in run.stderr:
        pytest.skip("a GPU is present: nothing to drop")
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith("Generated ")
    rows = re.findall(r"^\| ([a-z (),]+) \| ([\d.]+) \| ([\d.]+) \|$", run.stdout, re.M)
    assert [when for when, _, _ in rows] == [
        "model loaded",
        "torch backend made (dropped)",
        "after a forward and backward pass",
    ]
    gpu = [float(g) for _, _, g in rows]
    if gpu[0] < 0.01:
        pytest.skip("this torch maps no GPU library (a CPU-only build)")
    assert gpu[1] < 0.1 * gpu[0] and gpu[2] < 0.25 * gpu[0]  # measured: 0.30 -> 0.02 -> 0.02 GB
