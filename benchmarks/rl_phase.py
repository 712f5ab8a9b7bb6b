"""How much does the demo's RL phase vary on one warm start, and how does GRPO's learning rate change it?

``benchmarks/learning.py`` runs the whole demo per seed; most of its time is the warm start, which is
bit-identical between runs with the same seed and thread count. This script warm-starts once (exactly
as ``lightning-rl demo`` does, same ``DemoConfig``), then runs the RL phase ``--repeat`` times for each
learning rate in ``--lr``. What differs between those repeats is only what differs between two demo
runs of one seed after the warm start: the sampled tokens (rollout requests carry no seed, so the
engine draws one from the OS) and which requests the engine batches together. It writes a markdown
table (held-out before/after, gain, and the training tool-call rate and reward per step) to
``<out>/rl_phase.md`` and stdout, and the numbers to ``<out>/rl_phase.json``.

    uv run python benchmarks/rl_phase.py --seed 0 --lr 1e-3,3e-4,1e-4 --repeat 4 --quick
    uv run python benchmarks/rl_phase.py --seed 4 --lr 3e-4 --repeat 3 --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _common import git_commit, per_step


def parse_lrs(text: str) -> list[float]:
    try:
        lrs = [float(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise SystemExit(f"--lr {text!r}: give learning rates separated by commas, e.g. 1e-3,3e-4") from exc
    if not lrs or any(lr <= 0 for lr in lrs):
        raise SystemExit(f"--lr {text!r}: give one or more positive learning rates, e.g. 1e-3,3e-4")
    return lrs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", default="3e-4", help="GRPO learning rates, comma-separated")
    ap.add_argument("--repeat", type=int, default=3, help="RL runs per learning rate on the same warm start")
    ap.add_argument("--quick", action="store_true", help="the learning guard's configuration (DemoConfig.quick)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    ap.add_argument("--out", default="runs/rl_phase", help="folder for the warm start, the runs and the table")
    args = ap.parse_args(argv)
    lrs = parse_lrs(args.lr)
    if args.repeat < 1:
        raise SystemExit("--repeat must be at least 1")

    import torch

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    from lightning_rl.demo.calculator import calculator_agent, make_tasks
    from lightning_rl.demo.run import DemoConfig, demo_trainer_config, warm_start
    from lightning_rl.engine.models import resolve_model
    from lightning_rl.trainer import Trainer

    settings: dict[str, Any] = {"seed": args.seed, "progress": False}
    cfg = DemoConfig.quick(**settings) if args.quick else DemoConfig(**settings)
    out = Path(args.out)
    tasks = make_tasks(cfg.n_train + cfg.n_val + cfg.n_probe, seed=cfg.seed)
    train, val = tasks[: cfg.n_train], tasks[cfg.n_train : cfg.n_train + cfg.n_val]
    probe = tasks[cfg.n_train + cfg.n_val :]
    started = time.perf_counter()
    warm = warm_start(resolve_model("tiny"), out / "warm_start", cfg, train, probe)
    warm_s = time.perf_counter() - started
    skills = json.loads((warm / "warm_start.json").read_text())["skills"]
    print(f"warm start: {warm_s:.0f} s, skills {skills}", flush=True)

    runs: list[dict[str, Any]] = []
    for lr in lrs:
        for r in range(args.repeat):
            run_dir = out / f"lr{lr:g}-r{r + 1}"
            trainer_cfg = demo_trainer_config(str(warm), str(run_dir), cfg, progress=False, tensorboard=False)
            trainer_cfg.backend.lr = lr
            t0 = time.perf_counter()
            result = Trainer(trainer_cfg).fit(calculator_agent, train, val)
            metrics = run_dir / "metrics.jsonl"
            row = {
                "lr": lr,
                "run": r + 1,
                "before": result.val_before,
                "after": result.val_after,
                "seconds": time.perf_counter() - t0,
                "tool_call_rate": per_step(metrics, "train/tool_call_rate"),
                "reward": per_step(metrics, "train/reward_mean"),
            }
            runs.append(row)
            print(
                f"lr {lr:g} run {r + 1}: {row['before']:.2f} -> {row['after']:.2f} in {row['seconds']:.0f} s",
                flush=True,
            )

    cpu = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if "model name" in line
            ),
            platform.machine(),
        )
        if Path("/proc/cpuinfo").exists()
        else platform.machine()
    )
    command = "uv run python benchmarks/rl_phase.py " + " ".join(sys.argv[1:] if argv is None else argv)
    lines = [
        f"Generated {datetime.now(UTC):%Y-%m-%d %H:%M} UTC at commit `{git_commit()}` by `{command.strip()}` "
        f"({cpu}, {os.cpu_count()} cores; torch threads: {torch.get_num_threads()}; "
        f"{'quick' if args.quick else 'default'} demo configuration, seed {args.seed}; one warm start, "
        f"{warm_s / 60:.1f} min, then the RL phase repeated).",
        "",
        "| GRPO lr | run | held-out before | after | gain | tool-call rate per step | training reward per step |",
        "|---:|---:|---:|---:|---:|---|---|",
    ]
    for row in runs:
        gain = row["after"] - row["before"]
        tool = " ".join(f"{x:.2f}" for x in row["tool_call_rate"])
        reward = " ".join(f"{x:.2f}" for x in row["reward"])
        cells = [f"{row['lr']:g}", str(row["run"]), f"{row['before']:.2f}", f"{row['after']:.2f}", f"**{gain:+.2f}**"]
        lines.append("| " + " | ".join([*cells, tool, reward]) + " |")
    lines.append("")
    for lr in lrs:
        gains = [row["after"] - row["before"] for row in runs if row["lr"] == lr]
        lines.append(
            f"lr {lr:g}: gain over {len(gains)} runs mean **{statistics.fmean(gains):+.2f}**, "
            f"min **{min(gains):+.2f}**, max {max(gains):+.2f}."
        )
    text = "\n".join(lines) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / "rl_phase.md").write_text(text)
    (out / "rl_phase.json").write_text(json.dumps({"skills": skills, "warm_start_s": warm_s, "runs": runs}, indent=2))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
