"""DPO from groups: preference pairs from each task's rollouts, trained with DPO or IPO.

The loop is the RL loop (``lightning_rl.trainer.loop``): every step runs ``group_size`` rollouts per
task and adapts them into transitions with the exact token ids of the trainable roles. Where GRPO
turns a group's rewards into advantages, DPO turns them into pairs: a higher-reward rollout is
*chosen* over a lower-reward one of the same task when the reward gap exceeds ``margin``. Rewards
that tie (all 0, all 1) make no pair, as they make zero advantages in GRPO.

What a pair compares (``unit``):

* ``call`` (default): the k-th trainable call of the chosen rollout against the k-th call of the
  rejected one, for every position both have. At k = 0 both saw the same prompt (the task), which is
  DPO's own setting; later calls saw different histories, so their pair is a preference between two
  (prompt, response) pairs, still scored against the same frozen reference. Calls where both
  rollouts produced the very same tokens are skipped: their log-ratios cancel, they carry no gradient.
* ``rollout``: every trainable call of the chosen rollout against every call of the rejected one. The
  log-ratio of a whole rollout to the reference is the sum over its calls, because the environment's
  part (tool results, other agents) has the same probability under both policies and cancels, so
  this is DPO on whole trajectories of one task.

Which rollouts are paired (``pairing``), in a group sorted by reward (ties keep rollout order):

* ``best_worst``: the best against the worst, one pair per group;
* ``halves``: the i-th best against the i-th worst, ``n // 2`` pairs, each rollout in at most one pair;
* ``all``: every two rollouts whose gap exceeds ``margin`` (up to ``n (n - 1) / 2`` pairs).

The update (``TorchBackend.preference_update``) scores each side against the policy RL started from
(frozen), with the DPO (``sigmoid``) or IPO (``ipo``) loss, optionally length-normalised.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

from lightning_rl.algorithms.pairs import Pairing, PairSet, PairUnit, PreferencePair, build_pairs
from lightning_rl.backends.base import PolicyBackend
from lightning_rl.backends.losses import PreferenceLoss
from lightning_rl.credit import RolloutSample
from lightning_rl.trainer.config import TrainerConfig
from lightning_rl.trainer.loop import Trainer
from lightning_rl.trainer.update_rules import UpdateBatch
from lightning_rl.types import Transition

__all__ = [
    "Pairing",
    "PairUnit",
    "PreferencePair",
    "PairSet",
    "build_pairs",
    "DPOConfig",
    "PreferenceBackend",
    "PreferenceUpdate",
    "DPO",
]


@dataclass
class DPOConfig(TrainerConfig):
    """The RL loop's settings (``TrainerConfig``) plus how pairs are built and scored.

    The rollout budget is the same as GRPO's (``steps`` x ``batch_size`` x ``group_size``); the
    backend's ``lr``, ``ppo_epochs``, ``mini_batches`` and ``micro_batch_tokens`` apply to the
    preference update as they do to the policy-gradient one.
    """

    update_rule: str = "dpo"
    beta: float = 0.1
    """Strength of the pull towards the reference: DPO's implicit reward is ``beta * log(pi / pi_ref)``.
    Smaller lets the policy move further from where RL started."""
    loss: PreferenceLoss = "sigmoid"
    """``sigmoid``: DPO's loss; ``ipo``: IPO's squared loss, which stops pulling once the log-ratio margin
    reaches ``1 / (2 beta)`` (more robust when preferences are noisy or nearly deterministic)."""
    pairing: Pairing = "halves"
    """Which rollouts of a group are paired: ``best_worst``, ``halves`` or ``all`` (module docstring)."""
    margin: float = 0.0
    """A pair needs ``reward(chosen) - reward(rejected) > margin``; 0 pairs any strict difference."""
    unit: PairUnit = "call"
    """What a pair compares: one call per side at the same position (``call``), or whole rollouts."""
    length_normalize: bool = False
    """Divide each side's summed logprob by its token count (the length-normalised variant, as IPO is
    often run): without it, long responses dominate the log-ratios."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.beta <= 0:
            raise ValueError(f"DPOConfig.beta must be > 0, got {self.beta}.")
        if self.margin < 0:
            raise ValueError(f"DPOConfig.margin must be >= 0, got {self.margin}.")
        if self.loss not in ("sigmoid", "ipo"):
            raise ValueError(f"DPOConfig.loss must be 'sigmoid' or 'ipo', got {self.loss!r}.")
        if self.pairing not in ("best_worst", "halves", "all"):
            raise ValueError(f"DPOConfig.pairing must be 'best_worst', 'halves' or 'all', got {self.pairing!r}.")
        if self.unit not in ("call", "rollout"):
            raise ValueError(f"DPOConfig.unit must be 'call' or 'rollout', got {self.unit!r}.")


@runtime_checkable
class PreferenceBackend(Protocol):
    """A backend that can run a preference update (``TorchBackend``)."""

    def preference_update(
        self,
        pairs: Sequence[tuple[Sequence[Transition], Sequence[Transition]]],
        *,
        beta: float = 0.1,
        loss: PreferenceLoss = "sigmoid",
        length_normalize: bool = False,
    ) -> dict[str, float]: ...


class PreferenceUpdate:
    """The ``dpo`` update rule: pairs from each group (``prepare``), a preference update (``apply``)."""

    def __init__(self, config: TrainerConfig) -> None:
        if not isinstance(config, DPOConfig):
            raise ValueError(
                "update_rule='dpo' needs a DPOConfig (lightning_rl.algorithms.DPOConfig), which carries the "
                "pairing and loss settings; use lightning_rl.algorithms.DPO(DPOConfig(...))."
            )
        self.config = config

    def prepare(self, samples: Sequence[RolloutSample]) -> UpdateBatch:
        cfg = self.config
        built = build_pairs(samples, pairing=cfg.pairing, margin=cfg.margin, unit=cfg.unit)
        used = {id(t) for p in built.pairs for t in (*p.chosen, *p.rejected)}
        return UpdateBatch(
            items=built.pairs,
            n_transitions=sum(len(s.transitions) for s in samples),
            n_updated=len(used),
            metrics={
                "train/dpo_pairs": float(len(built.pairs)),
                "train/dpo_groups_paired_frac": built.groups_paired / built.groups if built.groups else 0.0,
                "train/dpo_identical_calls": float(built.identical_calls),
            },
        )

    def apply(self, backend: PolicyBackend, batch: UpdateBatch) -> dict[str, float]:
        if not isinstance(backend, PreferenceBackend):
            raise TypeError(
                f"DPO needs a backend with preference_update (the torch backend); {type(backend).__name__} has none."
            )
        cfg = self.config
        pairs: Sequence[PreferencePair] = batch.items
        return backend.preference_update(
            [(p.chosen, p.rejected) for p in pairs], beta=cfg.beta, loss=cfg.loss, length_normalize=cfg.length_normalize
        )


class DPO(Trainer):
    """DPO from groups on the embedded services: ``DPO(DPOConfig(...)).fit(agent, train_tasks, val_tasks)``.

    Registered as ``dpo``; the run folder is the RL trainer's (metrics.jsonl, checkpoints, store).
    """

    config_class: ClassVar[type[TrainerConfig]] = DPOConfig
