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

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Literal, Protocol, runtime_checkable

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

Pairing = Literal["best_worst", "halves", "all"]
PairUnit = Literal["call", "rollout"]


@dataclass
class PreferencePair:
    """A chosen and a rejected side from one task's group; each side is one call or a whole rollout."""

    chosen: list[Transition]
    rejected: list[Transition]
    group_id: str
    reward_gap: float
    """Reward of the chosen rollout minus that of the rejected one (> ``margin``)."""
    position: int | None = None
    """The call index both sides share (``unit="call"``); None for whole rollouts."""


@dataclass
class PairSet:
    """The pairs of one step and what building them left out."""

    pairs: list[PreferencePair] = field(default_factory=list[PreferencePair])
    groups: int = 0
    groups_paired: int = 0
    """Groups that gave at least one pair."""
    identical_calls: int = 0
    """Call positions skipped because both rollouts produced the same prompt and response tokens."""


def _usable(transitions: Sequence[Transition]) -> list[Transition]:
    return [t for t in transitions if t.prompt_ids and t.response_ids]


def _rollout_pairs(
    group: list[RolloutSample], pairing: Pairing, margin: float
) -> list[tuple[RolloutSample, RolloutSample]]:
    ranked = sorted(group, key=lambda s: -s.reward)  # stable: ties keep rollout order
    n = len(ranked)
    if pairing == "best_worst":
        candidates = [(ranked[0], ranked[-1])] if n > 1 else []
    elif pairing == "halves":
        candidates = [(ranked[i], ranked[n - 1 - i]) for i in range(n // 2)]
    elif pairing == "all":
        candidates = [(ranked[i], ranked[j]) for i in range(n) for j in range(i + 1, n)]
    else:
        raise ValueError(f"unknown pairing {pairing!r}; use 'best_worst', 'halves' or 'all'.")
    return [(hi, lo) for hi, lo in candidates if hi.reward - lo.reward > margin]


def build_pairs(
    samples: Sequence[RolloutSample], *, pairing: Pairing = "halves", margin: float = 0.0, unit: PairUnit = "call"
) -> PairSet:
    """Preference pairs within each group of ``samples`` (see the module docstring for the rules).

    Only rollouts of the same group (task and step) are compared. A group of one, or one whose
    rewards are all within ``margin`` of each other, gives no pair. Transitions without prompt or
    response tokens are left out of every side.
    """
    if margin < 0:
        raise ValueError(f"margin must be >= 0 (a pair needs a reward gap above it), got {margin}.")
    if unit not in ("call", "rollout"):
        raise ValueError(f"unknown pair unit {unit!r}; use 'call' or 'rollout'.")
    groups: dict[str, list[RolloutSample]] = defaultdict(list)
    for sample in samples:
        groups[sample.group_id].append(sample)
    out = PairSet(groups=len(groups))
    for group_id, group in groups.items():
        before = len(out.pairs)
        for hi, lo in _rollout_pairs(group, pairing, margin):
            gap = hi.reward - lo.reward
            chosen, rejected = _usable(hi.transitions), _usable(lo.transitions)
            if unit == "rollout":
                if chosen and rejected:
                    out.pairs.append(PreferencePair(chosen, rejected, group_id, gap))
                continue
            for k, (c, r) in enumerate(zip(chosen, rejected, strict=False)):
                if c.prompt_ids == r.prompt_ids and c.response_ids == r.response_ids:
                    out.identical_calls += 1
                    continue
                out.pairs.append(PreferencePair([c], [r], group_id, gap, position=k))
        out.groups_paired += len(out.pairs) > before
    return out


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
