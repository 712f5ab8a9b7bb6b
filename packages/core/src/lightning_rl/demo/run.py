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
    reporting_demonstrations,
)
from lightning_rl.demo.progress import WarmStartProgress
from lightning_rl.trainer import Trainer, TrainerConfig, TrainResult
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
    progress: bool = True

    @classmethod
    def quick(cls, **overrides: Any) -> DemoConfig:
        """The reduced configuration of CI's learning guard (``lightning-rl demo --quick``): the same
        warm start, fewer and smaller RL steps, 50 held-out tasks; about half the demo's time."""
        settings: dict[str, Any] = {"steps": 6, "batch_size": 8, "n_val": 50, "val_every": 0}
        return cls(**{**settings, **overrides})


@dataclass
class DemoResult:
    run_dir: Path
    val_base: float | None
    val_trained: float | None
    seconds: float
    train: TrainResult


Example = tuple[list[int], list[int]]


def greedy_exact_match(model: Any, examples: Sequence[Example], pad_id: int) -> float:
    """Fraction of (prompt, completion) pairs that greedy decoding reproduces token for token.

    Teacher-forced argmax over the completion equals greedy decoding whenever every position matches, so one
    no-grad forward pass answers what a generation loop would."""
    import torch

    from lightning_rl.backends.torch_backend import pack_micro_batches

    if not examples:
        return float("nan")
    hits = 0
    was_training = bool(model.training)
    model.eval()
    with torch.no_grad():
        for mb in pack_micro_batches(examples, 16_384, pad_id):
            logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits
            for row, (p, r) in enumerate(zip(mb.prompt_lens, mb.response_lens, strict=True)):
                predicted = logits[row, p - 1 : p - 1 + r].argmax(-1)
                hits += bool(torch.equal(predicted, mb.input_ids[row, p : p + r]))
    model.train(was_training)
    return hits / len(examples)


def first_token_probability(model: Any, prompts: Sequence[list[int]], token_id: int) -> tuple[float, float]:
    """How much the policy starts with ``token_id``: (mean probability at temperature 1, fraction of
    prompts where it is the greedy choice)."""
    import torch

    from lightning_rl.backends.torch_backend import pack_micro_batches

    was_training = bool(model.training)
    model.eval()
    total, argmax = 0.0, 0
    with torch.no_grad():
        for mb in pack_micro_batches([(p, [token_id]) for p in prompts], 16_384, 0):
            logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits
            for row, p in enumerate(mb.prompt_lens):
                total += float(logits[row, p - 1].float().softmax(-1)[token_id])
                argmax += int(logits[row, p - 1].argmax()) == token_id
    model.train(was_training)
    n = max(len(prompts), 1)
    return total / n, argmax / n


def warm_start(
    model_dir: Path, out_dir: Path, cfg: DemoConfig, tasks: Sequence[Task], probe_tasks: Sequence[Task] = ()
) -> Path:
    """Supervised warm-start on synthetic demonstrations of ``tasks``; saves an HF folder at ``out_dir``.

    Phase 1 teaches the format and the skill (call the tool with the right operation, report the
    tool's result) from an expert, until greedy decoding passes the skill probe on ``probe_tasks``
    (tasks outside the training and held-out sets) or ``expert_steps`` run out; phase 2 fine-tunes
    briefly on a sloppy demonstrator who mostly answers from memory. The result knows how to use its
    tool but rarely does: the imperfect base RL fixes. ``warm_start.json`` records the skills.
    """
    from transformers import AutoModelForCausalLM

    from lightning_rl.backends.torch_backend import TorchBackend
    from lightning_rl.engine.hf import TransformersEngine

    engine = TransformersEngine.from_pretrained(model_dir)
    try:
        tokenizer = engine.tokenizer
        eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
        tool_token = tokenizer.convert_tokens_to_ids("<tool_call>")
        pad = int(tokenizer.pad_token_id or 0)

        def encode(demos: Sequence[Demonstration]) -> list[Example]:
            return [
                (
                    engine.encode_chat(d.messages, [CALCULATOR_TOOL]),
                    [*tokenizer.encode(d.completion, add_special_tokens=False), eos],
                )
                for d in demos
            ]

        calls = encode(demonstrations(tasks, tool_rate=1.0, seed=cfg.seed)[0::2])
        reports = encode(reporting_demonstrations(tasks, per_task=cfg.report_per_task, seed=cfg.seed))
        expert = calls + reports
        sloppy = encode(demonstrations(tasks, tool_rate=cfg.habit_tool_rate, seed=cfg.seed + 1))
        probe = encode(demonstrations(probe_tasks, tool_rate=1.0, seed=cfg.seed + 2)) if probe_tasks else []
        probe_calls, probe_reports = probe[0::2], probe[1::2]

        model: Any = AutoModelForCausalLM.from_pretrained(model_dir)
        backend = TorchBackend(model, TorchBackendConfig(lr=cfg.sft_lr, seed=cfg.seed, track_kl=False))
        total = cfg.expert_steps + cfg.polish_steps + cfg.habit_steps
        skills: dict[str, float] = {}
        losses: list[float] = []

        def probe_skills() -> dict[str, float]:
            if not probe:
                return {}
            return {
                "tool_call": greedy_exact_match(model, probe_calls, pad),
                "report": greedy_exact_match(model, probe_reports, pad),
                "p_tool_call": first_token_probability(model, [p for p, _ in probe_calls], tool_token)[0],
            }

        with WarmStartProgress(total, enabled=cfg.progress) as bar:
            # phase 1: expert demonstrations at a constant rate, until the copying skill has formed
            done = 0
            while done < cfg.expert_steps:
                chunk = min(cfg.probe_every, cfg.expert_steps - done)
                losses += backend.sft(
                    expert,
                    steps=chunk,
                    batch_size=cfg.sft_batch_size,
                    warmup_steps=20 if done == 0 else 0,
                    on_step=bar.on_step,
                )
                done += chunk
                skills = probe_skills()
                bar.note_skills({k: v for k, v in skills.items() if k != "p_tool_call"})
                if skills and min(skills["tool_call"], skills["report"]) >= cfg.skill_target:
                    break
            bar.skip(cfg.expert_steps - done)
            # phase 1b: the same data with the rate decaying, to make the new skill steady
            if cfg.polish_steps:
                losses += backend.sft(
                    expert,
                    steps=cfg.polish_steps,
                    batch_size=cfg.sft_batch_size,
                    final_lr_fraction=0.1,
                    on_step=bar.on_step,
                )
            polished = probe_skills()
            # phase 2: the habit of answering from memory
            habit = TorchBackend(model, TorchBackendConfig(lr=cfg.habit_lr, seed=cfg.seed + 1, track_kl=False))
            habit_done = 0
            while habit_done < cfg.habit_steps:
                chunk = min(cfg.habit_every, cfg.habit_steps - habit_done)
                losses += habit.sft(sloppy, steps=chunk, batch_size=cfg.sft_batch_size, on_step=bar.on_step)
                habit_done += chunk
                if habit_done >= cfg.habit_min_steps and probe_calls:
                    mean_p, greedy = first_token_probability(model, [p for p, _ in probe_calls], tool_token)
                    if mean_p <= cfg.habit_target and greedy <= cfg.habit_greedy_target:
                        break
            bar.skip(cfg.habit_steps - habit_done)
        after = {
            "expert_steps": float(done),
            "habit_steps": float(habit_done),
            **{f"formed/{k}": v for k, v in skills.items()},
            **{f"polished/{k}": v for k, v in polished.items()},
            **{f"base/{k}": v for k, v in probe_skills().items()},
        }
        out_dir.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)
    finally:
        engine.close()
    (out_dir / "warm_start.json").write_text(
        json.dumps({"final_losses": losses[-10:], "examples": len(expert), "skills": after}, indent=2)
    )
    if cfg.progress and probe:
        print(
            f"warm-start done after {done} + {cfg.polish_steps} expert steps: tool call "
            f"{after['polished/tool_call']:.2f}, report {after['polished/report']:.2f} (greedy, probe tasks); "
            f"after the habit phase it calls its tool first with p={after['base/p_tool_call']:.2f}, "
            f"report {after['base/report']:.2f}",
            flush=True,
        )
    return out_dir


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
        "max_tokens": 48,
        "val_every": cfg.val_every,
        "air": {"tool_error": -0.1},
        "seed": cfg.seed,
        "progress": cfg.progress,
        "concurrency": cfg.batch_size * cfg.group_size,
        "backend": TorchBackendConfig(lr=cfg.rl_lr, seed=cfg.seed, old_logprobs="sampled", temperature=cfg.temperature),
    }
    return TrainerConfig(**{**settings, **overrides})


def run_demo(cfg: DemoConfig | None = None) -> DemoResult:
    from lightning_rl.engine.models import resolve_model

    cfg = cfg or DemoConfig()
    started = time.perf_counter()
    _quiet_hf_bars()
    run_dir = Path(cfg.run_dir)
    base = resolve_model("tiny") if not cfg.model_overrides else _tiny(cfg.model_overrides)
    # One draw of distinct questions, split: training, held-out (validation only), probe (warm-start checks).
    tasks = make_tasks(cfg.n_train + cfg.n_val + cfg.n_probe, seed=cfg.seed)
    train = tasks[: cfg.n_train]
    val = tasks[cfg.n_train : cfg.n_train + cfg.n_val]
    probe = tasks[cfg.n_train + cfg.n_val :]
    warm = warm_start(base, run_dir / "warm_start", cfg, train, probe)
    trainer = Trainer(demo_trainer_config(str(warm), str(run_dir), cfg))
    result = trainer.fit(calculator_agent, train, val)
    return DemoResult(run_dir, result.val_before, result.val_after, time.perf_counter() - started, result)


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
