"""PPO-clip loss, aggregation weights and micro-batch packing against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_rl.backends.losses import kl_k3, ppo_clip_loss, token_weights
from lightning_rl.backends.torch_backend import pack_micro_batches


def test_token_weights_for_each_aggregation() -> None:
    lengths, rollouts = [1, 3, 2], ["a", "a", "b"]
    assert token_weights(lengths, rollouts, "token") == pytest.approx([1 / 6] * 3)
    assert token_weights(lengths, rollouts, "transition") == pytest.approx([1 / 3, 1 / 9, 1 / 6])
    # rollout a has 2 transitions, b has 1; 2 rollouts
    assert token_weights(lengths, rollouts, "rollout") == pytest.approx([1 / 4, 1 / 12, 1 / 4])
    for agg in ("token", "transition", "rollout"):
        w = token_weights(lengths, rollouts, agg)  # type: ignore[arg-type]
        assert sum(wi * n for wi, n in zip(w, lengths, strict=True)) == pytest.approx(1.0)


def test_ppo_clip_loss_by_hand() -> None:
    logp = torch.tensor([math.log(0.5), math.log(0.9), math.log(0.2)])
    old = torch.tensor([math.log(0.25), math.log(0.9), math.log(0.4)])
    adv = torch.tensor([1.0, -2.0, -1.0])
    w = torch.tensor([0.5, 0.25, 0.25])
    terms = ppo_clip_loss(logp, old, adv, w, clip_low=0.2, clip_high=0.3)
    # ratios: 2.0 (A>0: clipped to 1.3 -> -1.3), 1.0 (-> 2.0), 0.5 (A<0: max(0.5, 0.8) -> 0.8)
    expected = 0.5 * -1.3 + 0.25 * 2.0 + 0.25 * 0.8
    assert float(terms.loss) == pytest.approx(expected)
    assert float(terms.clip_frac) == pytest.approx(0.75)
    assert float(terms.ratio) == pytest.approx(0.5 * 2.0 + 0.25 * 1.0 + 0.25 * 0.5)


def test_ppo_gradient_equals_policy_gradient_on_policy() -> None:
    logp = torch.tensor([-1.0, -2.0], requires_grad=True)
    adv = torch.tensor([2.0, -1.0])
    w = torch.tensor([0.5, 0.5])
    ppo_clip_loss(logp, logp.detach(), adv, w).loss.backward()
    assert logp.grad is not None
    assert logp.grad.tolist() == pytest.approx([-1.0, 0.5])


def test_kl_k3_is_zero_at_equality_and_positive_otherwise() -> None:
    a = torch.tensor([-1.0, -2.0])
    assert kl_k3(a, a).tolist() == [0.0, 0.0]
    d = 0.5
    assert float(kl_k3(torch.tensor([-1.0]), torch.tensor([-1.0 + d]))) == pytest.approx(math.exp(d) - d - 1)
    terms = ppo_clip_loss(a, a, torch.zeros(2), torch.tensor([0.5, 0.5]), ref_logprobs=a - 0.5, kl_coef=0.1)
    assert float(terms.kl) > 0 and float(terms.loss) == pytest.approx(0.1 * float(terms.kl))


def test_pack_micro_batches_respects_the_budget_and_never_truncates() -> None:
    seqs = [([1, 2], [3]), ([1] * 10, [2] * 10), ([1], [2, 3])]
    mbs = pack_micro_batches(seqs, budget=8, pad_id=0)
    assert sorted(i for mb in mbs for i in mb.indices) == [0, 1, 2]
    for mb in mbs:
        assert mb.n_tokens <= 8 or len(mb.indices) == 1
        for row, i in enumerate(mb.indices):
            p, r = seqs[i]
            assert mb.input_ids[row, : len(p) + len(r)].tolist() == list(p) + list(r)
            assert int(mb.attention_mask[row].sum()) == len(p) + len(r)


def test_pack_micro_batches_keeps_different_prompt_prefixes_apart() -> None:
    """``group_prefix``: two agents' requests (different system prompts) never share a micro-batch, so
    each micro-batch keeps one prefix to run once; one agent's requests pack exactly as without it."""
    planner, answerer = [7, 7, 7], [8, 8, 8]
    seqs = [(planner + [1], [2]), (answerer + [1, 2], [3]), (planner + [4, 5], [6]), (answerer + [9], [1, 2])]
    mixed = pack_micro_batches(seqs, budget=10_000, pad_id=0)
    assert len(mixed) == 1
    grouped = pack_micro_batches(seqs, budget=10_000, pad_id=0, group_prefix=3)
    assert sorted(sorted(mb.indices) for mb in grouped) == [[0, 2], [1, 3]]
    for mb in grouped:
        assert len({tuple(mb.input_ids[row, :3].tolist()) for row in range(len(mb.indices))}) == 1
    one_agent = [s for s in seqs if s[0][:3] == answerer]
    plain = pack_micro_batches(one_agent, budget=9, pad_id=0)
    same = pack_micro_batches(one_agent, budget=9, pad_id=0, group_prefix=3)
    assert [mb.indices for mb in plain] == [mb.indices for mb in same]
    assert all(torch.equal(a.input_ids, b.input_ids) for a, b in zip(plain, same, strict=True))
