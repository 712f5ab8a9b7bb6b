"""SFT from traces: rejection-sampling fine-tuning (expert iteration) on the agent's own rollouts.

Each round is one step of the shared loop (``lightning_rl.trainer.loop``): run every sampled task
``group_size`` times with the current weights, score the attempts, keep the good ones (a reward
threshold, the best ``top_k`` attempts per task, or both), fine-tune on them, publish the new
weights, repeat. The training samples are the **recorded token ids** of the kept attempts' LLM
calls, exactly as the gateway served them (prompt and response, never re-tokenised text), and the
loss is the negative log-likelihood of the response tokens only. Which calls count is decided as in
RL: the adapter keeps only the trainable roles' calls (``Trainer(trainable=...)`` or what the
plugins declared), so a multi-agent rollout fine-tunes just the chosen roles.

Compared with GRPO on the same rollouts: no advantages and no ratio, so a round learns only from
successes (failures carry no signal), but a success is imitated fully even when the whole group
succeeded (GRPO learns nothing from a group with equal rewards).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from lightning_rl.backends.base import PolicyBackend
from lightning_rl.credit import RolloutSample
from lightning_rl.trainer.config import TrainerConfig
from lightning_rl.trainer.loop import Trainer
from lightning_rl.trainer.update_rules import UpdateBatch

__all__ = ["SFTConfig", "SFT", "RejectionSampling", "select_attempts"]


@dataclass
class SFTConfig(TrainerConfig):
    """``TrainerConfig`` (``steps`` are rounds) plus how attempts are selected and fine-tuned on.

    ``backend.lr`` is the fine-tuning learning rate and ``backend.lora_rank > 0`` fine-tunes LoRA
    adapters instead of all weights, as in RL.
    """

    update_rule: str = "sft"
    min_reward: float | None = 1.0
    """Keep attempts whose final reward is at least this (None: no threshold, only ``top_k``)."""
    top_k: int | None = None
    """Keep at most this many attempts per task, the best first (None: every attempt above the threshold)."""
    sft_epochs: float = 2.0
    """Passes over a round's kept transitions (batches are drawn at random, so a fraction is fine)."""
    sft_batch_size: int = 16
    """Transitions per optimizer step."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.min_reward is None and self.top_k is None:
            raise ValueError("SFTConfig needs min_reward, top_k or both to select attempts (both are None).")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"SFTConfig.top_k must be >= 1 or None, got {self.top_k}.")
        if self.sft_epochs <= 0 or self.sft_batch_size < 1:
            raise ValueError("SFTConfig.sft_epochs must be > 0 and sft_batch_size >= 1.")


def select_attempts(
    samples: Sequence[RolloutSample], *, min_reward: float | None, top_k: int | None
) -> list[RolloutSample]:
    """The attempts to imitate: per task group, those with reward >= ``min_reward``, best ``top_k`` first.

    Ties keep the order the rollouts were collected in (deterministic for a given store).
    """
    groups: dict[str, list[RolloutSample]] = defaultdict(list)
    for sample in samples:
        groups[sample.group_id].append(sample)
    kept: list[RolloutSample] = []
    for members in groups.values():
        ranked = sorted(members, key=lambda s: -s.reward)
        if min_reward is not None:
            ranked = [s for s in ranked if s.reward >= min_reward]
        kept.extend(ranked if top_k is None else ranked[:top_k])
    return kept


class RejectionSampling:
    """The ``sft`` update rule: select attempts, then supervised steps on their recorded tokens."""

    def __init__(self, config: TrainerConfig) -> None:
        if not isinstance(config, SFTConfig):
            raise ValueError(
                "update_rule='sft' needs an SFTConfig (lightning_rl.algorithms.SFTConfig), which carries the "
                "selection settings; use lightning_rl.algorithms.SFT(SFTConfig(...))."
            )
        self.config = config

    def prepare(self, samples: Sequence[RolloutSample]) -> UpdateBatch:
        cfg = self.config
        kept = select_attempts(samples, min_reward=cfg.min_reward, top_k=cfg.top_k)
        transitions = [t for s in kept for t in s.transitions if t.prompt_ids and t.response_ids]
        return UpdateBatch(
            items=transitions,
            n_transitions=sum(len(s.transitions) for s in samples),
            n_updated=len(transitions),
            metrics={
                "train/selected_rollouts": float(len(kept)),
                "train/selected_reward_mean": sum(s.reward for s in kept) / len(kept) if kept else float("nan"),
            },
        )

    def apply(self, backend: PolicyBackend, batch: UpdateBatch) -> dict[str, float]:
        cfg = self.config
        sft: Any = getattr(backend, "sft", None)
        if sft is None:
            raise TypeError(
                f"{type(backend).__name__} has no sft(); SFT from traces runs on the embedded torch backend."
            )
        examples = [(t.prompt_ids, t.response_ids) for t in batch.items]
        steps = max(1, math.ceil(cfg.sft_epochs * len(examples) / cfg.sft_batch_size))
        started = time.perf_counter()
        losses: list[float] = sft(examples, steps=steps, batch_size=cfg.sft_batch_size)
        elapsed = time.perf_counter() - started
        return {
            "train/loss": sum(losses) / len(losses),
            "train/loss_last": losses[-1],
            "train/optimizer_steps": float(steps),
            "train/update_s": elapsed,
        }


class SFT(Trainer):
    """Rejection-sampling fine-tuning on the embedded services: ``SFT(SFTConfig(...)).fit(agent, train, val)``.

    Registered as ``sft``; the run folder is the RL trainer's (metrics.jsonl, checkpoints, store).
    """

    config_class: ClassVar[type[TrainerConfig]] = SFTConfig
