"""Concatenated rollouts (``TrainerConfig(sequence="concatenated")``): how calls are joined into one
masked sequence, and that the masked sequence trains what the per-call transitions train when the
template keeps the prefix (the same token-mean loss, one forward pass instead of two)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from lightning_rl.backends.torch_backend import TorchBackend, TorchBackendConfig
from lightning_rl.credit import RolloutSample
from lightning_rl.sequences import JoinCounts, concatenate_calls, concatenate_samples
from lightning_rl.trainer import TrainerConfig
from lightning_rl.trainer.update_rules import PolicyGradient
from lightning_rl.types import Transition

END = 99  # the end-of-turn token of these synthetic calls


def _call(prompt: list[int], response: list[int], **kw: object) -> Transition:
    return Transition(
        prompt_ids=prompt,
        response_ids=response,
        response_logprobs=[-1.0] * len(response),
        rollout_id="r",
        attempt_id="a",
        **kw,  # type: ignore[arg-type]
    )


def test_a_canonical_join_appends_what_the_next_prompt_adds() -> None:
    first = _call([1, 2, 3], [10, 11, END], reward=-0.1, tool_call_ids=["c1"])
    second = _call([1, 2, 3, 10, 11, END, 50, 51], [20, END])
    counts = JoinCounts()
    (seq,) = concatenate_calls([first, second], counts)
    assert seq.prompt_ids == [1, 2, 3]
    assert seq.response_ids == [10, 11, END, 50, 51, 20, END]
    assert seq.response_mask == [1, 1, 1, 0, 0, 1, 1]
    assert seq.response_logprobs == [-1.0, -1.0, -1.0, 0.0, 0.0, -1.0, -1.0]
    assert seq.trained_tokens == 5 and seq.reward == pytest.approx(-0.1) and seq.tool_call_ids == ["c1"]
    assert counts == JoinCounts(canonical=1)
    assert first.response_mask is None  # the per-call transitions are left as they were


def test_a_re_rendered_turn_is_replaced_by_the_sampled_one_and_a_rewritten_history_splits() -> None:
    first = _call([1, 2, 3], [10, 11, END])
    rendered = _call([1, 2, 3, 12, 13, END, 50], [20, END])  # the template wrote the call back differently
    counts = JoinCounts()
    (seq,) = concatenate_calls([first, rendered], counts)
    assert seq.response_ids == [10, 11, END, 50, 20, END] and seq.response_mask == [1, 1, 1, 0, 1, 1]
    rewritten = _call([7, 8], [30, END])  # not even the previous prompt is kept: a new sequence
    parts = concatenate_calls([first, rendered, rewritten], counts)
    assert [p.response_ids for p in parts] == [[10, 11, END, 50, 20, END], [30, END]]
    assert [p.step_index for p in parts] == [0, 1]
    truncated = _call([1, 2, 3], [10, 11], truncated=True)  # cut at max_tokens: no end of turn to splice after
    assert len(concatenate_calls([truncated, _call([1, 2, 3, 10, END, 50], [20, END])], counts)) == 2
    assert counts == JoinCounts(canonical=0, spliced=2, split=2)
    assert counts.metrics()["train/concat_split_joins"] == 2.0


def test_a_mask_must_fit_the_response() -> None:
    with pytest.raises(ValueError, match="2 entries for 3"):
        _call([1], [1, 2, 3], response_mask=[1, 1])
    with pytest.raises(ValueError, match="0 or 1"):
        _call([1], [1], response_mask=[2])


def test_the_policy_gradient_rule_concatenates_when_asked() -> None:
    calls = [_call([1, 2], [3, END]), _call([1, 2, 3, END, 5], [6, END])]
    other = [_call([1, 2], [4, END])]
    samples = [RolloutSample("r1", "g", 1.0, calls), RolloutSample("r2", "g", 0.0, other)]
    joined, counts = concatenate_samples(samples)
    assert [len(s.transitions) for s in joined] == [1, 1] and counts.canonical == 1
    batch = PolicyGradient(TrainerConfig(sequence="concatenated")).prepare(samples)
    assert batch.n_transitions == 3 and batch.n_updated == 2
    assert batch.metrics["train/concat_canonical_joins"] == 1.0
    with pytest.raises(ValueError, match="policy_gradient"):
        TrainerConfig(sequence="concatenated", update_rule="dpo")


def test_a_canonical_concatenation_trains_what_the_per_call_transitions_train(tiny_model_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    vocab = int(model.config.vocab_size)
    g = torch.Generator().manual_seed(1)
    p1 = torch.randint(5, vocab, (12,), generator=g).tolist()
    r1 = torch.randint(5, vocab, (4,), generator=g).tolist()
    obs = torch.randint(5, vocab, (6,), generator=g).tolist()
    r2 = torch.randint(5, vocab, (3,), generator=g).tolist()
    calls = [_call(p1, r1), _call([*p1, *r1, *obs], r2)]
    for c in calls:
        c.advantage = 0.7
    (seq,) = concatenate_calls(calls)
    seq.advantage = 0.7
    config = TorchBackendConfig(lr=1e-2, old_logprobs="recompute", track_kl=False, max_grad_norm=0.0, seed=0)
    per_call = TorchBackend(copy.deepcopy(model), config)
    joined = TorchBackend(copy.deepcopy(model), config)
    a = per_call.update(calls)
    b = joined.update([seq])
    assert a["train/loss"] == pytest.approx(b["train/loss"], abs=1e-5)
    assert a["train/entropy"] == pytest.approx(b["train/entropy"], rel=1e-4)
    assert b["train/sequence_tokens"] < a["train/sequence_tokens"]  # the prefix runs once, not twice
    # the update leaves its gradients on the parameters: the same gradient, to float rounding
    for x, y in zip(per_call.model.parameters(), joined.model.parameters(), strict=True):
        assert x.grad is not None and y.grad is not None
        torch.testing.assert_close(x.grad, y.grad, rtol=1e-3, atol=1e-6)
