"""LightningRL and VeRL agree: GRPO advantages, and the PPO-clip policy loss on the same batch (CPU)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("verl")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.workers.config import ActorConfig  # noqa: E402

from lightning_rl.backends.losses import ppo_clip_loss, token_weights  # noqa: E402
from lightning_rl.backends.verl.advantages import verl_compute_advantages, verl_rollout_advantages  # noqa: E402
from lightning_rl.backends.verl.batch import transitions_to_dataproto  # noqa: E402
from lightning_rl.credit import compute_advantages, rollout_advantages  # noqa: E402


def test_grpo_rollout_advantages_equal_verls(samples: list[Any]) -> None:
    rewards = [s.reward for s in samples]
    groups = [s.group_id for s in samples]
    assert len(set(rewards)) > 1  # the recorded groups have variance
    ours = rollout_advantages(rewards, groups, "grpo")
    # VeRL's own function on one row per rollout, scores on the last of 3 "tokens"
    scores = torch.zeros(len(rewards), 3)
    scores[:, -1] = torch.tensor(rewards)
    verl_adv, _ = core_algos.compute_grpo_outcome_advantage(scores, torch.ones(len(rewards), 3), np.array(groups))
    assert verl_adv[:, 0].tolist() == pytest.approx(ours, abs=1e-6)
    assert verl_rollout_advantages(rewards, groups) == pytest.approx(ours, abs=1e-6)
    no_std, _ = core_algos.compute_grpo_outcome_advantage(
        scores, torch.ones(len(rewards), 3), np.array(groups), norm_adv_by_std_in_grpo=False
    )
    assert no_std[:, 0].tolist() == pytest.approx(rollout_advantages(rewards, groups, "grpo_no_std"), abs=1e-6)


def test_singleton_groups_match_verl_too() -> None:
    ours = rollout_advantages([0.3, 1.0, 0.0], ["a", "b", "b"], "grpo")
    assert verl_rollout_advantages([0.3, 1.0, 0.0], ["a", "b", "b"]) == pytest.approx(ours, abs=1e-6)


@pytest.mark.parametrize("strategy", ["broadcast", "last", "discounted"])
def test_transition_advantages_from_verl_equal_lightning(samples: list[Any], strategy: str) -> None:
    import copy

    mine = compute_advantages(copy.deepcopy(samples), strategy=strategy, gamma=0.9)  # pyright: ignore[reportArgumentType]
    theirs = verl_compute_advantages(copy.deepcopy(samples), strategy=strategy, gamma=0.9)  # pyright: ignore[reportArgumentType]
    assert [t.advantage for t in theirs] == pytest.approx([t.advantage for t in mine], abs=1e-6)


def test_pooled_transition_grpo_would_favour_long_rollouts() -> None:
    """Why uid alone is not enough: VeRL's GRPO over transitions weighs a 3-call rollout 3 times."""
    pooled, _ = core_algos.compute_grpo_outcome_advantage(
        torch.tensor([[1.0], [1.0], [1.0], [0.0]]), torch.ones(4, 1), np.array(["g"] * 4)
    )
    per_rollout = verl_rollout_advantages([1.0, 0.0], ["g", "g"])
    assert pooled[0, 0].item() == pytest.approx(0.5, abs=1e-5)  # mean pulled up by the long rollout
    assert per_rollout == pytest.approx([0.70710, -0.70710], abs=1e-4)


def _actor_config(loss_agg_mode: str, clip_low: float, clip_high: float, clip_c: float = 3.0) -> ActorConfig:
    return ActorConfig(
        clip_ratio_c=clip_c,
        strategy="fsdp",
        ppo_mini_batch_size=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=0.2,
        clip_ratio_low=clip_low,
        clip_ratio_high=clip_high,
        loss_agg_mode=loss_agg_mode,
        rollout_n=1,
    )


@pytest.mark.parametrize(("mode", "aggregation"), [("token-mean", "token"), ("seq-mean-token-mean", "transition")])
def test_verl_policy_loss_equals_ours_on_the_recorded_batch(samples: list[Any], mode: str, aggregation: str) -> None:
    transitions = compute_advantages(samples, strategy="broadcast", estimator="grpo")
    built = transitions_to_dataproto(transitions)
    b = built.data.batch
    mask = b["response_mask"].bool()
    old = b["rollout_log_probs"]
    # a "new" policy: the sampled logprobs moved by seeded noise, enough for some ratios to clip
    gen = torch.Generator().manual_seed(0)
    new = (old + 0.3 * torch.randn(old.shape, generator=gen)).where(mask, torch.zeros_like(old))
    new.requires_grad_(True)
    config = _actor_config(mode, 0.2, 0.28, clip_c=1e9)  # VeRL's dual-clip bound; ours has none (docs/verl.md)
    verl_loss, verl_metrics = core_algos.get_policy_loss_fn("vanilla")(
        old_log_prob=old,
        log_prob=new,
        advantages=b["advantages"],
        response_mask=mask,
        loss_agg_mode=mode,
        config=config,
    )
    verl_loss.backward()  # pyright: ignore[reportUnknownMemberType]
    verl_grad = new.grad.clone()  # pyright: ignore[reportOptionalMemberAccess]

    flat_new = new.detach()[mask].clone().requires_grad_(True)
    lengths = [len(t.response_ids) for t in built.transitions]
    weights = token_weights(lengths, [t.rollout_id for t in built.transitions], aggregation)  # pyright: ignore[reportArgumentType]
    w = torch.tensor([w for w, n in zip(weights, lengths, strict=True) for _ in range(n)])
    ours = ppo_clip_loss(flat_new, old[mask], b["advantages"][mask], w, clip_low=0.2, clip_high=0.28)
    ours.loss.backward()  # pyright: ignore[reportUnknownMemberType]
    assert float(ours.loss.detach()) == pytest.approx(float(verl_loss.detach()), rel=1e-5, abs=1e-7)
    assert flat_new.grad is not None
    assert torch.allclose(flat_new.grad, verl_grad[mask], atol=1e-6)
    # with token-mean both report the same clip fraction
    if mode == "token-mean":
        assert float(ours.clip_frac) == pytest.approx(verl_metrics["actor/pg_clipfrac"], abs=1e-6)
    assert 0 < float(ours.clip_frac) < 1


def test_verl_dual_clip_is_the_only_difference_for_large_ratios() -> None:
    old = torch.zeros(1, 2)
    new = torch.tensor([[2.0, 0.0]])  # ratio e^2 ~ 7.4 > clip_ratio_c = 3
    adv = torch.tensor([[-1.0, -1.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    config = _actor_config("token-mean", 0.2, 0.2)
    verl_loss, _ = core_algos.get_policy_loss_fn("vanilla")(
        old_log_prob=old, log_prob=new, advantages=adv, response_mask=mask, loss_agg_mode="token-mean", config=config
    )
    ours = ppo_clip_loss(new[0], old[0], adv[0], torch.full((2,), 0.5))
    assert float(verl_loss.detach()) == pytest.approx((3.0 + 1.0) / 2)  # token 0 capped at -A * clip_ratio_c
    assert float(ours.loss.detach()) == pytest.approx((float(torch.exp(torch.tensor(2.0))) + 1.0) / 2)
