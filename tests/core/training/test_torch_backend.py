"""The torch policy backend on the real tiny model: logprob parity with the engine, exact gradient
accumulation, updates that move the policy the right way, publishing, checkpoints."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from lightning_rl.backends.torch_backend import TorchBackend, TorchBackendConfig, pack_micro_batches
from lightning_rl.engine.base import SamplingParams
from lightning_rl.engine.hf import TransformersEngine
from lightning_rl.types import Transition

from ..engine.numerics import assert_logprobs_close, predicting_logits


def _policy(path: Path, **cfg: object) -> TorchBackend:
    model = AutoModelForCausalLM.from_pretrained(path)
    return TorchBackend(model, TorchBackendConfig(**cfg))  # type: ignore[arg-type]


async def _sample(path: Path, n: int, temperature: float, top_p: float = 1.0) -> list[Transition]:
    out: list[Transition] = []
    with TransformersEngine.from_pretrained(path, max_batch_size=8) as engine:
        prompts = [engine.encode_chat([{"role": "user", "content": f"What is {i} + {i}?"}], None) for i in range(n)]
        import asyncio

        results = await asyncio.gather(
            *(
                engine.generate(p, SamplingParams(max_tokens=12, temperature=temperature, top_p=top_p, seed=i))
                for i, p in enumerate(prompts)
            )
        )
        for i, (p, r) in enumerate(zip(prompts, results, strict=True)):
            out.append(
                Transition(
                    prompt_ids=p,
                    response_ids=r.token_ids,
                    response_logprobs=r.logprobs,
                    rollout_id=f"r{i}",
                    attempt_id="a",
                    model_version=r.model_version,
                )
            )
    return out


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 1.0), (0.8, 0.9)])
async def test_engine_and_trainer_logprobs_agree(tiny_model_path: Path, temperature: float, top_p: float) -> None:
    transitions = await _sample(tiny_model_path, 6, temperature, top_p)
    policy = _policy(tiny_model_path, temperature=temperature, top_p=top_p)
    recomputed = policy.logprobs(transitions)
    for t, ours in zip(transitions, recomputed, strict=True):
        assert t.response_logprobs is not None and len(ours) == len(t.response_ids) > 0
        assert all(math.isfinite(a) for a in t.response_logprobs)
        # Both are a full forward pass's values up to float32 rounding (engine and trainer run other
        # shapes); where rounding moves a token across the top-p cut, either may have it on the other
        # side (the trainer then gives -inf). Tolerances and why: tests/core/engine/numerics.py,
        # measured by `uv run python benchmarks/engine_numerics.py`.
        logits = predicting_logits(policy.model, t.prompt_ids, t.response_ids)
        assert_logprobs_close(logits, t.response_ids, t.response_logprobs, temperature, top_p)
        assert_logprobs_close(logits, t.response_ids, ours, temperature, top_p)


def _fixed_batch(n: int = 6) -> list[Transition]:
    gen = torch.Generator().manual_seed(0)
    out: list[Transition] = []
    for i in range(n):
        p = torch.randint(10, 500, (5 + 3 * i,), generator=gen).tolist()
        r = torch.randint(10, 500, (2 + i,), generator=gen).tolist()
        out.append(
            Transition(
                prompt_ids=p, response_ids=r, rollout_id=f"r{i % 3}", attempt_id="a", advantage=1.0 if i % 2 else -1.0
            )
        )
    return out


@pytest.mark.parametrize("aggregation", ["token", "transition", "rollout"])
def test_gradient_accumulation_is_exact_whatever_the_micro_batch_size(tiny_model_path: Path, aggregation: str) -> None:
    batch = _fixed_batch()
    grads: list[list[torch.Tensor]] = []
    for budget in (10_000, 24):  # one micro-batch versus one sequence per micro-batch
        policy = _policy(
            tiny_model_path, old_logprobs="recompute", micro_batch_tokens=budget, loss_aggregation=aggregation, lr=0.0
        )
        policy.update(batch)
        grads.append([p.grad.clone() for p in policy.model.parameters() if p.grad is not None])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def _prefixed_batch(n: int = 6, prefix: int = 40) -> list[Transition]:
    """Prompts that share their first ``prefix`` tokens (an agent's system prompt), then differ in length."""
    gen = torch.Generator().manual_seed(1)
    common = torch.randint(10, 500, (prefix,), generator=gen).tolist()
    out: list[Transition] = []
    for i in range(n):
        p = common + torch.randint(10, 500, (2 + 3 * i,), generator=gen).tolist()
        r = torch.randint(10, 500, (2 + i,), generator=gen).tolist()
        out.append(
            Transition(
                prompt_ids=p, response_ids=r, rollout_id=f"r{i % 3}", attempt_id="a", advantage=1.0 if i % 2 else -1.0
            )
        )
    return out


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_a_shared_prompt_prefix_run_once_gives_the_same_logprobs_and_gradients(
    tiny_model_path: Path, lora_rank: int
) -> None:
    """``shared_prefix``: the common prefix runs once and its keys/values serve every row (padded rows of
    other lengths included); logprobs and gradients are those of running every sequence whole."""
    batch = _prefixed_batch()
    logprobs: list[list[list[float]]] = []
    grads: list[list[torch.Tensor]] = []
    for shared in (0, 16):
        policy = _policy(
            tiny_model_path, old_logprobs="recompute", shared_prefix=shared, lora_rank=lora_rank, lr=0.0, seed=3
        )
        mb = pack_micro_batches([(t.prompt_ids, t.response_ids) for t in batch], 10_000, policy.pad_token_id)[0]
        assert policy.shared_prefix_len(mb) == (0 if shared == 0 else 40)
        logprobs.append(policy.logprobs(batch))
        policy.update(batch)
        grads.append([p.grad.clone() for p in policy.model.parameters() if p.grad is not None])
    for a, b in zip(*logprobs, strict=True):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-5, atol=1e-5)
    assert len(grads[0]) == len(grads[1]) > 0
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_two_agents_requests_in_one_batch_each_share_their_own_prefix(tiny_model_path: Path) -> None:
    """A batch mixing two system prompts (a planner's and an answerer's): with ``shared_prefix`` each
    agent's rows go to their own micro-batches, each prefix runs once, and the SFT loss and gradients
    are those of running every sequence whole."""
    gen = torch.Generator().manual_seed(2)
    prefixes = [torch.randint(10, 500, (30,), generator=gen).tolist() for _ in range(2)]
    examples = [
        (prefixes[i % 2] + torch.randint(10, 500, (3 + i,), generator=gen).tolist(), [11 + i, 12, 13]) for i in range(8)
    ]
    losses: list[list[float]] = []
    grads: list[list[torch.Tensor]] = []
    for shared in (0, 24):
        policy = _policy(tiny_model_path, shared_prefix=shared, lr=1e-3, seed=3)
        if shared:
            mbs = policy._pack(examples)  # pyright: ignore[reportPrivateUsage]
            assert len(mbs) == 2 and [policy.shared_prefix_len(mb) for mb in mbs] == [30, 30]
        losses.append(policy.sft(examples, steps=1, batch_size=8))
        grads.append([p.grad.clone() for p in policy.model.parameters() if p.grad is not None])
    torch.testing.assert_close(torch.tensor(losses[0]), torch.tensor(losses[1]), rtol=1e-5, atol=1e-6)
    assert len(grads[0]) == len(grads[1]) > 0
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_no_shared_prefix_below_the_minimum_or_past_the_shortest_prompt(tiny_model_path: Path) -> None:
    policy = _policy(tiny_model_path, shared_prefix=41)  # the batch shares 40 tokens: not enough
    batch = _prefixed_batch()
    mb = pack_micro_batches([(t.prompt_ids, t.response_ids) for t in batch], 10_000, policy.pad_token_id)[0]
    assert policy.shared_prefix_len(mb) == 0
    same = [Transition(prompt_ids=[5, 6, 7, 8], response_ids=[9], rollout_id=f"r{i}", attempt_id="a") for i in range(3)]
    policy = _policy(tiny_model_path, shared_prefix=2)
    mb = pack_micro_batches([(t.prompt_ids, t.response_ids) for t in same], 10_000, policy.pad_token_id)[0]
    assert policy.shared_prefix_len(mb) == 3  # identical prompts: all but the last prompt token
    with pytest.raises(ValueError, match="shared_prefix"):
        TorchBackendConfig(shared_prefix=-1)


def test_update_raises_the_likelihood_of_advantaged_responses(tiny_model_path: Path) -> None:
    batch = _fixed_batch()
    policy = _policy(tiny_model_path, old_logprobs="recompute", lr=1e-3)
    before = policy.logprobs(batch)
    metrics = policy.update(batch)
    after = policy.logprobs(batch)
    for t, b, a in zip(batch, before, after, strict=True):
        delta = sum(a) - sum(b)
        assert (delta > 0) == (t.advantage > 0), (t.advantage, delta)
    assert metrics["train/optimizer_steps"] == 1.0
    assert metrics["train/ratio"] == pytest.approx(1.0, abs=1e-5)  # recomputed old logprobs: on-policy


def test_sampled_old_logprobs_are_required_and_checked(tiny_model_path: Path) -> None:
    policy = _policy(tiny_model_path, old_logprobs="sampled")
    with pytest.raises(ValueError, match="sampled logprobs"):
        policy.update(_fixed_batch())
    bad = _fixed_batch()[:1]
    bad[0].response_logprobs = [0.0]
    with pytest.raises(ValueError, match="logprobs for"):
        policy.update(bad)


def test_kl_to_reference_is_zero_before_the_first_step_and_grows_after(tiny_model_path: Path) -> None:
    batch = _fixed_batch()
    policy = _policy(tiny_model_path, old_logprobs="recompute", kl_coef=0.1, lr=1e-2, mini_batches=2)
    first = policy.update(batch)
    second = policy.update(batch)
    assert first["train/optimizer_steps"] == 2.0
    assert second["train/kl"] > 0.0


async def test_publish_swaps_weights_into_the_engine_and_bumps_the_version(tiny_model_path: Path) -> None:
    with TransformersEngine.from_pretrained(tiny_model_path, max_batch_size=4) as engine:
        policy = TorchBackend(
            AutoModelForCausalLM.from_pretrained(tiny_model_path),
            TorchBackendConfig(old_logprobs="recompute", lr=1e-2),
            publisher=engine.load_weights,
            version=engine.version,
        )
        prompt = engine.encode_chat([{"role": "user", "content": "hi"}], None)
        before = await engine.generate(prompt, SamplingParams(max_tokens=4, temperature=1.0, seed=1))
        policy.update(_fixed_batch())
        version = await policy.publish()
        after = await engine.generate(prompt, SamplingParams(max_tokens=4, temperature=1.0, seed=1))
        assert version == before.model_version + 1 == after.model_version
        t = Transition(prompt_ids=prompt, response_ids=after.token_ids, rollout_id="r", attempt_id="a")
        assert policy.logprobs([t])[0] == pytest.approx(after.logprobs, abs=1e-4)


def test_checkpoint_resume_restores_weights_optimizer_and_version(tiny_model_path: Path, tmp_path: Path) -> None:
    batch = _fixed_batch()
    a = _policy(tiny_model_path, old_logprobs="recompute", lr=1e-3)
    a.update(batch)
    a.version = 7
    a.save_checkpoint(tmp_path)
    b = _policy(tiny_model_path, old_logprobs="recompute", lr=1e-3)
    b.load_checkpoint(tmp_path)
    assert b.version == 7 and b.step == 1
    a.update(batch)
    b.update(batch)
    for pa, pb in zip(a.model.parameters(), b.model.parameters(), strict=True):
        torch.testing.assert_close(pa, pb)
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        b.load_checkpoint(tmp_path / "missing")


def test_bad_config_is_rejected() -> None:
    with pytest.raises(ValueError, match="old_logprobs"):
        TorchBackendConfig(old_logprobs="guess")
    with pytest.raises(ValueError, match="mini_batches"):
        TorchBackendConfig(mini_batches=0)
