"""Export at scale: does ``lightning-rl export`` run in constant memory, and how long does 100k rollouts take?

Fills two SQLite stores through the public store API with fake calculator rollouts
(``lightning_rl.testing.synthetic_store``: task groups of 4, two gateway-shaped ``llm.call`` spans
each, half with reward 1), a small one (``--rollouts / 10``) and a large one (``--rollouts``), then
runs each export as a user would, ``lightning-rl export ...`` in a child process, and reports its
wall time and the child's peak RSS. The child reports its own peak (``VmHWM`` of
``/proc/self/status``) as it exits: ``ru_maxrss`` would not do, since Linux carries over into it the
peak of the forked copy of this process from before ``exec``, which holds the store just filled.
Constant memory means the peak is the same for both stores while the time grows with the rollouts.

    uv run python benchmarks/export_scale.py                   # 100k rollouts (several minutes to fill)
    uv run python benchmarks/export_scale.py --rollouts 2000   # a quick check
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from _common import git_commit

from lightning_rl.store.sqlite import SQLiteStore
from lightning_rl.testing.synthetic_store import fill_fake_rollouts

__all__ = ["main"]

EXPORTS: dict[str, list[str]] = {
    "sft-openai": ["sft", "--min-reward", "1", "--out", "{dir}/sft.jsonl"],
    "sft-trl": ["sft", "--min-reward", "1", "--out", "{dir}/sft.parquet"],
    "dpo-openai": ["dpo", "--out", "{dir}/dpo.jsonl"],
    "transitions": ["transitions", "--out", "{dir}/transitions.parquet"],
}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rollouts", type=int, default=100_000, help="Rollouts in the large store (a multiple of 40).")
    p.add_argument("--exports", default="sft-openai,sft-trl,dpo-openai,transitions", help="Which exports to run.")
    p.add_argument("--dir", default=None, help="Keep the stores and exports here (reused when present).")
    return p.parse_args(argv)


async def fill(path: Path, rollouts: int) -> float:
    """Fill ``path`` with ``rollouts`` fake rollouts unless it already holds them; returns seconds taken."""
    store = SQLiteStore(path)
    try:
        if sum((await store.stats()).rollouts_by_status.values()) >= rollouts:
            return 0.0
        started = time.perf_counter()
        await fill_fake_rollouts(store, tasks=rollouts // 4, group_size=4)
        return time.perf_counter() - started
    finally:
        await store.close()


CHILD = """
import resource, sys
from lightning_rl.cli import main
code = main(sys.argv[1:])
try:
    peak = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
except (OSError, StopIteration):  # not Linux: ru_maxrss (may include the parent's pre-exec peak)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(f"peak_rss_kib {peak}", file=sys.stderr)
raise SystemExit(code)
"""
"""Runs ``lightning-rl`` and reports the process's own peak RSS (KiB) on its last stderr line."""


def run_export(store: Path, out_dir: Path, args: list[str]) -> tuple[float, float, str]:
    """Run one export in a child process; returns (seconds, peak RSS in MiB, its summary line)."""
    argv = [sys.executable, "-c", CHILD, "export", args[0], "--store", str(store)]
    argv += [a.replace("{dir}", str(out_dir)) for a in args[1:]]
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"export failed ({done.returncode}): {' '.join(argv[3:])}\n{done.stderr[-2000:]}")
    peak_kib = int(done.stderr.strip().splitlines()[-1].split()[1])
    return elapsed, peak_kib / 1024, done.stdout.strip().splitlines()[-1]


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    small_n, large_n = max(args.rollouts // 10, 40), args.rollouts
    names = [n for n in args.exports.split(",") if n]
    unknown = [n for n in names if n not in EXPORTS]
    if unknown:
        raise SystemExit(f"--exports: unknown {unknown}; choose from {', '.join(EXPORTS)}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.dir) if args.dir else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        print(f"export_scale: stores of {small_n} and {large_n} fake rollouts (2 calls each), exports {names}")
        results: dict[tuple[str, int], tuple[float, float, str]] = {}
        for n in (small_n, large_n):
            store = root / f"store-{n}.sqlite"
            took = asyncio.run(fill(store, n))
            size = store.stat().st_size / 2**20
            print(f"  store {n:>7} rollouts: {size:.0f} MiB" + (f", filled in {took:.0f} s" if took else ", reused"))
            out_dir = root / f"out-{n}"
            out_dir.mkdir(exist_ok=True)
            for name in names:
                results[(name, n)] = run_export(store, out_dir, EXPORTS[name])
        print(f"  {'export':<12} {'rollouts':>8} {'time':>8} {'rollouts/s':>10} {'peak RSS':>9}  output")
        for name in names:
            for n in (small_n, large_n):
                secs, rss, line = results[(name, n)]
                print(f"  {name:<12} {n:>8} {secs:>7.1f}s {n / secs:>10.0f} {rss:>6.0f} MiB  {line.split(' to ')[0]}")
            growth = results[(name, large_n)][1] / results[(name, small_n)][1]
            print(f"  {name:<12} peak RSS x{growth:.2f} for x{large_n / small_n:.0f} rollouts")
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"  {now}, commit {git_commit()}, {platform.machine()} {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, load {load:.1f}"
    )
    print(f"  command: uv run python benchmarks/export_scale.py {' '.join(sys.argv[1:])}".rstrip())


if __name__ == "__main__":
    main()
