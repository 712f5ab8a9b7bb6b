"""The sampling distribution, defined once for the engine that samples and the trainer that learns.

Policy-gradient training compares the probability of a sampled token under the current policy with the
probability it had when it was sampled. Both numbers must come from the *same* distribution, or the
importance ratio is biased from the first step. The engine samples from, and reports logprobs of, the
distribution computed here; the trainer recomputes it from a full forward pass with the same function.

Definition (``temperature > 0``), for one position with logits ``l`` over the vocabulary:

1. ``z = float32(l) / temperature``;
2. ``p = softmax(z)``;
3. top-p (nucleus): if ``top_p < 1``, sort tokens by ``p`` descending (stable: ties keep vocabulary
   order) and keep token ``i`` iff the probability mass of the tokens *before* it in that order is
   ``< top_p`` (the most likely token is always kept); if ``top_p >= 1`` every token is kept;
4. renormalise over the kept set: ``logprob(i) = z_i - logsumexp(z over kept)`` for kept tokens and
   ``-inf`` for the others.

With ``temperature == 0`` the engine decodes greedily (argmax) and reports ``log_softmax(float32(l))``,
the unscaled distribution; ``top_p`` is ignored.

The top-p cut depends on the logits' exact values, so a token at the nucleus boundary may fall on the
other side when the trainer's logits differ from the engine's by rounding (another batch shape, another
kernel); such a token gets ``-inf`` from one side. This is rare and inherent to top-p; train with
``top_p = 1`` where exact parity matters more than tail truncation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["sampling_logprobs", "sampled_logprobs"]


def _as_column(value: float | torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A per-row parameter broadcastable against ``like`` of shape ``[..., V]``."""
    import torch

    tensor = torch.as_tensor(value, dtype=torch.float32, device=like.device)
    if tensor.dim() == 0:
        return tensor.expand(like.shape[:-1]).unsqueeze(-1)
    if tensor.shape != like.shape[:-1]:
        shape, expected = tuple(tensor.shape), tuple(like.shape)
        raise ValueError(f"a per-row parameter of shape {shape} does not match logits of shape {expected}")
    return tensor.unsqueeze(-1)


def sampling_logprobs(
    logits: torch.Tensor, temperature: float | torch.Tensor, top_p: float | torch.Tensor = 1.0
) -> torch.Tensor:
    """Log-probabilities of every token under the sampling distribution (see the module docstring).

    Args:
        logits: ``[..., V]`` raw model logits, any float dtype (computed in float32).
        temperature: a float, or a tensor of shape ``logits.shape[:-1]`` (one value per row); ``0`` means greedy.
        top_p: a float in ``(0, 1]``, or a per-row tensor like ``temperature``.

    Returns:
        ``[..., V]`` float32 log-probabilities; tokens outside the nucleus are ``-inf``.
    """
    import torch

    logits = logits.float()
    temp = _as_column(temperature, logits)
    nucleus = _as_column(top_p, logits)
    greedy = temp <= 0
    scaled = logits / torch.where(greedy, torch.ones_like(temp), temp)
    logp = torch.log_softmax(scaled, dim=-1)
    # Rows with top_p >= 1 (and greedy rows) keep every token; skip the sort when no row needs it.
    filtered = (nucleus < 1) & ~greedy
    if not bool(filtered.any()):
        return logp
    sorted_logp, order = torch.sort(logp, dim=-1, descending=True, stable=True)
    mass_before = torch.cumsum(sorted_logp.exp(), dim=-1) - sorted_logp.exp()
    keep_sorted = (mass_before < nucleus) | ~filtered
    keep_sorted[..., 0] = True
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    masked = scaled.masked_fill(~keep, float("-inf"))
    return torch.log_softmax(masked, dim=-1)


def sampled_logprobs(
    logits: torch.Tensor,
    token_ids: torch.Tensor,
    temperature: float | torch.Tensor,
    top_p: float | torch.Tensor = 1.0,
) -> torch.Tensor:
    """Log-probability of each chosen token under the sampling distribution.

    This is the quantity the engine reports per generated token: ``logits[..., t, :]`` are the logits
    that predicted ``token_ids[..., t]`` (for a causal LM, the output at the position *before* the token).
    Gradients flow through ``logits``, so the trainer can use it directly as the policy's log-likelihood.

    Args:
        logits: ``[..., V]`` logits.
        token_ids: ``[...]`` integer ids (same leading shape as ``logits``).
        temperature, top_p: as in ``sampling_logprobs``.

    Returns:
        ``[...]`` float32 log-probabilities.
    """
    logp = sampling_logprobs(logits, temperature, top_p)
    return logp.gather(-1, token_ids.long().unsqueeze(-1)).squeeze(-1)
