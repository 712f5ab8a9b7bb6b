"""Policy-gradient losses on per-token tensors (torch).

All functions take per-token tensors of one micro-batch plus per-token ``weights`` that already
encode the loss aggregation (see ``token_weights``), so the summed loss of any split of a batch
into micro-batches equals the loss of the whole batch: gradient accumulation is exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

__all__ = [
    "LossAggregation",
    "PPOTerms",
    "token_weights",
    "ppo_clip_loss",
    "kl_k3",
    "token_entropy",
    "sft_loss",
    "PreferenceLoss",
    "PreferenceTerms",
    "preference_loss",
]

LossAggregation = Literal["token", "transition", "rollout"]
PreferenceLoss = Literal["sigmoid", "ipo"]


def token_weights(lengths: Sequence[int], rollout_ids: Sequence[str], aggregation: LossAggregation) -> list[float]:
    """Per-token weight of each sample so that ``sum(weight * token_loss)`` is the aggregated loss.

    ``token``: mean over every response token of the batch (long responses weigh more);
    ``transition``: mean over transitions of each transition's token mean;
    ``rollout``: mean over rollouts of the mean over its transitions of the token mean.
    """
    if len(lengths) != len(rollout_ids):
        raise ValueError("lengths and rollout_ids must have the same length.")
    if any(n <= 0 for n in lengths):
        raise ValueError("every sample needs at least one response token.")
    if aggregation == "token":
        total = sum(lengths)
        return [1.0 / total] * len(lengths)
    if aggregation == "transition":
        return [1.0 / (n * len(lengths)) for n in lengths]
    if aggregation == "rollout":
        per_rollout: dict[str, int] = {}
        for r in rollout_ids:
            per_rollout[r] = per_rollout.get(r, 0) + 1
        n_rollouts = len(per_rollout)
        return [1.0 / (n * per_rollout[r] * n_rollouts) for n, r in zip(lengths, rollout_ids, strict=True)]
    raise ValueError(f"unknown loss aggregation {aggregation!r}; use 'token', 'transition' or 'rollout'.")


@dataclass
class PPOTerms:
    """Weighted sums over the micro-batch (add them up across micro-batches)."""

    loss: torch.Tensor
    pg_loss: torch.Tensor
    kl: torch.Tensor
    clip_frac: torch.Tensor
    ratio: torch.Tensor


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(policy || reference): ``exp(d) - d - 1`` with ``d = ref - logp``.

    Non-negative, unbiased, and low-variance (Schulman's "approximating KL divergence")."""
    d = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
    return torch.exp(d) - d - 1.0


def token_entropy(logprobs: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of each distribution given as ``[..., V]`` log-probabilities: ``-sum(p log p)``.

    Tokens outside a top-p nucleus have logprob ``-inf`` and probability 0; they contribute 0
    (``0 * -inf`` would be NaN), so this is the entropy of the distribution actually sampled from."""
    p = logprobs.exp()
    return -(p * logprobs.masked_fill(~torch.isfinite(logprobs), 0.0)).sum(-1)


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> PPOTerms:
    """PPO-clip with asymmetric clip range on flat per-token tensors (all the same shape).

    ``loss = sum(w * max(-A * r, -A * clip(r, 1 - clip_low, 1 + clip_high))) + kl_coef * sum(w * kl)``
    where ``r = exp(logp - old_logp)``. With ``old == logp`` this is the GRPO/REINFORCE gradient.
    """
    ratio = torch.exp((logprobs - old_logprobs).clamp(-20.0, 20.0))
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    pg_loss = (weights * per_token).sum()
    if ref_logprobs is not None and kl_coef > 0.0:
        kl = (weights * kl_k3(logprobs, ref_logprobs)).sum()
    else:
        kl = logprobs.new_zeros(())
    loss = pg_loss + kl_coef * kl
    with torch.no_grad():
        clip_frac = (weights * (clipped > unclipped).to(weights.dtype)).sum()
        ratio_mean = (weights * ratio).sum()
    return PPOTerms(loss=loss, pg_loss=pg_loss.detach(), kl=kl.detach(), clip_frac=clip_frac, ratio=ratio_mean)


def sft_loss(logprobs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted negative log-likelihood of the response tokens."""
    return -(weights * logprobs).sum()


@dataclass
class PreferenceTerms:
    """A preference loss and its diagnostics, weighted sums over the pairs (``loss`` carries the graph)."""

    loss: torch.Tensor
    margin: torch.Tensor
    """``h``: chosen minus rejected log-ratio to the reference (before ``beta``)."""
    accuracy: torch.Tensor
    """Weight of the pairs with ``h > 0``: the implicit reward already ranks them right."""
    chosen: torch.Tensor
    """Chosen log-ratio ``logp - ref_logp``."""
    rejected: torch.Tensor


def preference_loss(
    chosen_logprobs: torch.Tensor,
    rejected_logprobs: torch.Tensor,
    ref_chosen_logprobs: torch.Tensor,
    ref_rejected_logprobs: torch.Tensor,
    weights: torch.Tensor,
    *,
    beta: float = 0.1,
    loss: PreferenceLoss = "sigmoid",
) -> PreferenceTerms:
    """DPO (``sigmoid``) or IPO (``ipo``) on per-pair sequence logprobs (all shape ``[pairs]``).

    With ``h = (logp_c - ref_c) - (logp_r - ref_r)``:

    * ``sigmoid`` (Rafailov et al., DPO): ``-log sigmoid(beta * h)`` — the Bradley-Terry likelihood
      of the preference under the implicit reward ``beta * log(pi / pi_ref)``;
    * ``ipo`` (Azar et al., IPO): ``(h - 1 / (2 beta))^2`` — regresses ``h`` to a fixed target, so a
      pair that is already separated stops pulling (DPO's loss keeps pushing ``h`` to infinity).

    ``loss = sum(weights * per_pair)``; pass ``1 / n_pairs`` for the mean. The sequence logprobs are
    whatever the caller sums (per call or per rollout, optionally divided by the token count).
    """
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}.")
    chosen = chosen_logprobs - ref_chosen_logprobs
    rejected = rejected_logprobs - ref_rejected_logprobs
    h = chosen - rejected
    if loss == "sigmoid":
        per_pair = -torch.nn.functional.logsigmoid(beta * h)
    elif loss == "ipo":
        per_pair = (h - 1.0 / (2.0 * beta)) ** 2
    else:
        raise ValueError(f"unknown preference loss {loss!r}; use 'sigmoid' (DPO) or 'ipo'.")
    with torch.no_grad():
        terms = {
            "margin": (weights * h).sum(),
            "accuracy": (weights * (h > 0).to(weights.dtype)).sum(),
            "chosen": (weights * chosen).sum(),
            "rejected": (weights * rejected).sum(),
        }
    return PreferenceTerms(loss=(weights * per_pair).sum(), **terms)
