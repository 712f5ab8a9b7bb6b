"""Does the demo learn? ``lightning-rl demo`` once per seed (and optionally again), as a newcomer runs it.

Learning is stochastic, so one run per seed proves little: this script runs the unchanged demo
command in a fresh process per seed, reads each run's ``metrics.jsonl``, and writes

- a markdown table (held-out reward before/after, gain, wall time per run; mean and min of the gain),
  headed by the date, the commit, the command and the machine, to ``<out>/learning.md`` and stdout;
- ``<out>/learning.png``: every run's held-out reward curve on one plot;
- ``<out>/learning.json``: the same numbers, machine-readable.

``--repeat N`` runs each seed N times: the spread between runs of the same seed (float rounding of
batched decoding, thread scheduling) is measured, not assumed. ``--threads`` sets the torch thread
count of the runs (``OMP_NUM_THREADS``), because a float result on one thread count is not a result
on another. ``--readme FILE`` replaces the text between ``<!-- learning:begin -->`` and
``<!-- learning:end -->`` in FILE with the table, so the README's numbers are this output, never typed.

    uv run python benchmarks/learning.py --seeds 0-4                      # the README's table
    uv run python benchmarks/learning.py --seeds 0 --repeat 3             # run-to-run spread of one seed
    uv run python benchmarks/learning.py --seeds 0-4 --threads 1          # another thread count
    uv run python benchmarks/learning.py --paste runs/learning/learning.md --readme README.md  # paste an earlier run
    uv run python benchmarks/learning.py --seeds 0-2 --block smollm2-demo --readme README.md -- --model smollm2-135m

Each row also shows the run's peak memory (GB of 10^9 bytes: the largest of the demo process's
``mem/*_peak_gb`` in metrics.jsonl, its exit rusage and a trace sampled every 0.25 s, which
``<out>/<run>.rss.csv`` and ``<out>/rss.png`` keep) and the
median over its steps of the rollout and update throughput that ``metrics.jsonl`` records
(``train/rollout_tokens_per_s``: generated tokens per second of a step's rollouts;
``train/update_tokens_per_s``: response tokens trained per second of the update). ``--block NAME``
pastes into ``<!-- NAME:begin -->`` ... ``<!-- NAME:end -->`` instead of the ``learning`` block.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _common import RssSampler, cpu_name, git_commit, logged_peak_gb, parse_seeds, paste_block

DEFAULT_BLOCK = "learning"


@dataclass
class RunResult:
    seed: int
    repeat: int
    before: float
    after: float
    wall_s: float
    curve: list[tuple[int, float]] = field(default_factory=list[tuple[int, float]])
    peak_rss_mb: float = 0.0
    rollout_tokens_per_s: float = 0.0
    update_tokens_per_s: float = 0.0
    rss_trace: list[tuple[float, float]] = field(default_factory=list[tuple[float, float]], repr=False)

    @property
    def gain(self) -> float:
        return self.after - self.before


def demo_command(seed: int, out: Path, extra: list[str]) -> list[str]:
    exe = Path(sys.executable).parent / "lightning-rl"
    base = [str(exe)] if exe.exists() else [sys.executable, "-m", "lightning_rl.cli"]
    return [*base, "demo", "--seed", str(seed), "--out", str(out), "--quiet", *extra]


def held_out_curve(metrics: Path) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return [(int(r["step"]), float(r["val/reward_mean"])) for r in rows if "val/reward_mean" in r]


def median_metric(metrics: Path, key: str) -> float:
    """The median of ``key`` over the steps of ``metrics.jsonl`` that record it (0.0 if none)."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    values = [float(r[key]) for r in rows if key in r]
    return statistics.median(values) if values else 0.0


def run_one(seed: int, repeat: int, out: Path, threads: int | None, extra: list[str]) -> RunResult:
    run_dir = out / f"seed{seed}" if repeat == 0 else out / f"seed{seed}-r{repeat}"
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    env = dict(os.environ)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    started = time.perf_counter()
    log_path = out / f"{run_dir.name}.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(demo_command(seed, run_dir, extra), env=env, stdout=log, stderr=subprocess.STDOUT)
        # wait4: this child's own resource usage, whatever other runs do at the same time
        with RssSampler(proc.pid) as rss:
            _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - started
    rss.write_csv(out / f"{run_dir.name}.rss.csv")
    if proc.returncode != 0:
        raise SystemExit(f"the demo failed for seed {seed} (exit {proc.returncode}); see {log_path}")
    metrics = run_dir / "metrics.jsonl"
    curve = held_out_curve(metrics)
    if len(curve) < 2:
        raise SystemExit(f"seed {seed}: metrics.jsonl has {len(curve)} held-out rows; expected before and after")
    return RunResult(
        seed,
        repeat,
        curve[0][1],
        curve[-1][1],
        wall,
        curve,
        # the trainer resets the kernel's high-water mark per phase, so ru_maxrss is only the last
        # phase's: the peak is the largest of it, the phases' logged peaks and the sampled trace
        peak_rss_mb=max(usage.ru_maxrss / 1024, logged_peak_gb(metrics) * 1e3, rss.peak_gb * 1e3),
        rss_trace=rss.trace,
        rollout_tokens_per_s=median_metric(metrics, "train/rollout_tokens_per_s"),
        update_tokens_per_s=median_metric(metrics, "train/update_tokens_per_s"),
    )


def table(results: list[RunResult], header: dict[str, str]) -> str:
    lines = [
        f"Generated {header['date']} at commit `{header['commit']}` by `{header['command']}` "
        f"({header['machine']}; torch threads: {header['threads']}).",
        "",
        "| seed | run | held-out before | after | gain | wall | peak RSS | rollout tok/s | update tok/s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        cells = [str(r.seed), str(r.repeat + 1), f"{r.before:.2f}", f"{r.after:.2f}", f"**{r.gain:+.2f}**"]
        cells += [f"{r.wall_s / 60:.1f} min", f"{r.peak_rss_mb / 1e3:.1f} GB"]
        cells += [f"{r.rollout_tokens_per_s:.0f}", f"{r.update_tokens_per_s:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    gains = [r.gain for r in results]
    walls = [r.wall_s / 60 for r in results]
    lines += [
        "",
        f"Gain over {len(results)} runs: mean **{statistics.fmean(gains):+.2f}**, min **{min(gains):+.2f}**, "
        f"max {max(gains):+.2f}. Wall time: mean {statistics.fmean(walls):.1f} min, max {max(walls):.1f} min.",
    ]
    by_seed: dict[int, list[RunResult]] = {}
    for r in results:
        by_seed.setdefault(r.seed, []).append(r)
    repeated = {s: rs for s, rs in by_seed.items() if len(rs) > 1}
    for seed, rs in repeated.items():
        afters = [r.after for r in rs]
        befores = [r.before for r in rs]
        lines.append(
            f"Seed {seed} run {len(rs)} times: before {min(befores):.2f}-{max(befores):.2f}, "
            f"after {min(afters):.2f}-{max(afters):.2f} (same seed, same machine: the run-to-run spread)."
        )
    return "\n".join(lines) + "\n"


def _label(r: RunResult) -> str:
    return f"seed {r.seed}" + (f" (run {r.repeat + 1})" if r.repeat else "")


def _plot(
    path: Path,
    title: str,
    xlabel: str,
    ylabel: str,
    lines: list[tuple[str, list[float], list[float]]],
    ylim: tuple[float, float] | None = None,
) -> None:
    """One figure of labelled lines, saved to ``path`` (nothing, with a note, without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed: no {path.name} (pip install matplotlib)", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, xs, ys in lines:
        ax.plot(xs, ys, marker="o" if len(xs) < 50 else None, lw=1.5 if len(xs) < 50 else 0.8, label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if ylim is not None:
        ax.set_ylim(*ylim)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot(results: list[RunResult], path: Path) -> None:
    """Every run's held-out reward curve."""
    lines = [(_label(r), [float(s) for s, _ in r.curve], [v for _, v in r.curve]) for r in results]
    title, ylabel = "lightning-rl demo: held-out reward per seed", "held-out reward (unseen tasks)"
    _plot(path, title, "GRPO step", ylabel, lines, ylim=(-0.02, 1.02))


def plot_rss(results: list[RunResult], path: Path) -> None:
    """Every run's sampled resident memory over its wall time: where the peak sits in a run."""
    lines = [
        (_label(r), [t / 60 for t, _ in r.rss_trace], [gb for _, gb in r.rss_trace]) for r in results if r.rss_trace
    ]
    _plot(path, "lightning-rl demo: memory over a run", "minutes", "resident memory (GB, sampled every 0.25 s)", lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0-4", help="seeds to run: 0-4, or 0,2,5")
    ap.add_argument("--repeat", type=int, default=1, help="runs per seed (>1 measures run-to-run spread)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads of each run (OMP_NUM_THREADS)")
    ap.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="runs at once (>1 shares the cores: learning is measured, wall times are not comparable)",
    )
    ap.add_argument("--out", default="runs/learning", help="folder for the runs, table, plot and json")
    ap.add_argument("--readme", default=None, help="replace the learning block of this file with the table")
    ap.add_argument("--block", default=DEFAULT_BLOCK, help="the README block to replace: <!-- BLOCK:begin -->")
    ap.add_argument(
        "--paste",
        default=None,
        metavar="LEARNING_MD",
        help="run nothing: paste this earlier output (a learning.md) into --readme, unchanged",
    )
    ap.add_argument("demo_args", nargs="*", help="extra arguments for `lightning-rl demo` (after --)")
    args = ap.parse_args(argv)
    if args.paste:
        if not args.readme:
            raise SystemExit("--paste needs --readme FILE: the file whose learning block gets the table")
        paste_block(Path(args.readme), Path(args.paste).read_text(), args.block)
        return 0
    if args.repeat < 1:
        raise SystemExit("--repeat must be >= 1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    argv_text = " ".join(sys.argv[1:] if argv is None else argv)
    header = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_commit(),
        "command": f"uv run python benchmarks/learning.py {argv_text}".strip(),
        "machine": f"{cpu_name()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "threads": str(args.threads) if args.threads else "default",
    }
    if args.jobs > 1:
        header["machine"] += f"; {args.jobs} runs at once, so wall times are not comparable"
    plan = [(seed, k) for seed in parse_seeds(args.seeds) for k in range(args.repeat)]

    def one(item: tuple[int, int]) -> RunResult:
        seed, k = item
        r = run_one(seed, k, out, args.threads, args.demo_args)
        print(
            f"seed {seed} run {k + 1}: {r.before:.2f} -> {r.after:.2f} ({r.gain:+.2f}) in {r.wall_s:.0f} s", flush=True
        )
        return r

    with ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        results = list(pool.map(one, plan))
    text = table(results, header)
    print(text)
    (out / "learning.md").write_text(text)
    runs = [{k: v for k, v in asdict(r).items() if k != "rss_trace"} | {"gain": r.gain} for r in results]
    payload: dict[str, Any] = {**header, "runs": runs}
    (out / "learning.json").write_text(json.dumps(payload, indent=2))
    plot(results, out / "learning.png")
    plot_rss(results, out / "rss.png")
    if args.readme:
        paste_block(Path(args.readme), text, args.block)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
