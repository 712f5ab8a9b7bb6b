"""SFT from traces against GRPO on the demo task: held-out gain and wall time at the same rollout budget.

Per seed this script warm-starts the demo's tiny model once (exactly as ``lightning-rl demo --quick``
does), then runs two phases from that same warm start:

- **GRPO**: the demo's RL phase (``demo_trainer_config``; the quick configuration: 6 steps x 8 tasks
  x 8 rollouts), its tuned learning rate;
- **SFT from traces** (``lightning_rl.algorithms.SFT``): the same steps, tasks per step, rollouts per
  task, sampling and held-out tasks, so both see the same number of training rollouts; each round
  fine-tunes on the attempts with reward >= ``--min-reward`` (their recorded token ids), ``--sft-epochs``
  passes at ``--sft-lr``.

One process per seed writes ``<out>/seed<N>/result.json``; ``--report`` gathers every seed found under
``<out>`` into a markdown table (held-out before/after and gain per phase, wall time of each phase;
mean and min of the gains), headed by the date, commit, commands and machine, to ``<out>/sft_vs_grpo.md``.
``--readme FILE`` pastes that table between ``<!-- sft-vs-grpo:begin -->`` and ``<!-- sft-vs-grpo:end -->``.

    uv run python benchmarks/sft_vs_grpo.py --seed 0 --threads 1       # one seed (run seeds 1, 2 likewise)
    uv run python benchmarks/sft_vs_grpo.py --report --readme benchmarks/README.md
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BEGIN, END = "<!-- sft-vs-grpo:begin -->", "<!-- sft-vs-grpo:end -->"


def git_commit() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
        return sha.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def cpu_name() -> str:
    info = Path("/proc/cpuinfo")
    if info.exists():
        for line in info.read_text().splitlines():
            if "model name" in line:
                return line.split(":", 1)[1].strip()
    return platform.machine()


def train_rollouts(metrics: Path) -> int:
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return int(sum(r.get("train/n_rollouts", 0) for r in rows))


def run_seed(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    from lightning_rl.algorithms.sft import SFT, SFTConfig
    from lightning_rl.demo.calculator import calculator_agent, make_tasks
    from lightning_rl.demo.run import DemoConfig, demo_trainer_config, warm_start
    from lightning_rl.engine.models import resolve_model
    from lightning_rl.trainer import Trainer, TrainerConfig

    cfg = DemoConfig.quick(seed=args.seed, progress=False)
    out = Path(args.out) / f"seed{args.seed}"
    tasks = make_tasks(cfg.n_train + cfg.n_val + cfg.n_probe, seed=cfg.seed)
    train, val = tasks[: cfg.n_train], tasks[cfg.n_train : cfg.n_train + cfg.n_val]
    probe = tasks[cfg.n_train + cfg.n_val :]
    t0 = time.perf_counter()
    warm = warm_start(resolve_model("tiny"), out / "warm_start", cfg, train, probe)
    warm_s = time.perf_counter() - t0
    print(f"seed {args.seed}: warm start {warm_s:.0f} s", flush=True)

    phases: dict[str, dict[str, Any]] = {}
    grpo_cfg = demo_trainer_config(str(warm), str(out / "grpo"), cfg, progress=False, tensorboard=False)
    shared = {f.name: getattr(grpo_cfg, f.name) for f in dataclasses.fields(TrainerConfig)}
    shared["backend"] = dataclasses.replace(grpo_cfg.backend, lr=args.sft_lr)
    sft_cfg = SFTConfig(
        **{**shared, "run_dir": str(out / "sft"), "update_rule": "sft"},
        min_reward=args.min_reward,
        sft_epochs=args.sft_epochs,
        sft_batch_size=args.sft_batch_size,
    )
    for name, algorithm in (("grpo", Trainer(grpo_cfg)), ("sft", SFT(sft_cfg))):
        t0 = time.perf_counter()
        result = algorithm.fit(calculator_agent, train, val)
        seconds = time.perf_counter() - t0
        phases[name] = {
            "before": result.val_before,
            "after": result.val_after,
            "seconds": seconds,
            "train_rollouts": train_rollouts(result.run_dir / "metrics.jsonl"),
        }
        print(
            f"seed {args.seed} {name}: {result.val_before:.2f} -> {result.val_after:.2f} in {seconds:.0f} s", flush=True
        )
    record = {
        "seed": args.seed,
        "warm_start_s": warm_s,
        "phases": phases,
        "grpo_lr": grpo_cfg.backend.lr,
        "sft": {
            "lr": args.sft_lr,
            "min_reward": args.min_reward,
            "epochs": args.sft_epochs,
            "batch_size": args.sft_batch_size,
        },
        "commit": git_commit(),
        "threads": torch.get_num_threads(),
        "command": "uv run python benchmarks/sft_vs_grpo.py " + " ".join(sys.argv[1:]),
        "date": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
    }
    (out / "result.json").write_text(json.dumps(record, indent=2))
    return record


def report(out: Path) -> str:
    records = [json.loads(p.read_text()) for p in sorted(out.glob("seed*/result.json"))]
    if not records:
        raise SystemExit(f"no seed*/result.json under {out}; run the seeds first (see --help)")
    first = records[0]
    sft = first["sft"]
    commands = "; ".join(sorted({f"`{r['command'].strip()}`" for r in records}))
    lines = [
        f"Generated {datetime.now(UTC):%Y-%m-%d %H:%M} UTC from runs at commit `{first['commit']}` "
        f"({', '.join(r['date'] for r in records)}) by {commands}, then "
        f"`uv run python benchmarks/sft_vs_grpo.py --report` ({cpu_name()}, {os.cpu_count()} cores; torch "
        f"threads: {first['threads']}). Quick demo configuration: one warm start per seed, then each phase "
        f"from it; GRPO lr {first['grpo_lr']:g} (the demo's); SFT lr {sft['lr']:g}, attempts with reward >= "
        f"{sft['min_reward']}, {sft['epochs']:g} epochs, batch {sft['batch_size']}.",
        "",
        "| seed | training rollouts (each) | held-out before | GRPO after | GRPO gain | GRPO wall s "
        "| SFT after | SFT gain | SFT wall s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    gains: dict[str, list[float]] = {"grpo": [], "sft": []}
    walls: dict[str, list[float]] = {"grpo": [], "sft": []}
    for r in records:
        g, s = r["phases"]["grpo"], r["phases"]["sft"]
        cells = [str(r["seed"]), f"{g['train_rollouts']} / {s['train_rollouts']}", f"{g['before']:.2f}"]
        for phase in (g, s):
            gain = phase["after"] - phase["before"]
            cells += [f"{phase['after']:.2f}", f"**{gain:+.2f}**", f"{phase['seconds']:.0f}"]
        for name, phase in (("grpo", g), ("sft", s)):
            gains[name].append(phase["after"] - phase["before"])
            walls[name].append(phase["seconds"])
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for name, label in (("grpo", "GRPO"), ("sft", "SFT from traces")):
        lines.append(
            f"{label}: gain over {len(gains[name])} seeds mean **{statistics.fmean(gains[name]):+.2f}**, "
            f"min **{min(gains[name]):+.2f}**; wall time mean {statistics.fmean(walls[name]):.0f} s."
        )
    return "\n".join(lines) + "\n"


def paste(readme: Path, text: str) -> None:
    body = readme.read_text()
    if BEGIN not in body or END not in body:
        raise SystemExit(f"{readme} has no {BEGIN} ... {END} markers; add them where the table goes")
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    readme.write_text(pattern.sub(lambda _: f"{BEGIN}\n{text}{END}", body))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0, help="demo seed: tasks, warm start, sampling")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    ap.add_argument("--sft-lr", type=float, default=1e-3, help="SFT learning rate (the warm start's)")
    ap.add_argument("--min-reward", type=float, default=1.0, help="SFT keeps attempts with at least this reward")
    ap.add_argument("--sft-epochs", type=float, default=2.0)
    ap.add_argument("--sft-batch-size", type=int, default=16)
    ap.add_argument("--out", default="runs/sft_vs_grpo", help="folder of the seeds' runs and the table")
    ap.add_argument("--report", action="store_true", help="gather the seeds under --out into the table")
    ap.add_argument("--readme", type=Path, help="with --report: paste the table into this file between the markers")
    args = ap.parse_args(argv)
    if args.report:
        text = report(Path(args.out))
        (Path(args.out) / "sft_vs_grpo.md").write_text(text)
        if args.readme is not None:
            paste(args.readme, text)
        print(text)
        return 0
    run_seed(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
