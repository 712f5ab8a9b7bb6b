"""What every benchmark script stamps its output with, and reads back from a run folder.

The scripts run as ``uv run python benchmarks/<name>.py``, so this folder is on ``sys.path`` and they
import these as ``from _common import ...``.
"""

from __future__ import annotations

import json
import platform
import subprocess
from pathlib import Path

__all__ = ["git_commit", "cpu_name", "per_step", "parse_seeds", "generated_line"]


def git_commit() -> str:
    """The short commit the numbers come from, ``+dirty`` when tracked files were changed."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
        return sha.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else the platform's processor or machine."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def per_step(metrics: Path, key: str) -> list[float]:
    """``key`` of every ``metrics.jsonl`` row that has it, in order."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return [float(r[key]) for r in rows if key in r]


def parse_seeds(text: str) -> list[int]:
    """``0-4``, ``0,2,5`` or ``3``; a bad or empty list exits with what to write instead."""
    seeds: list[int] = []
    try:
        for part in text.split(","):
            if "-" in part:
                lo, hi = part.split("-", 1)
                seeds.extend(range(int(lo), int(hi) + 1))
            elif part.strip():
                seeds.append(int(part))
    except ValueError as exc:
        raise SystemExit(f"--seeds {text!r}: give seeds like 0-4 or 0,3,4") from exc
    if not seeds:
        raise SystemExit(f"--seeds {text!r} names no seed; use e.g. 0-4 or 0,1,2")
    return seeds


def generated_line(script: str, argv: list[str] | None, machine: str) -> str:
    """The header of a pasted result: ``Generated <UTC time> at commit <sha> by `<command>` (<cpu>, <machine>).``

    ``argv`` is what the script was given (``None``: ``sys.argv``); ``machine`` says what else
    matters for the numbers (threads, Python, load)."""
    import sys
    from datetime import UTC, datetime

    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    args = " ".join(argv if argv is not None else sys.argv[1:])
    command = f"uv run python benchmarks/{script} {args}".strip()
    return f"Generated {stamp} at commit `{git_commit()}` by `{command}` ({cpu_name()}, {machine})."
