"""benchmarks/store_calls.py: one tree against itself gives the same calls per rollout on each side."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_tree_against_itself_costs_the_same_calls_per_rollout() -> None:
    src = str(ROOT / "packages" / "core" / "src")
    args = [src, src, "--small", "20", "--large", "120", "--top", "3"]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "store_calls.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    ratios = {
        m[1]: (int(m[2]), int(m[3]), float(m[4]))
        for m in re.finditer(
            r"^(server|client): A (\d+), B (\d+) Python calls per rollout \(B / A ([\d.]+)\)$", proc.stdout, re.M
        )
    }
    assert set(ratios) == {"server", "client"}, proc.stdout
    for side, (a, b, ratio) in ratios.items():
        # a rollout is three requests: hundreds of calls on each side; the same code within a few per cent,
        # (how many requests share an event-loop step moves the server's count by a few calls)
        assert a > 100 and b > 100, (side, proc.stdout)
        assert 0.85 < ratio < 1.18, (side, proc.stdout)  # measured: 0.94-1.02 at these sizes
