"""Credit strategies, AIR and GRPO/RLOO advantages against hand-computed values."""

from __future__ import annotations

import math

import pytest

from lightning_rl.credit import RolloutSample, assign_returns, compute_advantages, rollout_advantages
from lightning_rl.types import Transition


def steps(n: int, rollout: str = "r", air: list[float] | None = None) -> list[Transition]:
    out = [
        Transition(prompt_ids=[1], response_ids=[2], rollout_id=rollout, attempt_id="a", step_index=i) for i in range(n)
    ]
    for t, r in zip(out, air or [0.0] * n, strict=True):
        t.reward = r
    return out


def test_broadcast_gives_every_call_the_final_reward_plus_its_own_air() -> None:
    ts = steps(3, air=[0.0, -0.1, 0.0])
    coeffs = assign_returns(ts, 1.0, "broadcast")
    assert coeffs == [1.0, 1.0, 1.0]
    assert [t.return_ for t in ts] == pytest.approx([1.0, 0.9, 1.0])


def test_last_credits_only_the_final_call() -> None:
    ts = steps(3, air=[-0.1, 0.0, 0.0])
    assign_returns(ts, 2.0, "last")
    assert [t.return_ for t in ts] == pytest.approx([-0.1, 0.0, 2.0])


def test_discounted_sums_future_air_and_discounts_the_outcome() -> None:
    ts = steps(3, air=[0.0, -0.1, 0.2])
    assign_returns(ts, 1.0, "discounted", gamma=0.5)
    # G2 = 0.2 + 1.0 ; G1 = -0.1 + 0.5*0.2 + 0.5*1 ; G0 = 0 + 0.5*(-0.1) + 0.25*0.2 + 0.25*1
    assert [t.return_ for t in ts] == pytest.approx([0.25, 0.5, 1.2])


def test_bad_strategy_and_gamma_are_rejected() -> None:
    with pytest.raises(ValueError, match="credit strategy"):
        assign_returns(steps(1), 1.0, "nope")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gamma"):
        assign_returns(steps(1), 1.0, "discounted", gamma=1.5)


def test_grpo_normalises_within_each_group_with_unbiased_std() -> None:
    adv = rollout_advantages([1.0, 0.0, 1.0, 1.0, 5.0], ["a", "a", "a", "a", "b"], "grpo", eps=0.0)
    mean, std = 0.75, math.sqrt((3 * 0.25**2 + 0.75**2) / 3)
    assert adv[:4] == pytest.approx([(1 - mean) / std, (0 - mean) / std, (1 - mean) / std, (1 - mean) / std])
    assert adv[4] == pytest.approx(5.0)  # a singleton group: mean 0, std 1 (as VeRL)


def test_grpo_no_std_and_identical_rewards() -> None:
    assert rollout_advantages([1.0, 3.0], ["g", "g"], "grpo_no_std") == pytest.approx([-1.0, 1.0])
    assert rollout_advantages([1.0, 1.0, 1.0], ["g"] * 3, "grpo") == pytest.approx([0.0, 0.0, 0.0])


def test_rloo_uses_the_leave_one_out_mean() -> None:
    assert rollout_advantages([1.0, 0.0, 0.5], ["g"] * 3, "rloo") == pytest.approx([0.75, -0.75, 0.0])
    assert rollout_advantages([2.0], ["g"], "rloo") == [0.0]


def test_advantages_are_per_rollout_not_per_pooled_transition() -> None:
    # a long successful rollout and a short failed one: both get +/- the same magnitude
    long_ok = RolloutSample("r1", "g", 1.0, steps(5, "r1"))
    short_bad = RolloutSample("r2", "g", 0.0, steps(1, "r2"))
    out = compute_advantages([long_ok, short_bad], estimator="grpo", eps=0.0)
    a = 0.5 / math.sqrt(0.5)
    assert [t.advantage for t in out] == pytest.approx([a] * 5 + [-a])


def test_air_is_added_in_reward_units_on_top_of_the_normalised_outcome() -> None:
    ok = RolloutSample("r1", "g", 1.0, steps(2, "r1", air=[-0.1, 0.0]))
    bad = RolloutSample("r2", "g", 0.0, steps(1, "r2"))
    out = compute_advantages([ok, bad], estimator="grpo_no_std")
    assert [t.advantage for t in out] == pytest.approx([0.5 - 0.1, 0.5, -0.5])


def test_grpo_matches_verl_when_installed() -> None:
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    import numpy as np
    import torch

    rewards = [1.0, 0.0, 1.0, 0.5, 0.2, 0.9, 3.0]
    groups = ["a", "a", "a", "b", "b", "b", "c"]
    scores = torch.zeros(len(rewards), 4)
    scores[:, -1] = torch.tensor(rewards)
    mask = torch.ones(len(rewards), 4)
    adv, _ = core_algos.compute_grpo_outcome_advantage(scores, mask, np.array(groups))
    ours = rollout_advantages(rewards, groups, "grpo")
    assert adv[:, 0].tolist() == pytest.approx(ours, abs=1e-5)
