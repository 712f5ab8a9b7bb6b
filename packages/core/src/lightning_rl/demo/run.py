"""The demo pipeline: tiny model -> supervised warm-start -> LightningRL -> held-out reward table.

Every stage uses the real components: the tiny model is an ordinary HF folder built locally, the
warm-start is a supervised pass of the torch backend over synthetic demonstrations rendered with
the model's own chat template, and training runs the unchanged ``calculator_agent`` (plain
``openai`` client) against the gateway through the store and the runner.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_rl.backends.torch_backend import TorchBackendConfig
from lightning_rl.demo.calculator import (
    CALCULATOR_TOOL,
    Demonstration,
    calculator_agent,
    demonstrations,
    make_tasks,
)
from lightning_rl.trainer import Trainer, TrainerConfig, TrainResult
from lightning_rl.types import Task

__all__ = ["DemoConfig", "DemoResult", "warm_start", "run_demo", "print_summary"]


@dataclass
class DemoConfig:
    """The demo's knobs; the defaults finish in a few minutes on 2 CPU cores."""

    seed: int = 0
    run_dir: str = "runs/demo"
    steps: int = 12
    batch_size: int = 16
    group_size: int = 8
    n_train: int = 300
    n_val: int = 100
    """Questions use operands 2-15 (588 distinct), split into training and held-out tasks."""
    expert_steps: int = 800
    """Warm-start phase 1: steps on expert demonstrations (always use the tool, copy its result)."""
    polish_steps: int = 200
    """Phase 1b: more expert steps with the learning rate decaying (sharpens the copying)."""
    habit_steps: int = 40
    """Phase 2: steps on a sloppy demonstrator's data, who answers from memory most of the time."""
    habit_tool_rate: float = 0.3
    """How often the sloppy demonstrator uses its tool."""
    sft_batch_size: int = 32
    sft_lr: float = 3e-3
    habit_lr: float = 1e-3
    rl_lr: float = 1e-3
    temperature: float = 1.0
    val_every: int = 4
    model_overrides: dict[str, Any] = field(default_factory=dict[str, Any])
    """Tiny-model knobs (``TinyModelConfig`` fields)."""
    progress: bool = True


@dataclass
class DemoResult:
    run_dir: Path
    val_base: float | None
    val_trained: float | None
    seconds: float
    train: TrainResult


def warm_start(model_dir: Path, out_dir: Path, cfg: DemoConfig, tasks: Sequence[Task]) -> Path:
    """Supervised warm-start on synthetic demonstrations of ``tasks``; saves an HF folder at ``out_dir``.

    Phase 1 teaches the format and the skill (call the tool with the right expression, copy its
    result) from an expert; phase 2 fine-tunes briefly on a sloppy demonstrator who mostly answers
    from memory. The result knows how to use its tool but rarely does: the imperfect base RL fixes.
    """
    from transformers import AutoModelForCausalLM

    from lightning_rl.backends.torch_backend import TorchBackend
    from lightning_rl.engine.hf import TransformersEngine

    engine = TransformersEngine.from_pretrained(model_dir)
    try:
        eos = engine.tokenizer.convert_tokens_to_ids("<|im_end|>")

        def encode(demos: list[Demonstration]) -> list[tuple[list[int], list[int]]]:
            return [
                (
                    engine.encode_chat(d.messages, [CALCULATOR_TOOL]),
                    [*engine.tokenizer.encode(d.completion, add_special_tokens=False), eos],
                )
                for d in demos
            ]

        expert = encode(demonstrations(tasks, tool_rate=1.0, seed=cfg.seed))
        sloppy = encode(demonstrations(tasks, tool_rate=cfg.habit_tool_rate, seed=cfg.seed + 1))
        model: Any = AutoModelForCausalLM.from_pretrained(model_dir)
        backend = TorchBackend(model, TorchBackendConfig(lr=cfg.sft_lr, seed=cfg.seed))
        losses = backend.sft(expert, steps=cfg.expert_steps, batch_size=cfg.sft_batch_size, warmup_steps=20)
        losses += backend.sft(expert, steps=cfg.polish_steps, batch_size=cfg.sft_batch_size, final_lr_fraction=0.1)
        habit = TorchBackend(model, TorchBackendConfig(lr=cfg.habit_lr, seed=cfg.seed + 1))
        losses += habit.sft(sloppy, steps=cfg.habit_steps, batch_size=cfg.sft_batch_size)
        out_dir.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out_dir)
        engine.tokenizer.save_pretrained(out_dir)
    finally:
        engine.close()
    (out_dir / "warm_start.json").write_text(json.dumps({"final_losses": losses[-10:], "examples": len(expert)}))
    return out_dir


def run_demo(cfg: DemoConfig | None = None) -> DemoResult:
    from lightning_rl.trainer.services import resolve_model

    cfg = cfg or DemoConfig()
    started = time.perf_counter()
    run_dir = Path(cfg.run_dir)
    base = resolve_model("tiny") if not cfg.model_overrides else _tiny(cfg.model_overrides)
    tasks = make_tasks(cfg.n_train + cfg.n_val, seed=cfg.seed)
    train, val = tasks[: cfg.n_train], tasks[cfg.n_train :]
    warm = warm_start(base, run_dir / "warm_start", cfg, train)
    trainer = Trainer(
        TrainerConfig(
            model=str(warm),
            run_dir=str(run_dir),
            steps=cfg.steps,
            batch_size=cfg.batch_size,
            group_size=cfg.group_size,
            temperature=cfg.temperature,
            max_tokens=48,
            val_every=cfg.val_every,
            air={"tool_error": -0.1},
            seed=cfg.seed,
            progress=cfg.progress,
            concurrency=cfg.batch_size * cfg.group_size,
            backend=TorchBackendConfig(
                lr=cfg.rl_lr, seed=cfg.seed, old_logprobs="sampled", temperature=cfg.temperature
            ),
        )
    )
    result = trainer.fit(calculator_agent, train, val)
    return DemoResult(run_dir, result.val_before, result.val_after, time.perf_counter() - started, result)


def _tiny(overrides: dict[str, Any]) -> Path:
    from lightning_rl.engine.tiny import default_tiny_model

    return default_tiny_model(None, **overrides)


def print_summary(result: DemoResult) -> None:
    """The before/after table the README promises."""
    from rich.console import Console
    from rich.table import Table

    def fmt(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.3f}"

    table = Table(title="Held-out reward (calculator agent, tiny model, CPU)")
    table.add_column("policy")
    table.add_column("mean reward", justify="right")
    table.add_row("warm-started base", fmt(result.val_base))
    table.add_row("after LightningRL", fmt(result.val_trained))
    if result.val_base is not None and result.val_trained is not None:
        table.add_row("gain", f"{result.val_trained - result.val_base:+.3f}")
    console = Console()
    console.print(table)
    console.print(f"{result.seconds:.0f} s; run folder {result.run_dir} (metrics.jsonl, reward_curve.png)")
