"""Does ``--seed`` repeat a run? The demo twice per mode, same seed, and how far the two runs part.

For each mode (default, ``--deterministic``) this runs ``lightning-rl demo`` twice in fresh
processes with the same seed and thread count, then compares the two ``metrics.jsonl`` files with
their timings removed: whether they are identical, at which step they first differ, and the largest
difference of the training and held-out rewards. It also prints each mode's wall time, so the
deterministic mode's cost is measured, not assumed.

    uv run python benchmarks/determinism.py --seed 0 --threads 2 -- --quick
    uv run python benchmarks/determinism.py --seed 0 --threads 1 -- --quick --steps 2

Arguments after ``--`` go to ``lightning-rl demo`` (both modes).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import generated_line

__all__ = ["main", "compare"]

_TIMING = re.compile(r"(_s$|per_s$|_seconds$|^mem/)")
"""Keys that measure the machine, not the run: wall-clock figures and peak memory."""


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{k: v for k, v in row.items() if not _TIMING.search(k) and k != "time"} for row in rows]


def compare(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> tuple[bool, int | None, float, float]:
    """(identical, first differing step, max |train reward diff|, max |held-out reward diff|)."""
    first: int | None = None
    train = held_out = 0.0
    for x, y in zip(a, b, strict=False):
        if x != y and first is None:
            first = int(x.get("step", -1))
        for key in ("train/reward_mean",):
            if key in x and key in y:
                train = max(train, abs(float(x[key]) - float(y[key])))
        if "val/reward_mean" in x and "val/reward_mean" in y:
            held_out = max(held_out, abs(float(x["val/reward_mean"]) - float(y["val/reward_mean"])))
    identical = a == b
    if not identical and first is None:  # one run logged more rows than the other
        first = int(a[min(len(a), len(b)) - 1].get("step", -1)) if a and b else 0
    return identical, first, train, held_out


def _run(out: Path, seed: int, threads: int | None, extra: list[str]) -> float:
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    # the CLI of this interpreter's environment, whether or not its scripts folder is on PATH
    command = [
        sys.executable,
        "-m",
        "lightning_rl.cli",
        "demo",
        "--seed",
        str(seed),
        "--out",
        str(out),
        "--quiet",
        *extra,
    ]
    started = time.perf_counter()
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads of each run (OMP_NUM_THREADS)")
    parser.add_argument("--out", default=None, help="folder for the runs (default: a temporary one)")
    parser.add_argument("demo_args", nargs="*", help="extra arguments for `lightning-rl demo` (after --)")
    args = parser.parse_args(argv)
    root = Path(args.out or tempfile.mkdtemp(prefix="determinism-"))
    lines: list[str] = []
    for mode, flags in (("default", []), ("deterministic", ["--deterministic"])):
        walls: list[float] = []
        runs: list[list[dict[str, Any]]] = []
        for i in range(2):
            folder = root / f"{mode}-{i}"
            walls.append(_run(folder, args.seed, args.threads, [*args.demo_args, *flags]))
            runs.append(_rows(folder))
            print(f"{mode} run {i + 1}: {walls[-1] / 60:.1f} min", flush=True)
        identical, first, train, held_out = compare(*runs)
        differs = "identical" if identical else f"first differs at step {first}"
        lines.append(
            f"| {mode} | {walls[0] / 60:.1f} / {walls[1] / 60:.1f} min | {differs} | {train:.3f} | {held_out:.3f} |"
        )
    machine = (
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}; torch threads: {args.threads or 'default'}; "
        f"load average at the end {os.getloadavg()[0]:.1f}"
    )
    print()
    print(generated_line("determinism.py", argv, machine))
    print()
    print("| mode | wall, run 1 / run 2 | metrics.jsonl without timings | max train reward gap | max held-out gap |")
    print("|---|---:|---|---:|---:|")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
