"""SFT from traces against GRPO on the demo task: held-out gain and wall time at the same rollout budget.

The demo's tiny model is warm-started once (exactly as ``lightning-rl demo --quick`` does for
``--warm-seed``; reused when ``<out>/warm_start`` is already there), then each phase runs from that
same warm start, once per ``--seed``:

- **GRPO**: the demo's RL phase (``demo_trainer_config``, the quick configuration: 6 steps x 8 tasks
  x 8 rollouts, 50 held-out tasks decoded greedily) with its tuned learning rate;
- **SFT from traces** (``lightning_rl.algorithms.SFT``): the same steps, tasks per step, rollouts per
  task, sampling and held-out tasks, so both see the same number of training rollouts; each round
  fine-tunes on the attempts with reward >= ``--min-reward`` (their recorded token ids),
  ``--sft-epochs`` passes at ``--sft-lr``.

The seed of a phase seeds its task batches and torch (the sampled tokens differ anyway: rollout
requests carry no seed). Each ``--phase P --seed N`` process writes ``<out>/<P>-seed<N>/result.json``
(SFT: ``sft-lr<lr>-seed<N>``), so phases, learning rates and seeds can run side by side. ``--report``
gathers every result under ``<out>`` into a markdown table (held-out before/after, gain and wall time
per run; mean and min of the gains per variant), headed by the date, commit, commands and machine,
written to ``<out>/sft_vs_grpo.md``; ``--readme FILE`` pastes it between ``<!-- sft-vs-grpo:begin -->``
and ``<!-- sft-vs-grpo:end -->``.

    uv run python benchmarks/sft_vs_grpo.py --warm-only --threads 1
    uv run python benchmarks/sft_vs_grpo.py --phase grpo --seed 0 --threads 1   # seeds 1, 2 likewise
    uv run python benchmarks/sft_vs_grpo.py --phase sft --seed 0 --sft-lr 3e-4 --threads 1
    uv run python benchmarks/sft_vs_grpo.py --report --readme benchmarks/README.md
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _common import cpu_name, git_commit

BEGIN, END = "<!-- sft-vs-grpo:begin -->", "<!-- sft-vs-grpo:end -->"


def train_rollouts(metrics: Path) -> int:
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return int(sum(r.get("train/n_rollouts", 0) for r in rows))


def shared_warm_start(args: argparse.Namespace) -> tuple[Path, float | None]:
    """The warm start of ``--warm-seed`` under ``<out>/warm_start``: made once, then reused."""
    from lightning_rl.demo.calculator import make_tasks
    from lightning_rl.demo.run import DemoConfig, warm_start
    from lightning_rl.engine.models import resolve_model

    folder = Path(args.out) / "warm_start"
    if (folder / "warm_start.json").exists():
        return folder, None
    cfg = DemoConfig.quick(seed=args.warm_seed, progress=False)
    tasks = make_tasks(cfg.n_train + cfg.n_val + cfg.n_probe, seed=cfg.seed)
    t0 = time.perf_counter()
    warm_start(resolve_model("tiny"), folder, cfg, tasks[: cfg.n_train], tasks[cfg.n_train + cfg.n_val :])
    seconds = time.perf_counter() - t0
    (folder / "warm_start_s.txt").write_text(f"{seconds:.1f}\n")
    return folder, seconds


def run_phase(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from lightning_rl.algorithms.sft import SFT, SFTConfig
    from lightning_rl.demo.calculator import calculator_agent, make_tasks
    from lightning_rl.demo.run import DemoConfig, demo_trainer_config
    from lightning_rl.trainer import Trainer, TrainerConfig

    warm, _ = shared_warm_start(args)
    demo = DemoConfig.quick(seed=args.warm_seed, progress=False)
    tasks = make_tasks(demo.n_train + demo.n_val + demo.n_probe, seed=demo.seed)
    train, val = tasks[: demo.n_train], tasks[demo.n_train : demo.n_train + demo.n_val]
    name = args.phase if args.phase == "grpo" else f"sft-lr{args.sft_lr:g}"
    run_dir = Path(args.out) / f"{name}-seed{args.seed}"
    # the phase's seed: task batches, torch, the backend; everything else is the demo's
    phase = dataclasses.replace(demo, seed=args.seed)
    grpo_cfg = demo_trainer_config(str(warm), str(run_dir), phase, progress=False, tensorboard=False)
    if args.phase == "grpo":
        algorithm: Trainer = Trainer(grpo_cfg)
        lr = grpo_cfg.backend.lr
    else:
        shared = {f.name: getattr(grpo_cfg, f.name) for f in dataclasses.fields(TrainerConfig)}
        shared["backend"] = dataclasses.replace(grpo_cfg.backend, lr=args.sft_lr)
        algorithm = SFT(
            SFTConfig(
                **{**shared, "update_rule": "sft"},
                min_reward=args.min_reward,
                sft_epochs=args.sft_epochs,
                sft_batch_size=args.sft_batch_size,
            )
        )
        lr = args.sft_lr
    t0 = time.perf_counter()
    result = algorithm.fit(calculator_agent, train, val)
    seconds = time.perf_counter() - t0
    assert result.val_before is not None and result.val_after is not None
    print(f"{args.phase} seed {args.seed}: {result.val_before:.2f} -> {result.val_after:.2f} in {seconds:.0f} s")
    record = {
        "phase": args.phase,
        "seed": args.seed,
        "warm_seed": args.warm_seed,
        "before": result.val_before,
        "after": result.val_after,
        "seconds": seconds,
        "train_rollouts": train_rollouts(run_dir / "metrics.jsonl"),
        "lr": lr,
        "sft": {"min_reward": args.min_reward, "epochs": args.sft_epochs, "batch_size": args.sft_batch_size},
        "commit": git_commit(),
        "threads": torch.get_num_threads(),
        "command": "uv run python benchmarks/sft_vs_grpo.py " + " ".join(sys.argv[1:]),
        "date": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
    }
    (run_dir / "result.json").write_text(json.dumps(record, indent=2))
    return record


def report(out: Path) -> str:
    records = [json.loads(p.read_text()) for p in sorted(out.glob("*-seed*/result.json"))]
    if not records:
        raise SystemExit(f"no <phase>-seed<N>/result.json under {out}; run the phases first (see --help)")
    first = records[0]
    warm_s = out / "warm_start" / "warm_start_s.txt"
    warm = f", {float(warm_s.read_text()) / 60:.1f} min" if warm_s.exists() else ""
    commits = ", ".join(f"`{c}`" for c in sorted({r["commit"] for r in records}))
    commands = ", ".join(f"`{c}`" for c in sorted({re.sub(r"--seed \d+", "--seed N", r["command"]) for r in records}))
    dates = ", ".join(sorted({r["date"] for r in records}))

    def variant(r: dict[str, Any]) -> str:
        if r["phase"] == "grpo":
            return f"GRPO, lr {r['lr']:g}"
        sft = r["sft"]
        return (
            f"SFT, lr {r['lr']:g}, reward >= {sft['min_reward']:g}, {sft['epochs']:g} epochs, batch {sft['batch_size']}"
        )

    lines = [
        f"Generated {datetime.now(UTC):%Y-%m-%d %H:%M} UTC from runs at commit {commits} (finished {dates}) by "
        f"{commands}, then `uv run python benchmarks/sft_vs_grpo.py --report` ({cpu_name()}, {os.cpu_count()} "
        f"cores; torch threads: {first['threads']}). Quick demo configuration; one warm start (seed "
        f"{first['warm_seed']}{warm}) shared by every run; GRPO's lr is the demo's.",
        "",
        "| phase | seed | training rollouts | held-out before | after | gain | wall s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in sorted(records, key=lambda r: (r["phase"] != "grpo", r["lr"], r["seed"])):
        groups.setdefault(variant(r), []).append(r)
        gain = r["after"] - r["before"]
        cells = [variant(r), str(r["seed"]), str(r["train_rollouts"]), f"{r['before']:.2f}", f"{r['after']:.2f}"]
        lines.append("| " + " | ".join([*cells, f"**{gain:+.2f}**", f"{r['seconds']:.0f}"]) + " |")
    lines.append("")
    for label, runs in groups.items():
        gains = [r["after"] - r["before"] for r in runs]
        lines.append(
            f"{label}: gain over {len(runs)} seeds mean **{statistics.fmean(gains):+.2f}**, min "
            f"**{min(gains):+.2f}**; wall time mean {statistics.fmean(r['seconds'] for r in runs):.0f} s."
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
    ap.add_argument("--phase", choices=("grpo", "sft"), help="run this phase from the shared warm start")
    ap.add_argument("--seed", type=int, default=0, help="the phase's seed (task batches, torch)")
    ap.add_argument("--warm-seed", type=int, default=0, help="demo seed of the shared warm start and the tasks")
    ap.add_argument("--warm-only", action="store_true", help="only make the shared warm start")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    ap.add_argument("--sft-lr", type=float, default=3e-4, help="SFT learning rate (default: GRPO's)")
    ap.add_argument("--min-reward", type=float, default=1.0, help="SFT keeps attempts with at least this reward")
    ap.add_argument("--sft-epochs", type=float, default=2.0)
    ap.add_argument("--sft-batch-size", type=int, default=16)
    ap.add_argument("--out", default="runs/sft_vs_grpo", help="folder of the warm start, the runs and the table")
    ap.add_argument("--report", action="store_true", help="gather the results under --out into the table")
    ap.add_argument("--readme", type=Path, help="with --report: paste the table into this file between the markers")
    args = ap.parse_args(argv)
    if args.report:
        text = report(Path(args.out))
        (Path(args.out) / "sft_vs_grpo.md").write_text(text)
        if args.readme is not None:
            paste(args.readme, text)
        print(text)
        return 0
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    if args.warm_only:
        folder, seconds = shared_warm_start(args)
        print(f"warm start in {folder}" + (f" ({seconds:.0f} s)" if seconds is not None else " (reused)"))
        return 0
    if args.phase is None:
        raise SystemExit("give --phase grpo or --phase sft (or --warm-only, or --report)")
    run_phase(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
