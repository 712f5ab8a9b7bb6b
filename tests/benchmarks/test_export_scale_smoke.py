"""The export benchmark runs end to end (a tiny run: the numbers are not checked, the script is)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "export_scale.py"


def test_export_scale_runs_and_stamps_its_output(tmp_path: Path) -> None:
    args = ["--rollouts", "80", "--exports", "sft-openai,transitions", "--dir", str(tmp_path)]
    out = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "sft-openai         80" in out.stdout and "wrote 80 records from 40 rollouts" in out.stdout
    assert "transitions        80" in out.stdout and "wrote 160 records from 80 rollouts" in out.stdout
    assert "peak RSS x" in out.stdout and ", commit " in out.stdout and "command: uv run python" in out.stdout
