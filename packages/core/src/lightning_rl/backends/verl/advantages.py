"""Let VeRL compute the advantages, at rollout level.

VeRL's ``compute_grpo_outcome_advantage`` normalises each row's score within its ``uid`` group. Fed
one row per *transition*, a rollout with many LLM calls would put many rows into its group's mean
and std, and so weigh more than a rollout with one call. Here VeRL's estimator is fed one row per
*rollout* (its final reward, ``uid`` = its group id); the rollout-level advantage is then spread
over the rollout's transitions with the same credit coefficients as ``lightning_rl.credit``
(``advantage_t = c_t * A_i + (G_t - c_t * R_i)``). With VeRL's GRPO this equals LightningRL's
``compute_advantages(..., estimator="grpo")`` (the tests check it), so either side may compute them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from lightning_rl.backends.verl._require import require_verl
from lightning_rl.credit import CreditStrategy, RolloutSample, assign_returns
from lightning_rl.types import Transition

require_verl()

from verl.trainer.ppo import core_algos  # noqa: E402  # pyright: ignore[reportMissingImports]

__all__ = ["verl_rollout_advantages", "verl_compute_advantages"]


def verl_rollout_advantages(
    rewards: Sequence[float],
    groups: Sequence[str],
    *,
    estimator: str = "grpo",
    norm_adv_by_std_in_grpo: bool = True,
    epsilon: float = 1e-6,
) -> list[float]:
    """One advantage per rollout from VeRL's estimator (``grpo``, or any registered outcome estimator)."""
    if len(rewards) != len(groups):
        raise ValueError(f"{len(rewards)} rewards but {len(groups)} group ids.")
    if not rewards:
        return []
    # one row per rollout, the score on its single "token" (GRPO sums token rewards per row)
    scores = torch.tensor(list(rewards), dtype=torch.float32).unsqueeze(-1)
    mask = torch.ones_like(scores)
    index = np.array(list(groups), dtype=object)
    if estimator == "grpo":
        adv, _ = core_algos.compute_grpo_outcome_advantage(
            token_level_rewards=scores,
            response_mask=mask,
            index=index,
            epsilon=epsilon,
            norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
        )
    else:
        fn: Any = core_algos.get_adv_estimator_fn(estimator)
        adv, _ = fn(token_level_rewards=scores, response_mask=mask, index=index, config=None)
    return [float(a) for a in adv[:, 0].tolist()]


def verl_compute_advantages(
    samples: Sequence[RolloutSample],
    *,
    strategy: CreditStrategy = "broadcast",
    gamma: float = 1.0,
    estimator: str = "grpo",
    norm_adv_by_std_in_grpo: bool = True,
) -> list[Transition]:
    """``lightning_rl.credit.compute_advantages`` with VeRL computing the rollout-level advantages."""
    adv = verl_rollout_advantages(
        [s.reward for s in samples],
        [s.group_id for s in samples],
        estimator=estimator,
        norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
    )
    out: list[Transition] = []
    for sample, a in zip(samples, adv, strict=True):
        coeffs = assign_returns(sample.transitions, sample.reward, strategy, gamma)
        for step, c in zip(sample.transitions, coeffs, strict=True):
            step.advantage = c * a + (step.return_ - c * sample.reward)
            out.append(step)
    return out
