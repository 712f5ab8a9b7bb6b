"""The APO parallelism benchmark runs end to end (a tiny run: the numbers are not checked, the script is)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "apo_parallel.py"


def test_apo_parallel_runs() -> None:
    args = ["--candidates", "2", "--tasks", "2", "--concurrency", "4", "--sleep", "0.05", "--repeats", "1"]
    out = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "apo_parallel: 2 candidates x 2 tasks, concurrency 4" in out.stdout
    assert "ratio " in out.stdout and "commit " in out.stdout
