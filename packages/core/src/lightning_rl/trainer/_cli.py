"""``lightning-rl demo``: the README's main job (imports nothing heavy until it runs)."""

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
        "--quick",
        action="store_true",
        help="the reduced configuration of CI's learning guard (fewer, smaller RL steps; 50 held-out tasks)",
    )
    p.set_defaults(handler=_demo)


def _demo(args: argparse.Namespace) -> int:
    import logging

    from lightning_rl.extras import require_extra

    require_extra("server", "train", feature="lightning-rl demo")  # one line naming the pip command
    from lightning_rl.demo.run import DemoConfig, print_summary, run_demo

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    settings: dict[str, Any] = {"seed": args.seed, "run_dir": args.out, "progress": not args.quiet}
    cfg = DemoConfig.quick(**settings) if args.quick else DemoConfig(**settings)
    if args.steps is not None:
        cfg.steps = args.steps
    result = run_demo(cfg)
    print_summary(result)
    return 0
