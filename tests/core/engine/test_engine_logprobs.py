"""The sampling distribution shared by the engine and the trainer."""

from __future__ import annotations

import math

import torch

from lightning_rl.engine.logprobs import sampled_logprobs, sampling_logprobs


def test_temperature_scales_logits() -> None:
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    for temperature in (1.0, 0.7, 1.5):
        expected = torch.log_softmax(logits / temperature, dim=-1)
        assert torch.allclose(sampling_logprobs(logits, temperature), expected)


def test_greedy_uses_the_unscaled_distribution() -> None:
    logits = torch.randn(2, 20)
    assert torch.allclose(sampling_logprobs(logits, 0.0, top_p=0.1), torch.log_softmax(logits, dim=-1))


def test_top_p_keeps_the_nucleus_and_renormalises() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logp = sampling_logprobs(probs.log(), 1.0, top_p=0.8)
    # Mass before each token (sorted): 0, 0.5, 0.8, 0.95 -> tokens 0 and 1 kept (0.8 is not < 0.8).
    assert torch.isinf(logp[2:]).all()
    assert torch.allclose(logp[:2].exp(), torch.tensor([0.5, 0.3]) / 0.8)
    assert math.isclose(float(logp.exp().sum()), 1.0, rel_tol=1e-6)
    # The most likely token survives any top_p.
    assert torch.isfinite(sampling_logprobs(probs.log(), 1.0, top_p=1e-6))[0]
    assert torch.isinf(sampling_logprobs(probs.log(), 1.0, top_p=1e-6))[1:].all()


def test_top_p_one_keeps_every_token() -> None:
    logits = torch.tensor([[30.0, -30.0, -60.0]])
    assert torch.isfinite(sampling_logprobs(logits, 1.0, top_p=1.0)).all()


def test_per_row_parameters_equal_per_row_calls() -> None:
    logits = torch.randn(4, 64, generator=torch.Generator().manual_seed(1)) * 3
    temps, top_ps = [1.0, 0.7, 0.0, 1.3], [1.0, 0.9, 0.5, 0.6]
    batched = sampling_logprobs(logits, torch.tensor(temps), torch.tensor(top_ps))
    for row, (t, p) in enumerate(zip(temps, top_ps, strict=True)):
        assert torch.equal(batched[row], sampling_logprobs(logits[row], t, p))


def test_sampled_logprobs_gathers_and_has_gradients() -> None:
    logits = torch.randn(2, 5, 30, requires_grad=True)
    tokens = torch.randint(0, 30, (2, 5))
    values = sampled_logprobs(logits, tokens, 0.7, 1.0)
    assert values.shape == (2, 5) and values.dtype == torch.float32
    expected = torch.log_softmax(logits.detach() / 0.7, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(values.detach(), expected)
    values.sum().backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()


def test_half_precision_logits_are_computed_in_float32() -> None:
    logits = torch.randn(3, 40).to(torch.bfloat16)
    out = sampling_logprobs(logits, 0.7, 0.9)
    assert out.dtype == torch.float32
    assert torch.equal(out, sampling_logprobs(logits.float(), 0.7, 0.9))
