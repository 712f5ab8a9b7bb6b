"""The gateway benchmark runs end to end (a tiny run: the numbers are not checked, the script is)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gateway_overhead.py"


@pytest.mark.parametrize(("client", "store"), [("raw", "sqlite"), ("httpx", "memory"), ("openai", "memory")])
def test_gateway_overhead_runs(client: str, store: str) -> None:
    args = ["--clients", "2", "--requests", "40", "--runs", "1", "--client", client, "--store", store]
    out = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"client={client} store={store}" in out.stdout
    assert "**added by the gateway**" in out.stdout
    # every recorded call reached the store, none dropped: 3 paths x (40 + warm-up) calls, 1 recorded path
    written = int(out.stdout.split("spans written=")[1].split()[0])
    assert written == 40 + 2 * 5
    assert "dropped=0" in out.stdout


def test_gateway_ab_runs() -> None:
    src = str(SCRIPT.parents[1] / "packages" / "core" / "src")
    args = [src, src, "--rounds", "2", "--requests", "60", "--clients", "2"]
    out = subprocess.run(
        [sys.executable, str(SCRIPT.with_name("gateway_ab.py")), *args], capture_output=True, text=True, timeout=180
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line for line in out.stdout.splitlines() if "gateway CPU" in line]
    assert [line[0] for line in lines] == ["A", "B", "B"]
    assert all("medians of 2 rounds" in line for line in lines[:2])
    assert lines[2].startswith("B / A: gateway CPU ")  # the ratio of the two medians


def test_gateway_overhead_reference_path_runs() -> None:
    """``--reference`` measures the bare forwarding proxy too (the floor under the gateway)."""
    args = ["--clients", "2", "--requests", "40", "--runs", "1", "--reference"]
    out = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    row = next(line for line in out.stdout.splitlines() if line.startswith("| minimal proxy (reference) |"))
    assert float(row.split("|")[2]) > 0  # its p50 was measured
    assert "| added by the minimal proxy (reference) |" in out.stdout


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="--instructions needs valgrind")
def test_gateway_ab_counts_instructions() -> None:
    src = str(SCRIPT.parents[1] / "packages" / "core" / "src")
    args = [src, src, "--instructions", "--rounds", "1", "--requests", "40", "--clients", "2"]
    out = subprocess.run(
        [sys.executable, str(SCRIPT.with_name("gateway_ab.py")), *args], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    counts = [float(line.split(": ")[1].split()[0]) for line in out.stdout.splitlines() if "instructions/call" in line]
    assert len(counts) == 2 and all(c > 10 for c in counts)  # thousands of instructions per call, each side
