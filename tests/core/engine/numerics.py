"""How closely the engine's logprobs must match a trainer's full forward pass, and why.

The engine computes a token's logits in a forward pass whose shape depends on what else is running
(a left-padded batch of ``B`` rows, decoded one column at a time); a trainer recomputes them in one
unpadded full-sequence pass. float32 matmuls and attention reductions of other shapes round
differently (on a 2-core Xeon with AVX-512, ``F.linear`` of 8 rows already differs from the same
rows one at a time in the last bits), so the numbers agree only up to rounding; a batch of one is
bit-identical to a request alone. ``benchmarks/engine_numerics.py`` measures it for the tiny model
over batch sizes 1..64 with 1 and 2 torch threads (see benchmarks/README.md):

    uv run python benchmarks/engine_numerics.py

Two consequences, and the constants the tests use for them:

* Logprobs differ by at most 1.9e-6 (batched vs one at a time, and vs the full forward pass).
  ``LOGPROB_ATOL`` is 1e-4, 50x that, so other CPUs' kernels fit while a wrong position, mask,
  temperature or weight version (differences of 1e-2 and more) still fails.
* The top-p cut is discontinuous. A token is kept iff the probability mass before it (in sorted
  order) is ``< top_p``; rounding moves that mass too, by at most 5.4e-7 (``CUT_SLACK`` is 1e-5,
  20x that), so a token whose preceding mass is that close to ``top_p`` can fall on either side.
  Then every kept token's logprob moves by about that token's probability (5.1e-4 for the tiny
  model, whose distributions are nearly flat): far beyond rounding. The engine's inverse-CDF sampler
  may then also pick another token from the same uniform draw (measured: probability 0.16 to 0.28 at
  such a position); elsewhere a sampled token differs with probability ~3e-6 per position. Such
  positions are rare (1 or 2 of 1,280 distinct positions vs the full forward pass in the measurement),
  but which ones depends on the CPU's kernels: on a 2-core Xeon with AVX-512 one of the 160
  tokens of ``test_concurrent_requests_share_a_batch_and_match_sequential`` had a logprob 5.2e-4
  apart batched and alone. So the tests accept, at a position whose cut is uncertain by
  ``CUT_SLACK``, the logprob under the other cut, and let two runs of one seeded request part there
  (and nowhere else).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from lightning_rl.engine import sampled_logprobs
from lightning_rl.engine.hf import TransformersEngine

__all__ = [
    "CUT_SLACK",
    "LOGPROB_ATOL",
    "assert_logprobs_close",
    "assert_logprobs_match",
    "cut_is_uncertain",
    "predicting_logits",
]

LOGPROB_ATOL = 1e-4
"""Rounding allowed between two computations of one logprob (measured max 1.9e-6, see above)."""

CUT_SLACK = 1e-5
"""How far rounding may move the probability mass before the k-th most likely token (measured max
5.4e-7, see above)."""


def predicting_logits(model: Any, prompt: Sequence[int], completion: Sequence[int]) -> torch.Tensor:
    """What a trainer computes: one unpadded full-sequence forward pass of ``model``, the logits
    ``[T, V]`` that predicted each of ``completion``'s tokens."""
    with torch.no_grad():
        logits = model(torch.tensor([[*prompt, *completion]])).logits[0]
    return logits[len(prompt) - 1 : len(prompt) + len(completion) - 1].float()


def _nucleus_sizes(logits: torch.Tensor, temperature: float, top_p: float) -> tuple[torch.Tensor, torch.Tensor, range]:
    """The scaled logits sorted as the top-p cut sorts them, that order, and every nucleus size the
    cut can give once the mass before each token may be off by ``CUT_SLACK``."""
    scaled = logits.float() / temperature
    sorted_scaled, order = torch.sort(scaled, descending=True, stable=True)
    probs = torch.softmax(sorted_scaled, dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs
    smallest = max(1, int((before < top_p - CUT_SLACK).sum()))
    largest = max(1, int((before < top_p + CUT_SLACK).sum()))
    return sorted_scaled, order, range(smallest, largest + 1)


def cut_is_uncertain(logits: torch.Tensor, temperature: float, top_p: float) -> bool:
    """Whether rounding can move a token across the top-p cut of the distribution ``logits`` ``[V]``."""
    if temperature <= 0 or top_p >= 1:
        return False
    return len(_nucleus_sizes(logits, temperature, top_p)[2]) > 1


def _logprob_options(logits: torch.Tensor, token: int, temperature: float, top_p: float) -> list[float]:
    """The logprobs ``token`` has under each nucleus the uncertain cut can give (``-inf`` where the
    nucleus leaves it out: a trainer's recomputation may do that to a token the engine sampled)."""
    sorted_scaled, order, sizes = _nucleus_sizes(logits, temperature, top_p)
    rank = int((order == token).nonzero()[0, 0])
    norms = torch.logcumsumexp(sorted_scaled, dim=-1)
    return [float(sorted_scaled[rank] - norms[size - 1]) if rank < size else -math.inf for size in sizes]


def _close(got: float, want: float) -> bool:
    return got == want or abs(got - want) <= LOGPROB_ATOL


def assert_logprobs_close(
    logits: torch.Tensor, completion: Sequence[int], logprobs: Sequence[float], temperature: float, top_p: float
) -> None:
    """``logprobs`` of ``completion`` equal those from ``logits`` ``[T, V]`` within ``LOGPROB_ATOL``.

    At a position whose top-p cut is uncertain (see the module docstring) the side that computed
    ``logprobs`` may have put the boundary token on the other side: its logprob must then equal the
    one under that nucleus (``-inf`` if that nucleus leaves the token out).
    """
    assert len(logprobs) == len(completion) == logits.shape[0]
    expected = sampled_logprobs(logits, torch.tensor(completion), temperature, top_p).tolist()
    for position, (got, want) in enumerate(zip(logprobs, expected, strict=True)):
        if _close(got, want):
            continue
        options: list[float] = []
        if cut_is_uncertain(logits[position], temperature, top_p):
            options = _logprob_options(logits[position], completion[position], temperature, top_p)
        assert any(_close(got, option) for option in options), (
            f"position {position}: logprob {got} is not the full forward pass's {want} "
            f"(nor one of {options}, the values under an uncertain top-p cut)"
        )


def assert_logprobs_match(
    engine: TransformersEngine,
    prompt: Sequence[int],
    completion: Sequence[int],
    logprobs: Sequence[float],
    temperature: float,
    top_p: float,
) -> None:
    """The engine's ``logprobs`` of ``completion`` are the trainer's (``assert_logprobs_close``)."""
    logits = predicting_logits(engine.model, prompt, completion)
    assert_logprobs_close(logits, completion, logprobs, temperature, top_p)
