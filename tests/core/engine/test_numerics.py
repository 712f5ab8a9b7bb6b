"""The engine tests' logprob check forgives rounding and a top-p cut that rounding can move, nothing else."""

from __future__ import annotations

import math

import pytest
import torch

from .numerics import CUT_SLACK, LOGPROB_ATOL, assert_logprobs_close, cut_is_uncertain

PROBS = [0.5, 0.3, 0.15, 0.05]  # token 2 has 0.8 of mass before it: kept iff top_p > 0.8
LOGITS = torch.tensor([[math.log(p) for p in PROBS]])
KEEP_2 = math.log(0.5 / 0.95)  # token 0's logprob when tokens 0-2 are kept
DROP_2 = math.log(0.5 / 0.8)  # ... and when only tokens 0-1 are


def test_a_cut_within_rounding_accepts_either_side_and_nothing_more() -> None:
    top_p = 0.8 + CUT_SLACK / 10
    assert cut_is_uncertain(LOGITS[0], 1.0, top_p)
    assert_logprobs_close(LOGITS, [0], [KEEP_2], 1.0, top_p)  # as computed
    assert_logprobs_close(LOGITS, [0], [DROP_2 + LOGPROB_ATOL / 2], 1.0, top_p)  # token 2 fell out
    with pytest.raises(AssertionError, match="uncertain top-p cut"):
        assert_logprobs_close(LOGITS, [0], [DROP_2 + 3 * LOGPROB_ATOL], 1.0, top_p)
    # The token on the boundary itself: its logprob, or -inf from a side that cut it out.
    kept = math.log(0.15 / 0.95)
    assert_logprobs_close(LOGITS, [2], [kept], 1.0, top_p)
    assert_logprobs_close(LOGITS, [2], [-math.inf], 1.0, top_p)
    with pytest.raises(AssertionError):
        assert_logprobs_close(LOGITS, [2], [kept + 3 * LOGPROB_ATOL], 1.0, top_p)


def test_a_cut_beyond_rounding_is_exact() -> None:
    top_p = 0.8 + 10 * CUT_SLACK
    assert not cut_is_uncertain(LOGITS[0], 1.0, top_p)
    assert_logprobs_close(LOGITS, [0], [KEEP_2 - LOGPROB_ATOL / 2], 1.0, top_p)
    with pytest.raises(AssertionError):
        assert_logprobs_close(LOGITS, [0], [DROP_2], 1.0, top_p)
    with pytest.raises(AssertionError):
        assert_logprobs_close(LOGITS, [2], [-math.inf], 1.0, top_p)
    # Without top-p there is no cut to move.
    assert not cut_is_uncertain(LOGITS[0], 1.0, 1.0) and not cut_is_uncertain(LOGITS[0], 0.0, 0.8)
