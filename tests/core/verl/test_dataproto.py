"""Transitions recorded by a real CPU step -> VeRL ``DataProto``: every tensor checked cell by cell."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("verl")

import torch  # noqa: E402

from lightning_rl.backends.verl.batch import (  # noqa: E402
    PAD_UID_PREFIX,
    BatchConfig,
    transitions_to_dataproto,
)
from lightning_rl.credit import compute_advantages  # noqa: E402
from lightning_rl.types import Transition  # noqa: E402


def _transitions(samples: list[Any]) -> list[Transition]:
    return compute_advantages(samples, strategy="broadcast", estimator="grpo")


def test_recorded_run_has_multi_call_rollouts_with_exact_tokens(samples: list[Any]) -> None:
    transitions = _transitions(samples)
    assert len(samples) == 6  # 2 tasks x group of 3, none failed
    assert all(len(s.transitions) == 2 for s in samples)  # the agent makes two calls
    assert all(t.exact_tokens and t.response_logprobs is not None for t in transitions)
    assert len({t.group_id for t in transitions}) == 2


def test_layout_is_left_padded_prompts_and_right_padded_responses(samples: list[Any], recorded_run: Any) -> None:
    transitions = _transitions(samples)
    pad = recorded_run.pad_token_id
    built = transitions_to_dataproto(transitions, BatchConfig(pad_token_id=pad))
    b = built.data.batch
    n = len(transitions)
    width_p = max(len(t.prompt_ids) for t in transitions)
    width_r = max(len(t.response_ids) for t in transitions)
    assert len(built.data) == n and built.n_pad_rows == 0
    assert b["prompts"].shape == (n, width_p) and b["responses"].shape == (n, width_r)
    assert b["input_ids"].shape == b["attention_mask"].shape == b["position_ids"].shape == (n, width_p + width_r)
    for key in ("response_mask", "rollout_log_probs", "token_level_scores", "advantages", "returns"):
        assert b[key].shape == (n, width_r), key
    for row, t in enumerate(transitions):
        p, r = len(t.prompt_ids), len(t.response_ids)
        assert b["prompts"][row].tolist() == [pad] * (width_p - p) + t.prompt_ids
        assert b["responses"][row].tolist() == t.response_ids + [pad] * (width_r - r)
        assert b["input_ids"][row].tolist() == b["prompts"][row].tolist() + b["responses"][row].tolist()
        mask = [0] * (width_p - p) + [1] * (p + r) + [0] * (width_r - r)
        assert b["attention_mask"][row].tolist() == mask
        # positions count real tokens only: 0 on left padding, then 0..p+r-1, repeated last on right padding
        positions = [0] * (width_p - p) + list(range(p + r)) + [p + r - 1] * (width_r - r)
        assert b["position_ids"][row].tolist() == positions
        assert b["response_mask"][row].tolist() == [1] * r + [0] * (width_r - r)
        assert b["rollout_log_probs"][row, :r].tolist() == pytest.approx(t.response_logprobs)
        assert b["rollout_log_probs"][row, r:].abs().sum() == 0
        scores = [0.0] * width_r
        scores[r - 1] = t.return_
        assert b["token_level_scores"][row].tolist() == pytest.approx(scores)
        assert b["advantages"][row].tolist() == pytest.approx([t.advantage] * r + [0.0] * (width_r - r))
    nt = built.data.non_tensor_batch
    assert list(nt["uid"]) == [t.group_id for t in transitions]
    assert list(nt["rollout_id"]) == [t.rollout_id for t in transitions]
    assert built.data.meta_info["global_token_num"] == [len(t.prompt_ids) + len(t.response_ids) for t in transitions]
    assert built.metrics()["verl/overlong_dropped"] == 0


def test_batch_is_padded_to_the_divisor_with_rows_that_carry_no_loss(samples: list[Any]) -> None:
    transitions = _transitions(samples)  # 12 transitions
    built = transitions_to_dataproto(transitions, BatchConfig(size_divisor=5))
    assert len(built.data) == 15 and built.n_pad_rows == 3
    b = built.data.batch
    assert b["response_mask"][12:].sum() == 0 and b["advantages"][12:].abs().sum() == 0
    assert b["token_level_scores"][12:].abs().sum() == 0
    assert b["attention_mask"][12:].sum() > 0  # still real sequences for VeRL's no-padding conversion
    assert all(str(u).startswith(PAD_UID_PREFIX) for u in built.data.non_tensor_batch["uid"][12:])
    assert list(built.data.non_tensor_batch["is_pad"]) == [False] * 12 + [True] * 3
    # the real rows are untouched and none is dropped
    assert b["response_mask"][:12].sum() == sum(len(t.response_ids) for t in transitions)
    assert built.metrics()["verl/pad_rows"] == 3


def test_overlong_samples_raise_or_are_dropped_and_counted(samples: list[Any]) -> None:
    transitions = _transitions(samples)
    longest = max(len(t.prompt_ids) for t in transitions)
    limit = longest - 1
    n_over = sum(len(t.prompt_ids) > limit for t in transitions)
    with pytest.raises(ValueError, match="max_prompt_length"):
        transitions_to_dataproto(transitions, BatchConfig(max_prompt_length=limit))
    built = transitions_to_dataproto(transitions, BatchConfig(max_prompt_length=limit, overlong="drop"))
    assert len(built.overlong) == n_over > 0
    assert built.metrics()["verl/overlong_dropped"] == n_over
    assert len(built.data) == len(transitions) - n_over
    assert built.data.batch["prompts"].shape[1] == limit  # fixed width = the configured limit, nothing cut
    assert all(len(t.prompt_ids) <= limit for t in built.transitions)


def test_missing_logprobs_are_refused_unless_recomputed(samples: list[Any]) -> None:
    transitions = _transitions(samples)
    transitions[0].response_logprobs = None
    with pytest.raises(ValueError, match="sampled logprobs"):
        transitions_to_dataproto(transitions)
    built = transitions_to_dataproto(transitions, BatchConfig(require_logprobs=False))
    assert "rollout_log_probs" not in built.data.batch.keys()
    assert torch.equal(built.data.batch["token_level_scores"], built.data.batch["token_level_rewards"])
