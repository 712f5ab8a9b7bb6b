"""The demo pipeline: tiny model -> supervised warm-start -> LightningRL -> held-out reward table.

Every stage uses the real components: the tiny model is an ordinary HF folder built locally, the
warm-start is a supervised pass of the torch backend over synthetic demonstrations rendered with
the model's own chat template, and training runs the unchanged ``calculator_agent`` (plain
``openai`` client) against the gateway through the store and the runner.
"""

from __future__ import annotations

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
    reporting_demonstrations,
)
from lightning_rl.memory import map_large_blocks
from lightning_rl.trainer import Trainer, TrainerConfig, TrainResult
from lightning_rl.trainer.staged_warm_start import (
    StagedWarmStartConfig,
    first_token_probability,
    greedy_exact_match,
    staged_warm_start,
)
from lightning_rl.trainer.warm_start import ChatDemo
from lightning_rl.types import Task

__all__ = [
    "DemoConfig",
    "DemoResult",
    "warm_start",
    "run_demo",
    "print_summary",
    "greedy_exact_match",
    "demo_trainer_config",
    "first_token_probability",
]


@dataclass
class DemoConfig:
    """The demo's knobs; the defaults finish in a few minutes on 2 CPU cores (see docs/learning.md for why each)."""

    seed: int = 0
    run_dir: str = "runs/demo"
    model: str = "tiny"
    """``tiny`` (built locally) or any model ``resolve_model`` accepts; ``smollm2-135m`` has its own
    preset (``DemoConfig.smollm2``)."""
    steps: int = 12
    batch_size: int = 16
    group_size: int = 8
    n_train: int = 300
    n_val: int = 100
    n_probe: int = 100
    """Questions use operands 2-15 (588 distinct), split into training, held-out and probe tasks. The
    probe tasks only check the warm-start's skills; the held-out ones are never seen before validation."""
    expert_steps: int = 1500
    """Warm-start phase 1: at most this many steps on expert demonstrations (call the tool, report its
    result); it stops earlier once the skill probe passes (``skill_target``)."""
    skill_target: float = 0.6
    """Phase 1 runs until greedy decoding reproduces this fraction of the probe demonstrations exactly,
    for both the tool call and the report of a result: the copying skill has formed. A fixed step count
    would not do: when the skill forms depends on float rounding (thread count, CPU), so a fixed count
    lands on either side of it (docs/learning.md)."""
    probe_every: int = 50
    """Steps between skill probes (a probe is one no-grad forward over the probe demonstrations)."""
    report_per_task: int = 3
    """Report demonstrations per training task, each with a random tool result (see
    ``reporting_demonstrations``), beside one tool-call demonstration per task: calling is learnt in a
    few dozen steps, reporting is the slow skill, so it gets most of each batch."""
    polish_steps: int = 150
    """Phase 1b, once the skill has formed: expert steps with the learning rate decaying to a tenth, which
    turns a skill that flickers between probes at a constant rate into a steady one."""
    habit_steps: int = 200
    """Phase 2: at most this many steps on a sloppy demonstrator's data, who answers from memory most of
    the time; it stops once the policy starts with a tool call with probability ``habit_target`` or less.
    Seeds 0-3 stop after 30-60 steps; seed 4 (two threads) needs 150, and a cap of 100 left its greedy
    base calling the tool (base score 0.85, nothing left for RL to show)."""
    habit_target: float = 0.25
    """Phase 2 ends when the mean probability of starting with a tool call, on the probe questions, is at
    most this. A fixed count did not do: after 40 steps it ranged 0.18-0.46 over seeds 0-4, and above
    0.5 greedy validation calls the tool, so the 'untrained' base already scored 0.80 on one seed."""
    habit_greedy_target: float = 0.1
    """...and greedy decoding starts with a tool call on at most this fraction of the probe questions (the
    mean alone is not enough: a flat distribution can average 0.21 while the tool call is still its argmax
    everywhere, and then the greedy base scores like the trained policy)."""
    habit_min_steps: int = 30
    """The habit phase's first steps leave the policy in flux (high entropy); it is not checked before."""
    habit_every: int = 10
    """Steps between checks of the habit phase."""
    habit_tool_rate: float = 0.3
    """How often the sloppy demonstrator uses its tool."""
    sft_batch_size: int = 32
    sft_lr: float = 1e-3
    habit_lr: float = 1e-3
    rl_lr: float = 3e-4
    """GRPO's learning rate. At 1e-3 one update could take the tool-call rate from 0.77 to 0 (and keep it
    there) or break the report skill: on one warm start, four runs of the quick configuration gained
    +0.00 to +0.76; at 3e-4 they gained +0.78 to +0.94 (``benchmarks/rl_phase.py``, docs/learning.md)."""
    temperature: float = 1.0
    val_temperature: float = 0.0
    """Held-out tasks are decoded greedily: the score is then a property of the weights, not of the draw."""
    val_every: int = 4
    model_overrides: dict[str, Any] = field(default_factory=dict[str, Any])
    """Tiny-model knobs (``TinyModelConfig`` fields)."""
    lora_rank: int = 0
    """0 trains every weight (warm start and RL); ``r > 0`` trains LoRA adapters of rank ``r``."""
    lora_layers: int | None = None
    """``TorchBackendConfig.lora_layers`` of the RL phase: adapt only the top ``n`` decoder layers
    (``None``: all); the warm start adapts every layer."""
    kl_every: int = 1
    """``TorchBackendConfig.kl_every``: measure ``train/kl_to_start`` on every ``kl_every``-th update."""
    kl_rows: int = 0
    """``TorchBackendConfig.kl_rows``: measure ``train/kl_to_start`` on this many transitions of the batch (0: all)."""
    shared_prefix: int = 0
    """``TorchBackendConfig.shared_prefix``: run the system prompt + tool list once per micro-batch."""
    tool_token: str = "<tool_call>"
    """The first token of a tool call in the model's format (the habit phase drives its probability down)."""
    max_tokens: int = 48
    micro_batch_tokens: int = 16_384
    """``TorchBackendConfig.micro_batch_tokens``: padded tokens per forward of the warm start's SFT
    steps and of the RL updates (it bounds their activations' memory)."""
    progress: bool = True
    deterministic: bool = False
    """``TrainerConfig.deterministic``: two runs of one seed log identical metrics (slower)."""
    precision: str = "float32"
    """``TrainerConfig.precision`` of the RL phase, and the warm start's: ``float32``, ``bfloat16`` or
    ``auto`` (``bfloat16`` where the CPU runs it natively). The tiny model stays in float32: its
    matmuls are too small for bfloat16 to pay, and its published figures are float32's."""

    @classmethod
    def quick(cls, **overrides: Any) -> DemoConfig:
        """The reduced configuration of CI's learning guard (``lightning-rl demo --quick``): the same
        warm start, fewer and smaller RL steps, 50 held-out tasks; about half the demo's time."""
        settings: dict[str, Any] = {"steps": 6, "batch_size": 8, "n_val": 50, "val_every": 0}
        return cls(**{**settings, **overrides})

    @classmethod
    def smollm2(cls, **overrides: Any) -> DemoConfig:
        """SmolLM2-135M-Instruct (``lightning-rl demo --model smollm2-135m``), sized for 8 minutes on 2
        CPU cores where bfloat16 runs fast (6 steps in about 6 min on an AMX Intel Xeon; the 8 steps
        before took 6 on a fast AMD EPYC with AVX512_BF16 and about 13 in float32 on an Intel Xeon whose
        bfloat16 is slow: docs/models.md, "The real model at laptop cost"). Held-out greedy reward
        reached 0.92-1.00 by step 3-4 on every seed measured, so 6 steps leave margin. The pretrained
        model writes no tool call at all (benchmarks/smollm2.py), so the warm start teaches the call
        in a few dozen LoRA steps, then the habit of answering from memory; GRPO with LoRA then has
        to bring the tool back. Why each number: docs/models.md."""
        settings: dict[str, Any] = {
            "model": "smollm2-135m",
            "steps": 6,
            "batch_size": 8,
            "group_size": 8,
            "n_train": 200,
            "n_val": 50,
            "n_probe": 16,
            "expert_steps": 40,
            "probe_every": 5,
            "report_per_task": 1,
            "polish_steps": 5,
            "habit_steps": 40,
            "habit_min_steps": 2,
            "habit_every": 1,
            "sft_batch_size": 8,
            "sft_lr": 1e-3,
            "habit_lr": 3e-4,
            "rl_lr": 5e-4,
            "val_every": 3,
            "lora_rank": 16,
            "lora_layers": 15,
            "kl_every": 3,
            "kl_rows": 16,
            "shared_prefix": 64,
            "micro_batch_tokens": 2048,
            "tool_token": "<",
            "precision": "auto",
        }
        return cls(**{**settings, **overrides})


@dataclass
class DemoResult:
    run_dir: Path
    val_base: float | None
    val_trained: float | None
    seconds: float
    train: TrainResult
    model: str = "tiny"


def warm_start(
    model_dir: Path, out_dir: Path, cfg: DemoConfig, tasks: Sequence[Task], probe_tasks: Sequence[Task] = ()
) -> Path:
    """Supervised warm-start on synthetic demonstrations of ``tasks``; saves an HF folder at ``out_dir``.

    The staged warm start (``lightning_rl.trainer.staged_warm_start``): phase 1 teaches the format and
    the skill (call the tool with the right operation, report the tool's result) from an expert, until
    greedy decoding passes the skill probe on ``probe_tasks`` (tasks outside the training and held-out
    sets); phase 2 fine-tunes briefly on a sloppy demonstrator who mostly answers from memory. The
    result knows how to use its tool but rarely does: the imperfect base RL fixes.
    """

    def chats(demos: Sequence[Demonstration]) -> list[ChatDemo]:
        return [(d.messages, [CALCULATOR_TOOL], d.completion) for d in demos]

    probe = chats(demonstrations(probe_tasks, tool_rate=1.0, seed=cfg.seed + 2)) if probe_tasks else []
    staged_warm_start(
        model_dir,
        out_dir,
        expert=chats(demonstrations(tasks, tool_rate=1.0, seed=cfg.seed)[0::2])
        + chats(reporting_demonstrations(tasks, per_task=cfg.report_per_task, seed=cfg.seed)),
        sloppy=chats(demonstrations(tasks, tool_rate=cfg.habit_tool_rate, seed=cfg.seed + 1)),
        probes={"tool_call": probe[0::2], "report": probe[1::2]},
        habit_prompts=probe[0::2],
        config=StagedWarmStartConfig(
            seed=cfg.seed,
            expert_steps=cfg.expert_steps,
            skill_target=cfg.skill_target,
            probe_every=cfg.probe_every,
            polish_steps=cfg.polish_steps,
            habit_steps=cfg.habit_steps,
            habit_target=cfg.habit_target,
            habit_greedy_target=cfg.habit_greedy_target,
            habit_min_steps=cfg.habit_min_steps,
            habit_every=cfg.habit_every,
            batch_size=cfg.sft_batch_size,
            lr=cfg.sft_lr,
            habit_lr=cfg.habit_lr,
            tool_token=cfg.tool_token,
            lora_rank=cfg.lora_rank,
            shared_prefix=cfg.shared_prefix,
            micro_batch_tokens=cfg.micro_batch_tokens,
            dtype=_resolved_precision(cfg.precision),
            progress=cfg.progress,
        ),
    )
    return out_dir


def _resolved_precision(precision: str) -> str:
    """``auto`` -> ``bfloat16`` where this CPU runs it natively, else ``float32`` (as ``TrainerConfig``)."""
    from lightning_rl.backends.torch_backend import fast_bfloat16

    return ("bfloat16" if fast_bfloat16() else "float32") if precision == "auto" else precision


def demo_trainer_config(model: str, run_dir: str, cfg: DemoConfig, **overrides: Any) -> TrainerConfig:
    """The ``TrainerConfig`` of the demo's RL phase (also used by benchmarks/rollout_throughput.py)."""
    settings: dict[str, Any] = {
        "model": model,
        "run_dir": run_dir,
        "steps": cfg.steps,
        "batch_size": cfg.batch_size,
        "group_size": cfg.group_size,
        "temperature": cfg.temperature,
        "val_temperature": cfg.val_temperature,
        "max_tokens": cfg.max_tokens,
        "val_every": cfg.val_every,
        "air": {"tool_error": -0.1},
        "seed": cfg.seed,
        "deterministic": cfg.deterministic,
        "precision": cfg.precision,
        "progress": cfg.progress,
        "concurrency": cfg.batch_size * cfg.group_size,
        "backend": TorchBackendConfig(
            lr=cfg.rl_lr,
            seed=cfg.seed,
            old_logprobs="sampled",
            temperature=cfg.temperature,
            lora_rank=cfg.lora_rank,
            lora_alpha=2 * cfg.lora_rank if cfg.lora_rank else 16,
            lora_layers=cfg.lora_layers,
            kl_every=cfg.kl_every,
            kl_rows=cfg.kl_rows,
            shared_prefix=cfg.shared_prefix,
            micro_batch_tokens=cfg.micro_batch_tokens,
        ),
    }
    return TrainerConfig(**{**settings, **overrides})


def run_demo(cfg: DemoConfig | None = None) -> DemoResult:
    from lightning_rl.engine.models import resolve_model

    cfg = cfg or DemoConfig()
    started = time.perf_counter()
    map_large_blocks()  # from the warm start on (the trainer sets it too; lightning_rl.memory says why)
    _quiet_hf_bars()
    run_dir = Path(cfg.run_dir)
    if cfg.model != "tiny":
        base = resolve_model(cfg.model)
    else:
        base = resolve_model("tiny") if not cfg.model_overrides else _tiny(cfg.model_overrides)
    # One draw of distinct questions, split: training, held-out (validation only), probe (warm-start checks).
    tasks = make_tasks(cfg.n_train + cfg.n_val + cfg.n_probe, seed=cfg.seed)
    train = tasks[: cfg.n_train]
    val = tasks[cfg.n_train : cfg.n_train + cfg.n_val]
    probe = tasks[cfg.n_train + cfg.n_val :]
    warm = warm_start(base, run_dir / "warm_start", cfg, train, probe)
    trainer = Trainer(demo_trainer_config(str(warm), str(run_dir), cfg))
    result = trainer.fit(calculator_agent, train, val)
    return DemoResult(run_dir, result.val_before, result.val_after, time.perf_counter() - started, result, cfg.model)


def _quiet_hf_bars() -> None:
    """Hugging Face's own loading/saving bars would bury the demo's progress lines: the demo has its own."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:  # an older transformers without the switch: the bars stay, harmlessly
        pass


def _tiny(overrides: dict[str, Any]) -> Path:
    from lightning_rl.engine.tiny import default_tiny_model

    return default_tiny_model(None, **overrides)


def print_summary(result: DemoResult) -> None:
    """The before/after table the README promises."""
    from rich.console import Console
    from rich.table import Table

    def fmt(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.3f}"

    name = "tiny model" if result.model == "tiny" else result.model
    table = Table(title=f"Held-out reward (calculator agent, {name}, CPU)")
    table.add_column("policy")
    table.add_column("mean reward", justify="right")
    table.add_row("warm-started base", fmt(result.val_base))
    table.add_row("after LightningRL", fmt(result.val_trained))
    if result.val_base is not None and result.val_trained is not None:
        table.add_row("gain", f"{result.val_trained - result.val_base:+.3f}")
    console = Console()
    console.print(table)
    console.print(f"{result.seconds:.0f} s; run folder {result.run_dir} (metrics.jsonl, reward_curve.png)")
