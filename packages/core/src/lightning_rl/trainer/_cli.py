"""``lightning-rl demo`` (the README's main job) and ``lightning-rl train CONFIG`` (any algorithm from a
run file); both import nothing heavy until they run."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["register"]


def register(subparsers: Any) -> None:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "demo",
        help="train the built-in calculator agent on a tiny model, on CPU",
        description=(
            "Build a tiny model locally, warm-start it on synthetic demonstrations, then train the built-in "
            "multi-turn calculator agent (plain openai client) with LightningRL, and print held-out reward "
            "before and after. No download; a few minutes on 2 CPU cores."
        ),
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (tasks, model init, sampling)")
    p.add_argument("--out", default="runs/demo", help="run folder: metrics.jsonl, reward_curve.png, checkpoints")
    p.add_argument("--steps", type=int, default=None, help="GRPO steps (default: the demo's tuned value)")
    p.add_argument("--quiet", action="store_true", help="no per-step lines")
    p.add_argument(
        "--model",
        default="tiny",
        choices=["tiny", "smollm2-135m"],
        help="tiny: built locally (minutes); smollm2-135m: the real SmolLM2-135M-Instruct of the smollm2 extra "
        "(6-15 minutes on 2 cores, depending on the CPU: docs/models.md)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="the reduced configuration of CI's learning guard (fewer, smaller RL steps; 50 held-out tasks)",
    )
    p.add_argument(
        "--deterministic",
        action="store_true",
        help="the same seed, thread count and machine give identical metrics (slower: one sequence at a time)",
    )
    p.add_argument(
        "--precision",
        choices=["float32", "bfloat16", "auto"],
        default=None,
        help="number format of the engine and the frozen weights (default: float32 for tiny, auto for "
        "smollm2-135m: bfloat16 where this CPU runs it faster than float32, measured)",
    )
    p.set_defaults(handler=_demo)

    t: argparse.ArgumentParser = subparsers.add_parser(
        "train",
        help="run any algorithm (grpo, rloo, ppo, sft, dpo, apo) from a TOML or YAML run file",
        description=(
            "Train an agent as a run file says: agent (module:function), tasks, model, algorithm and its options, "
            "run folder. The file is checked before anything starts; see docs/algorithms.md for its keys."
        ),
    )
    t.add_argument("config", help="the run file (.toml, .yaml or .yml)")
    t.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a key by its dotted path, e.g. --set algorithm.steps=3 (repeatable; null is None)",
    )
    t.add_argument("--check", action="store_true", help="check the file, print the resolved config, run nothing")
    t.add_argument("--quiet", action="store_true", help="no progress bar or per-step lines")
    t.set_defaults(handler=_train)


def _demo(args: argparse.Namespace) -> int:
    import logging

    from lightning_rl.extras import require_extra

    extras = ("server", "train", "smollm2") if args.model == "smollm2-135m" else ("server", "train")
    require_extra(*extras, feature=f"lightning-rl demo --model {args.model}")  # one line naming the pip command
    from lightning_rl.demo.run import DemoConfig, print_summary, run_demo

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    settings: dict[str, Any] = {
        "seed": args.seed,
        "run_dir": args.out,
        "progress": not args.quiet,
        "deterministic": args.deterministic,
    }
    if args.model == "smollm2-135m":
        if args.quick:
            raise SystemExit("--quick is the tiny model's CI configuration; run --model smollm2-135m without it.")
        cfg = DemoConfig.smollm2(**settings)
    else:
        cfg = DemoConfig.quick(**settings) if args.quick else DemoConfig(**settings)
    if args.steps is not None:
        cfg.steps = args.steps
    if args.precision is not None:
        cfg.precision = args.precision
    result = run_demo(cfg)
    print_summary(result)
    return 0


def _train(args: argparse.Namespace) -> int:
    import dataclasses
    import json
    import logging

    from lightning_rl.extras import require_extra

    require_extra("server", "train", feature="lightning-rl train")
    from lightning_rl.trainer.run_file import load_run_file, masked, run_plan

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    overrides = [*args.overrides, *(["algorithm.progress=false"] if args.quiet else [])]
    plan = load_run_file(args.config, overrides)
    print(
        f"{plan.entry.name}: {len(plan.train_tasks)} training tasks, {len(plan.val_tasks)} held-out tasks, "
        f"run folder {getattr(plan.config, 'run_dir', '?')}",
        flush=True,
    )
    if args.check:
        print(json.dumps(masked(dataclasses.asdict(plan.config)), indent=2, default=str))
        return 0
    result = run_plan(plan)

    def fmt(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.3f}"

    gain = (
        f" ({result.val_after - result.val_before:+.3f})"
        if result.val_before is not None and result.val_after is not None
        else ""
    )
    print(f"held-out reward {fmt(result.val_before)} -> {fmt(result.val_after)}{gain}; run folder {result.run_dir}")
    return 0
