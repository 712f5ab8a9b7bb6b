"""Does the RL phase's memory creep? The process's resident memory between steps, step after step.

``learning.py``'s peak column says how high a run went, not why. Between two steps the trainer has
handed freed memory back (``release_free_memory``), so what remains resident then, the floor, should
be the same at every step; a floor that rises is memory something keeps. This script runs the
SmolLM2 demo's RL phase (``DemoConfig.smollm2``, ``demo_trainer_config``) from a finished warm start
for ``--steps`` steps and prints, after each, the resident memory after a garbage collection and a
``malloc_trim``, with the step's phase peaks from its ``metrics.jsonl``.

    uv run python benchmarks/memory_floor.py <run>/warm_start [--steps 4] [--precision float32]

The creep it was written for (docs/models.md, "Where the memory is now"): in bfloat16 on CPU the
floor rose ~0.15 GB per step; in float32 it did not; with oneDNN's primitive cache switched off
(``ONEDNN_PRIMITIVE_CACHE_CAPACITY=0`` in the environment) it mostly did not, at twice the step time.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import tempfile
from pathlib import Path
from typing import Any

import torch
from _common import generated_line, rss_gb

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("warm_start", help="a warm-started model folder (a demo run's <run>/warm_start)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--precision", default="auto", choices=["float32", "bfloat16", "auto"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tiny", action="store_true", help="the tiny demo's configuration (for tests)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from lightning_rl.demo.calculator import calculator_agent, make_tasks
    from lightning_rl.demo.run import DemoConfig, demo_trainer_config
    from lightning_rl.memory import release_free_memory
    from lightning_rl.trainer import Trainer

    cfg = (DemoConfig.quick if args.tiny else DemoConfig.smollm2)(seed=0, progress=False, precision=args.precision)
    floors: list[float] = []
    original = Trainer._train_step  # pyright: ignore[reportPrivateUsage]

    async def step_then_floor(self: Trainer, svc: Any, step: int, tasks: Any) -> dict[str, float]:
        out = await original(self, svc, step, tasks)
        gc.collect()
        release_free_memory()
        floors.append(rss_gb())
        return out

    machine = f"Python {platform.python_version()}, torch {torch.__version__}, {args.threads} threads"
    print(generated_line("memory_floor.py", argv, machine))
    with tempfile.TemporaryDirectory() as run:
        Trainer._train_step = step_then_floor  # pyright: ignore[reportPrivateUsage]
        try:
            trainer = Trainer(demo_trainer_config(args.warm_start, run, cfg, steps=args.steps, val_every=0))
            trainer.fit(calculator_agent, make_tasks(cfg.n_train, seed=cfg.seed), [])
        finally:
            Trainer._train_step = original  # pyright: ignore[reportPrivateUsage]
        rows = [json.loads(line) for line in (Path(run) / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/step_s" in r]
    print(f"\nprecision {trainer.config.precision}\n")
    print("| step | floor after the step | rollouts peak | update peak | step time |")
    print("|---:|---:|---:|---:|---:|")
    for floor, row in zip(floors, steps, strict=True):
        peaks = [f"{row.get(f'mem/{phase}_peak_gb', float('nan')):.2f} GB" for phase in ("rollouts", "update")]
        print(f"| {int(row['step'])} | **{floor:.2f} GB** | {' | '.join(peaks)} | {row['train/step_s']:.0f} s |")
    if len(floors) > 1:
        print(f"\nfloor change per step: {(floors[-1] - floors[0]) / (len(floors) - 1):+.3f} GB")


if __name__ == "__main__":
    main()
