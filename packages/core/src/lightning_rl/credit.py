"""Credit assignment and advantages: from rewards to one advantage per transition.

Returns (per transition ``t`` of a rollout with ``T + 1`` trainable calls, final reward ``R`` and
AIR rewards ``r_t`` attached by the adapter):

* ``broadcast``: ``G_t = R + r_t`` — every call shares the outcome.
* ``discounted``: ``G_t = sum_{k>=t} gamma^(k-t) r_k + gamma^(T-t) R`` — later calls get more credit.
* ``last``: ``G_t = r_t + [t == T] R`` — only the final call is credited with the outcome.

Advantages are computed per **rollout** inside its task group, never over pooled transitions, so
a rollout with many calls does not weigh more in the baseline. With ``c_t`` the coefficient with
which ``R`` enters ``G_t`` and ``A_i`` the rollout-level advantage of rollout ``i``:

* ``grpo``: ``A_i = (R_i - mean_g R) / (std_g R + eps)`` (``std`` unbiased, a singleton group uses
  mean 0 and std 1, matching VeRL's ``compute_grpo_outcome_advantage``); ``grpo_no_std`` skips the division.
* ``rloo``: ``A_i = R_i - mean_{j != i} R_j`` (leave-one-out baseline; 0 for a singleton group).

and each transition gets ``advantage_t = c_t * A_i + (G_t - c_t * R_i)``: the outcome part is
normalised like GRPO, the AIR part stays in reward units (dividing it by a group std near zero
would blow it up).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from lightning_rl.types import Transition

__all__ = [
    "CreditStrategy",
    "AdvantageEstimator",
    "RolloutSample",
    "assign_returns",
    "rollout_advantages",
    "compute_advantages",
]

CreditStrategy = Literal["broadcast", "discounted", "last"]
AdvantageEstimator = Literal["grpo", "grpo_no_std", "rloo"]


@dataclass
class RolloutSample:
    """One finished rollout's transitions (ordered) and its final reward."""

    rollout_id: str
    group_id: str
    reward: float
    transitions: list[Transition]


def _outcome_coefficients(n: int, strategy: CreditStrategy, gamma: float) -> list[float]:
    last = n - 1
    if strategy == "broadcast":
        return [1.0] * n
    if strategy == "last":
        return [1.0 if t == last else 0.0 for t in range(n)]
    if strategy == "discounted":
        return [gamma ** (last - t) for t in range(n)]
    raise ValueError(f"unknown credit strategy {strategy!r}; use 'broadcast', 'discounted' or 'last'.")


def assign_returns(
    transitions: Sequence[Transition], final_reward: float, strategy: CreditStrategy = "broadcast", gamma: float = 1.0
) -> list[float]:
    """Set ``return_`` on each transition (in order) from the final reward and its AIR ``reward``.

    Returns the coefficients ``c_t`` with which the final reward entered each return.
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}.")
    coeffs = _outcome_coefficients(len(transitions), strategy, gamma)
    future = 0.0
    for t in range(len(transitions) - 1, -1, -1):
        step = transitions[t]
        if strategy == "discounted":
            future = step.reward + gamma * future
            step.return_ = future + coeffs[t] * final_reward
        else:
            step.return_ = step.reward + coeffs[t] * final_reward
    return coeffs


def rollout_advantages(
    rewards: Sequence[float], groups: Sequence[str], estimator: AdvantageEstimator = "grpo", eps: float = 1e-6
) -> list[float]:
    """Rollout-level advantages of ``rewards`` grouped by ``groups`` (see the module docstring)."""
    if len(rewards) != len(groups):
        raise ValueError(f"{len(rewards)} rewards but {len(groups)} group ids.")
    members: dict[str, list[int]] = defaultdict(list)
    for i, g in enumerate(groups):
        members[g].append(i)
    out = [0.0] * len(rewards)
    for idx in members.values():
        values = [rewards[i] for i in idx]
        n = len(values)
        if estimator == "rloo":
            total = sum(values)
            for i in idx:
                out[i] = rewards[i] - (total - rewards[i]) / (n - 1) if n > 1 else 0.0
            continue
        if estimator not in ("grpo", "grpo_no_std"):
            raise ValueError(f"unknown advantage estimator {estimator!r}; use 'grpo', 'grpo_no_std' or 'rloo'.")
        if n == 1:
            mean, std = 0.0, 1.0
        else:
            mean = sum(values) / n
            std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
        for i in idx:
            centred = rewards[i] - mean
            out[i] = centred / (std + eps) if estimator == "grpo" else centred
    return out


def compute_advantages(
    samples: Sequence[RolloutSample],
    *,
    strategy: CreditStrategy = "broadcast",
    gamma: float = 1.0,
    estimator: AdvantageEstimator = "grpo",
    eps: float = 1e-6,
) -> list[Transition]:
    """Returns, rollout-level advantages and per-transition advantages; returns all transitions."""
    adv = rollout_advantages([s.reward for s in samples], [s.group_id for s in samples], estimator, eps)
    out: list[Transition] = []
    for sample, a in zip(samples, adv, strict=True):
        coeffs = assign_returns(sample.transitions, sample.reward, strategy, gamma)
        for step, c in zip(sample.transitions, coeffs, strict=True):
            step.advantage = c * a + (step.return_ - c * sample.reward)
            out.append(step)
    return out
