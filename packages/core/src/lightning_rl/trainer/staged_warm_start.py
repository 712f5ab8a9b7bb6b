"""A warm start that leaves RL something real to learn: skill first, then a bad habit.

A model that knows nothing gets no reward, so RL has no signal; a model fine-tuned on perfect
demonstrations is already as good as it gets, so RL has nothing to show. The base that makes an
honest RL experiment sits between: it *can* do the task (it knows the format and, when it uses its
tool, how to use the result) but usually does not (it has the habit of answering from memory, as
agents built on real models often do). RL must then discover, from reward alone, that the tool pays.

Getting there reliably took three phases (docs/learning.md tells the story with measurements):

1. **Skill**: supervised steps on expert demonstrations at a constant rate, until greedy decoding
   reproduces at least ``skill_target`` of every probe set exactly. A fixed step count does not do:
   when a copying skill forms depends on float rounding (thread count, CPU vector units), so a fixed
   count lands on either side of it on different machines.
2. **Polish**: more expert steps with the rate decaying to a tenth, which turns a skill that flickers
   between probes into a steady one.
3. **Habit**: steps on a sloppy demonstrator who mostly answers from memory, until the policy starts
   with the tool-call token with mean probability at most ``habit_target`` *and* greedy decoding
   starts with it on at most ``habit_greedy_target`` of the probe prompts (a flat distribution can
   average 0.2 while the tool call is still its argmax everywhere). With ``habit_floor`` set, the
   probability must also stay at least that high: the phase stops inside the band, or, if no check
   lands there, goes back to the weights of the check that came closest. ``warm_start.json`` keeps
   every check (``habit_curve``).

The demo (``lightning_rl.demo``) and the four framework examples use it with their own demonstrations.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lightning_rl.trainer.warm_start import ChatDemo

__all__ = [
    "StagedWarmStartConfig",
    "StagedWarmStart",
    "staged_warm_start",
    "greedy_exact_match",
    "first_token_probability",
    "Example",
]

Example = tuple[list[int], list[int]]
"""(prompt token ids, completion token ids)."""


@dataclass(frozen=True)
class StagedWarmStartConfig:
    """The three phases' knobs; the defaults are the demo's (see ``lightning_rl.demo.run.DemoConfig``)."""

    seed: int = 0
    expert_steps: int = 1500
    """Phase 1 runs at most this many steps; it stops earlier once every probe set passes."""
    skill_target: float = 0.6
    probe_every: int = 50
    polish_steps: int = 150
    habit_steps: int = 200
    habit_target: float = 0.25
    habit_floor: float = 0.0
    """The habit phase stops only once the mean probability is at least this too. Supervised steps on a
    sloppy demonstrator move a small model's first token in jumps (the share of tool calls in each batch
    varies): checked every 2 steps, the crew's researcher swung between 0.0 and 0.65. A base that almost
    never calls its tool gives RL a handful of tool calls per step, too few to learn from."""
    habit_greedy_target: float = 0.1
    habit_min_steps: int = 30
    """The habit phase's first steps leave the policy in flux (high entropy); it is not checked before."""
    habit_every: int = 10
    batch_size: int = 32
    lr: float = 1e-3
    habit_lr: float = 1e-3
    tool_token: str = "<tool_call>"
    """The token the good behaviour starts with, whose probability the habit phase drives down: a tool
    call's first token by default; an agent whose good move is not a tool call names its own (e.g. the
    first token of a query it should write instead of guessing)."""
    lora_rank: int = 0
    """0 fine-tunes every weight (the tiny model). ``r > 0`` trains LoRA adapters of rank ``r`` (alpha
    ``2r``) through all three phases and merges them into the saved folder: a pretrained model keeps
    what it knows, and the steps are cheaper (SmolLM2's demo)."""
    shared_prefix: int = 0
    """``TorchBackendConfig.shared_prefix`` of the warm start's backends: demonstrations share the
    agent's system prompt and tool list, run once per micro-batch when it is at least this long."""
    micro_batch_tokens: int = 16_384
    """``TorchBackendConfig.micro_batch_tokens`` of the warm start's backends. Rows of a micro-batch are
    padded to its longest, so demonstrations of very different lengths (a first request beside one
    that carries tool results) waste less compute in several smaller micro-batches."""
    dtype: str = "float32"
    """``TorchBackendConfig.dtype`` of the warm start's backends: ``bfloat16`` keeps the frozen base in
    bfloat16 under LoRA (the adapters stay float32; the saved folder is merged in float32)."""
    progress: bool = True


@dataclass
class StagedWarmStart:
    """Where the model went and what each phase left: ``skills`` holds ``formed/<probe>`` (end of phase
    1), ``polished/<probe>`` and ``base/<probe>`` (the model RL starts from), plus ``p_tool_call``."""

    model_dir: Path
    expert_steps: int
    habit_steps: int
    skills: dict[str, float] = field(default_factory=dict[str, float])
    losses: list[float] = field(default_factory=list[float])
    habit_curve: list[tuple[int, float, float]] = field(default_factory=list[tuple[int, float, float]])
    """(habit steps, mean probability, greedy share) of the tool-call token at each habit check: how
    fast the habit formed, and how far past the targets the last chunk went."""


def greedy_exact_match(model: Any, examples: Sequence[Example], pad_id: int, shared_prefix: int = 0) -> float:
    """Fraction of (prompt, completion) pairs that greedy decoding reproduces token for token.

    Teacher-forced argmax over the completion equals greedy decoding whenever every position matches, so one
    no-grad forward pass answers what a generation loop would. ``shared_prefix`` as in
    ``TorchBackendConfig``: a prompt prefix of at least that many tokens common to the examples runs once."""
    import torch

    from lightning_rl.backends.torch_backend import pack_micro_batches, response_logits, shared_prefix_len

    if not examples:
        return float("nan")
    hits = 0
    was_training = bool(model.training)
    model.eval()
    with torch.no_grad():
        for mb in pack_micro_batches(examples, 16_384, pad_id, group_prefix=shared_prefix):
            logits, targets = response_logits(model, mb, shared_prefix_len(mb, shared_prefix))
            right = (logits.argmax(-1) == targets).tolist()
            offset = 0
            for r in mb.response_lens:
                hits += all(right[offset : offset + r])
                offset += r
    model.train(was_training)
    return hits / len(examples)


def first_token_probability(
    model: Any, prompts: Sequence[list[int]], token_id: int, shared_prefix: int = 0
) -> tuple[float, float]:
    """How much the policy starts with ``token_id``: (mean probability at temperature 1, fraction of
    prompts where it is the greedy choice). ``shared_prefix`` as in ``greedy_exact_match``."""
    import torch

    from lightning_rl.backends.torch_backend import pack_micro_batches, response_logits, shared_prefix_len

    was_training = bool(model.training)
    model.eval()
    total, argmax = 0.0, 0
    with torch.no_grad():
        for mb in pack_micro_batches([(p, [token_id]) for p in prompts], 16_384, 0, group_prefix=shared_prefix):
            logits = response_logits(model, mb, shared_prefix_len(mb, shared_prefix))[0].float()
            total += float(logits.softmax(-1)[:, token_id].sum())
            argmax += int((logits.argmax(-1) == token_id).sum())
    model.train(was_training)
    n = max(len(prompts), 1)
    return total / n, argmax / n


def _habit_miss(cfg: StagedWarmStartConfig, mean_p: float, greedy: float) -> float:
    """How far a habit check is from the targets: 0 inside them (a probability in
    ``[habit_floor, habit_target]``, greedy share at most ``habit_greedy_target``)."""
    return max(0.0, cfg.habit_floor - mean_p, mean_p - cfg.habit_target) + max(0.0, greedy - cfg.habit_greedy_target)


def staged_warm_start(
    model_dir: Path,
    out_dir: Path,
    *,
    expert: Sequence[ChatDemo],
    sloppy: Sequence[ChatDemo],
    probes: Mapping[str, Sequence[ChatDemo]],
    habit_prompts: Sequence[ChatDemo],
    config: StagedWarmStartConfig | None = None,
) -> StagedWarmStart:
    """Skill, polish, habit (see the module docstring); saves an HF folder and ``warm_start.json`` at ``out_dir``.

    Args:
        expert: What a good agent says: tool calls and reports of the tool's result.
        sloppy: What the habit is learnt from: a demonstrator who mostly answers from memory.
        probes: Named held-out demonstration sets (tasks outside training and validation) that greedy
            decoding must reproduce for phase 1 to end, e.g. ``{"tool_call": ..., "report": ...}``.
        habit_prompts: Requests where a good agent would start with a tool call; the habit phase ends
            when the policy rarely does (their completions are ignored).

    Raises:
        ValueError: ``expert`` or ``sloppy`` is empty, or the tokenizer has no ``config.tool_token``.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lightning_rl.backends.torch_backend import TorchBackend, TorchBackendConfig
    from lightning_rl.engine.hf import ChatPrompts
    from lightning_rl.trainer.warm_start_progress import WarmStartProgress  # rich: a training-side package

    cfg = config or StagedWarmStartConfig()
    if not expert or not sloppy:
        raise ValueError("staged_warm_start needs expert and sloppy demonstrations; one of them is empty.")
    import torch

    tokenizer: Any = AutoTokenizer.from_pretrained(model_dir)  # prompts need the tokenizer, not a model copy
    prompts = ChatPrompts(tokenizer)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    tool_token = tokenizer.convert_tokens_to_ids(cfg.tool_token)
    if not isinstance(tool_token, int) or tool_token == tokenizer.unk_token_id:
        raise ValueError(f"the tokenizer has no {cfg.tool_token!r} token; set StagedWarmStartConfig.tool_token.")
    pad = int(tokenizer.pad_token_id or 0)

    def encode(demos: Sequence[ChatDemo]) -> list[Example]:
        return [
            (
                prompts.encode(messages, tools or None),
                [*tokenizer.encode(completion, add_special_tokens=False), eos],
            )
            for messages, tools, completion in demos
        ]

    expert_ex = encode(expert)
    sloppy_ex = encode(sloppy)
    probe_ex = {name: encode(demos) for name, demos in probes.items() if demos}
    habit_ex = [p for p, _ in encode(habit_prompts)]

    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, cfg.dtype))
    backend = TorchBackend(
        model,
        TorchBackendConfig(
            lr=cfg.lr,
            seed=cfg.seed,
            track_kl=False,
            lora_rank=cfg.lora_rank,
            lora_alpha=2 * cfg.lora_rank if cfg.lora_rank else 16,
            shared_prefix=cfg.shared_prefix,
            micro_batch_tokens=cfg.micro_batch_tokens,
            dtype=cfg.dtype,
        ),
    )
    losses: list[float] = []

    def probe_skills() -> dict[str, float]:
        skills = {name: greedy_exact_match(model, ex, pad, cfg.shared_prefix) for name, ex in probe_ex.items()}
        if habit_ex:
            skills["p_tool_call"] = first_token_probability(model, habit_ex, tool_token, cfg.shared_prefix)[0]
        return skills

    skills: dict[str, float] = {}
    total = cfg.expert_steps + cfg.polish_steps + cfg.habit_steps
    with WarmStartProgress(total, enabled=cfg.progress) as bar:
        # phase 1: expert demonstrations at a constant rate, until every probe passes
        done = 0
        while done < cfg.expert_steps:
            chunk = min(cfg.probe_every, cfg.expert_steps - done)
            losses += backend.sft(
                expert_ex,
                steps=chunk,
                batch_size=cfg.batch_size,
                warmup_steps=20 if done == 0 else 0,
                on_step=bar.on_step,
            )
            done += chunk
            skills = probe_skills()
            bar.note_skills({k: v for k, v in skills.items() if k != "p_tool_call"})
            if probe_ex and min(skills[name] for name in probe_ex) >= cfg.skill_target:
                break
        bar.skip(cfg.expert_steps - done)
        # phase 1b: the same data with the rate decaying, to make the new skill steady
        if cfg.polish_steps:
            losses += backend.sft(
                expert_ex,
                steps=cfg.polish_steps,
                batch_size=cfg.batch_size,
                final_lr_fraction=0.1,
                on_step=bar.on_step,
            )
        polished = probe_skills()
        # phase 2: the habit of answering from memory
        # with LoRA the adapters already wrap the model: this optimizer trains those same adapters
        habit = TorchBackend(
            backend.model,
            TorchBackendConfig(
                lr=cfg.habit_lr,
                seed=cfg.seed + 1,
                track_kl=False,
                shared_prefix=cfg.shared_prefix,
                micro_batch_tokens=cfg.micro_batch_tokens,
                dtype=cfg.dtype,
            ),
        )
        habit_done = 0
        habit_curve: list[tuple[int, float, float]] = []
        nearest: tuple[float, int, dict[str, Any]] | None = None  # (miss, steps, weights) of the best check
        reached = False
        while habit_done < cfg.habit_steps:
            chunk = min(cfg.habit_every, cfg.habit_steps - habit_done)
            losses += habit.sft(sloppy_ex, steps=chunk, batch_size=cfg.batch_size, on_step=bar.on_step)
            habit_done += chunk
            if habit_done >= cfg.habit_min_steps and habit_ex:
                mean_p, greedy = first_token_probability(model, habit_ex, tool_token, cfg.shared_prefix)
                habit_curve.append((habit_done, mean_p, greedy))
                miss = _habit_miss(cfg, mean_p, greedy)
                if miss == 0:
                    reached = True
                    break
                if cfg.habit_floor > 0 and (nearest is None or miss < nearest[0]):
                    weights = {k: v.detach().clone() for k, v in backend.model.state_dict().items()}
                    nearest = (miss, habit_done, weights)
        bar.skip(cfg.habit_steps - habit_done)
        if not reached and nearest is not None:  # never inside the targets: back to the closest check
            backend.model.load_state_dict(nearest[2])
            habit_done = nearest[1]
    result = StagedWarmStart(
        out_dir,
        done,
        habit_done,
        {
            **{f"formed/{k}": v for k, v in skills.items()},
            **{f"polished/{k}": v for k, v in polished.items()},
            **{f"base/{k}": v for k, v in probe_skills().items()},
        },
        losses,
        habit_curve,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    adapted: Any = backend.model  # a peft wrapper when cfg.lora_rank: its adapters merge into the weights
    # merged in float32 (a bfloat16 base is widened first), so the adapters' update is not rounded away
    (adapted.float().merge_and_unload() if cfg.lora_rank else model.float()).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    record = {
        "final_losses": losses[-10:],
        "examples": len(expert_ex),
        "skills": {"expert_steps": float(done), "habit_steps": float(habit_done), **result.skills},
        "habit_curve": [list(point) for point in habit_curve],
        "config": asdict(cfg),
    }
    (out_dir / "warm_start.json").write_text(json.dumps(record, indent=2))
    if cfg.progress:
        formed = ", ".join(f"{k} {result.skills[f'polished/{k}']:.2f}" for k in probe_ex)
        base = ", ".join(f"{k} {result.skills[f'base/{k}']:.2f}" for k in probe_ex)
        p = result.skills.get("base/p_tool_call", float("nan"))
        print(
            f"warm-start done after {done} + {cfg.polish_steps} expert steps: {formed} (greedy, probe tasks); "
            f"after {habit_done} habit steps it calls its tool first with p={p:.2f} ({base})",
            flush=True,
        )
    return result
