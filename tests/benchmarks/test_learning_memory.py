"""How ``learning.py`` finds a run's peak memory: the trainer resets the kernel's high-water mark per
phase, so the exit rusage alone under-reports it (3.8 GB against the 6.0 GB logged for the update in
the SmolLM2 demo, seed 0, 2 threads); the logged phase peaks and a sampled trace are read instead."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from _common import RssSampler, logged_peak_gb  # noqa: E402


def test_the_logged_peak_is_the_largest_phase_peak_of_any_row(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    rows = [{"step": 0, "mem/validation_peak_gb": 3.7, "mem/other_peak_gb": 4.1}, {"step": 1, "train/loss": 9.0}]
    rows.append({"step": 1, "mem/update_peak_gb": 5.9, "mem/publish_peak_gb": 2.2})
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert logged_peak_gb(metrics) == 5.9


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_sampler_sees_a_child_process_hold_memory(tmp_path: Path) -> None:
    # a parent that starts a child holding 300 MB: the trace follows the whole process tree
    code = (
        "import subprocess, sys; subprocess.run([sys.executable, '-c', "
        "'import time; b = bytearray(300_000_000); b[::4096] = b\"\\\\x01\" * len(b[::4096]); time.sleep(1.5)'])"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    with RssSampler(proc.pid, every_s=0.05) as rss:
        proc.wait()
    assert rss.peak_gb >= 0.3
    rss.write_csv(tmp_path / "rss.csv")
    lines = (tmp_path / "rss.csv").read_text().splitlines()
    assert lines[0] == "seconds,rss_gb" and len(lines) == len(rss.trace) + 1
