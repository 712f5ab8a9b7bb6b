"""What every benchmark script stamps its output with, and reads back from a run folder.

The scripts run as ``uv run python benchmarks/<name>.py``, so this folder is on ``sys.path`` and they
import these as ``from _common import ...``.
"""

from __future__ import annotations

import json
import platform
import re
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "git_commit",
    "cpu_name",
    "per_step",
    "parse_seeds",
    "generated_line",
    "RssSampler",
    "rss_gb",
    "logged_peak_gb",
    "phase_peaks_gb",
    "paste_block",
]


def git_commit() -> str:
    """The short commit the numbers come from, ``+dirty`` when tracked files were changed."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
        return sha.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def paste_block(doc: Path, text: str, block: str) -> None:
    """Replace what is between ``<!-- block:begin -->`` and ``<!-- block:end -->`` in ``doc`` with ``text``:
    how a script's output reaches a README, so that no number there is typed by hand."""
    begin, end = f"<!-- {block}:begin -->", f"<!-- {block}:end -->"
    content = doc.read_text()
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if not pattern.search(content):
        raise SystemExit(f"{doc} has no {begin} ... {end} block to replace")
    doc.write_text(pattern.sub(lambda _: f"{begin}\n{text}{end}", content))


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


def rss_gb() -> float:
    """The process's resident memory now (``VmRSS``), in GB; NaN off Linux."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1e6
    except OSError:
        pass
    return float("nan")


def phase_peaks_gb(rows: Sequence[dict[str, Any]]) -> list[float]:
    """Every ``mem/<phase>_peak_gb`` value in a run's metrics rows (not ``mem/step_end/*``, which is
    what a step left, not a peak)."""
    return [
        float(v)
        for r in rows
        for k, v in r.items()
        if k.startswith("mem/") and k.endswith("_peak_gb") and isinstance(v, int | float) and not isinstance(v, bool)
    ]


def logged_peak_gb(metrics: Path) -> float:
    """The largest ``mem/<phase>_peak_gb`` a run logged (0.0 if none): the process's peak resident
    memory. Not its exit rusage: the trainer resets the kernel's high-water mark at every phase
    (``lightning_rl.memory.PeakMemory``), so ``wait4``'s max RSS is only the last window's."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return max(phase_peaks_gb(rows), default=0.0)


class RssSampler:
    """Samples a process's resident memory (``VmRSS``, with its children's) every ``every_s`` seconds
    in a thread, into ``trace`` as ``(seconds since start, GB)``: where in a run the memory goes, which
    a peak alone does not say. Linux only (``/proc``); elsewhere the trace stays empty. A sample can
    miss a peak shorter than ``every_s``: ``logged_peak_gb`` is the exact peak."""

    def __init__(self, pid: int, every_s: float = 0.25) -> None:
        self.pid, self.every_s = pid, every_s
        self.trace: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def peak_gb(self) -> float:
        return max((gb for _, gb in self.trace), default=0.0)

    def _run(self) -> None:
        start = time.perf_counter()
        while not self._stop.wait(self.every_s):
            kb = sum(_rss_kb(p) for p in _tree(self.pid))
            if kb:
                self.trace.append((time.perf_counter() - start, kb / 1e6))

    def write_csv(self, path: Path) -> None:
        path.write_text("seconds,rss_gb\n" + "".join(f"{t:.2f},{gb:.3f}\n" for t, gb in self.trace))


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (``/proc/<pid>/task/*/children``)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            try:
                todo.extend(int(c) for c in task.read_text().split())
            except OSError:
                pass
    return out


def _rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0
