"""DPO from groups vs GRPO on the demo task, at the same rollout budget, from one shared warm start.

The demo's tiny model is warm-started once, exactly as ``lightning-rl demo --quick`` does for
``--warm-seed`` (``<out>/warm_start``, reused when it is already there, so ``--warm-only`` can make it
ahead), then the RL phase runs from it once per algorithm and ``--seeds`` entry: GRPO (the demo's own
settings) and DPO (pairs built from the same groups: ``--pairing``, ``--beta``, ``--dpo-loss``,
``--unit``). Both run the same steps, tasks per step and rollouts per task, so they see the same
number of rollouts; only the update rule differs. A phase's seed seeds its task batches and torch
(the sampled tokens differ anyway: rollout requests carry no seed). Each finished run writes
``<out>/<algorithm>-seed<N>/result.json``; ``--reuse-runs`` takes those instead of running again, so
seeds can run as separate processes and be tabled together. The markdown table (held-out reward
before/after, gain, DPO pairs, and the training tool-call rate and reward per step) goes to
``<out>/dpo_vs_grpo.md`` and stdout, the numbers to ``<out>/dpo_vs_grpo.json``.

    uv run python benchmarks/dpo_vs_grpo.py --seeds 0-2 --quick --threads 1
    uv run python benchmarks/dpo_vs_grpo.py --quick --threads 1 --warm-only                  # the warm start only
    uv run python benchmarks/dpo_vs_grpo.py --seeds 1 --quick --threads 1 &                  # seeds side by side,
    uv run python benchmarks/dpo_vs_grpo.py --seeds 0-2 --quick --threads 1 --reuse-runs     # then one table
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _common import cpu_name, git_commit, parse_seeds, per_step


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0-2", help="phase seeds (task batches, torch), e.g. 0-2")
    ap.add_argument("--warm-seed", type=int, default=0, help="demo seed of the shared warm start and the tasks")
    ap.add_argument("--quick", action="store_true", help="the learning guard's configuration (DemoConfig.quick)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    ap.add_argument("--beta", type=float, default=0.1, help="DPO's beta")
    ap.add_argument("--dpo-loss", default="sigmoid", choices=["sigmoid", "ipo"])
    ap.add_argument("--pairing", default="halves", choices=["best_worst", "halves", "all"])
    ap.add_argument("--unit", default="call", choices=["call", "rollout"], help="what a DPO pair compares")
    ap.add_argument("--dpo-lr", type=float, default=None, help="DPO's learning rate (default: GRPO's, the demo's)")
    ap.add_argument("--algorithms", default="grpo,dpo", help="which RL phases to run per seed, comma-separated")
    ap.add_argument("--warm-only", action="store_true", help="only prepare the warm starts")
    ap.add_argument(
        "--reuse-runs",
        action="store_true",
        help="take a run that already finished in <out> (its result.json) instead of running it again, "
        "so seeds run as separate processes can be tabled together",
    )
    ap.add_argument("--out", default="runs/dpo_vs_grpo", help="folder for the warm starts, the runs and the table")
    args = ap.parse_args(argv)
    seeds = parse_seeds(args.seeds)
    algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    if not algorithms or any(a not in ("grpo", "dpo") for a in algorithms):
        raise SystemExit(f"--algorithms {args.algorithms!r}: give grpo, dpo or both")

    import torch

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    from lightning_rl.demo.calculator import calculator_agent, make_tasks
    from lightning_rl.demo.run import DemoConfig, demo_trainer_config, warm_start
    from lightning_rl.engine.models import resolve_model
    from lightning_rl.trainer import Trainer

    out = Path(args.out)
    settings: dict[str, Any] = {"seed": args.warm_seed, "progress": False}
    demo = DemoConfig.quick(**settings) if args.quick else DemoConfig(**settings)
    tasks = make_tasks(demo.n_train + demo.n_val + demo.n_probe, seed=demo.seed)
    train, val = tasks[: demo.n_train], tasks[demo.n_train : demo.n_train + demo.n_val]
    probe = tasks[demo.n_train + demo.n_val :]
    warm = out / "warm_start"
    timing = out / "warm_start_s.json"
    if (warm / "warm_start.json").exists() and timing.exists():
        warm_s = float(json.loads(timing.read_text())["seconds"])
        print(f"reusing the warm start in {warm} ({warm_s / 60:.1f} min when made)", flush=True)
    else:
        started = time.perf_counter()
        warm_start(resolve_model("tiny"), warm, demo, train, probe)
        warm_s = time.perf_counter() - started
        timing.write_text(json.dumps({"seconds": warm_s}))
        print(f"warm start {warm_s / 60:.1f} min", flush=True)
    if args.warm_only:
        return 0

    runs: list[dict[str, Any]] = []
    for seed in seeds:
        # the phase's seed: task batches, torch, the backend; everything else is the demo's
        phase = dataclasses.replace(demo, seed=seed)
        for algorithm in algorithms:
            run_dir = out / f"{algorithm}-seed{seed}"
            done = run_dir / "result.json"
            if args.reuse_runs and done.exists():
                runs.append(json.loads(done.read_text()))
                print(f"seed {seed} {algorithm}: reusing the finished run in {run_dir}", flush=True)
                continue
            trainer_cfg = demo_trainer_config(str(warm), str(run_dir), phase, progress=False, tensorboard=False)
            if algorithm == "dpo":
                from lightning_rl.algorithms.dpo import DPOConfig
                from lightning_rl.trainer import TrainerConfig

                shared = {
                    f.name: getattr(trainer_cfg, f.name)
                    for f in dataclasses.fields(TrainerConfig)
                    if f.name != "update_rule"
                }
                trainer_cfg = DPOConfig(
                    **shared, beta=args.beta, loss=args.dpo_loss, pairing=args.pairing, unit=args.unit
                )
                if args.dpo_lr is not None:
                    trainer_cfg.backend.lr = args.dpo_lr
            t0 = time.perf_counter()
            result = Trainer(trainer_cfg).fit(calculator_agent, train, val)
            metrics = run_dir / "metrics.jsonl"
            row: dict[str, Any] = {
                "seed": seed,
                "algorithm": algorithm,
                "lr": trainer_cfg.backend.lr,
                "before": result.val_before,
                "after": result.val_after,
                "seconds": time.perf_counter() - t0,
                "tool_call_rate": per_step(metrics, "train/tool_call_rate"),
                "reward": per_step(metrics, "train/reward_mean"),
                "pairs": per_step(metrics, "train/dpo_pairs"),
                "train_rollouts": sum(per_step(metrics, "train/n_rollouts")),
            }
            runs.append(row)
            done.write_text(json.dumps({**row, "commit": git_commit()}, indent=2))
            print(
                f"seed {seed} {algorithm}: {row['before']:.2f} -> {row['after']:.2f} in {row['seconds'] / 60:.1f} min",
                flush=True,
            )

    command = "uv run python benchmarks/dpo_vs_grpo.py " + " ".join(sys.argv[1:] if argv is None else argv)
    lines = [
        f"Generated {datetime.now(UTC):%Y-%m-%d %H:%M} UTC at commit `{git_commit()}` by `{command.strip()}` "
        f"({cpu_name()}, {os.cpu_count()} cores; torch threads: {torch.get_num_threads()}; "
        f"{'quick' if args.quick else 'default'} demo configuration; one warm start of demo seed {args.warm_seed}, "
        f"{warm_s / 60:.1f} min when made, then each phase per seed; DPO: {args.dpo_loss} loss, beta {args.beta:g}, "
        f"pairing {args.pairing}, unit {args.unit}).",
        "",
        "| seed | algorithm | lr | training rollouts | held-out before | after | gain | DPO pairs per step "
        "| tool-call rate per step | training reward per step | RL wall |",
        "|---:|---|---:|---:|---:|---:|---:|---|---|---|---:|",
    ]
    for row in runs:
        gain = row["after"] - row["before"]
        cells = [
            str(row["seed"]),
            row["algorithm"].upper(),
            f"{row['lr']:g}",
            f"{row['train_rollouts']:.0f}",
            f"{row['before']:.2f}",
            f"{row['after']:.2f}",
            f"**{gain:+.2f}**",
            " ".join(f"{x:.0f}" for x in row["pairs"]) or "-",
            " ".join(f"{x:.2f}" for x in row["tool_call_rate"]),
            " ".join(f"{x:.2f}" for x in row["reward"]),
            f"{row['seconds'] / 60:.1f} min",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for algorithm in algorithms:
        gains = [row["after"] - row["before"] for row in runs if row["algorithm"] == algorithm]
        lines.append(
            f"{algorithm.upper()}: gain over {len(gains)} seeds mean **{statistics.fmean(gains):+.2f}**, "
            f"min **{min(gains):+.2f}**, max {max(gains):+.2f}."
        )
    text = "\n".join(lines) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / "dpo_vs_grpo.md").write_text(text)
    (out / "dpo_vs_grpo.json").write_text(json.dumps({"warm_start_s": warm_s, "runs": runs}, indent=2))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
