"""Preference pairs from each task's group of rollouts: the pair builder DPO trains on and the export writes.

Kept apart from ``dpo`` (which needs the torch trainer) so that ``lightning-rl export dpo`` builds the
very same pairs on an install without torch. The rules (which rollouts are paired, what a pair
compares) are documented in ``lightning_rl.algorithms.dpo``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from lightning_rl.credit import RolloutSample
from lightning_rl.types import Transition

__all__ = ["Pairing", "PairUnit", "PreferencePair", "PairSet", "build_pairs"]

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
