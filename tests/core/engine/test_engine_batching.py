"""Dynamic batching, streaming, cancellation and weight swaps under concurrent traffic."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from lightning_rl.engine import SamplingParams
from lightning_rl.engine.base import GenerationOutput
from lightning_rl.engine.hf import TransformersEngine

from .numerics import LOGPROB_ATOL, assert_logprobs_match, cut_is_uncertain, predicting_logits
from .test_engine_generate import reference_logprobs


@pytest.fixture
def fresh(tiny_path: Path) -> Iterator[TransformersEngine]:
    """A private engine for tests that swap weights or count scheduler events."""
    with TransformersEngine.from_pretrained(tiny_path, max_batch_size=8, batch_wait_s=0.02) as engine:
        yield engine


def prompts(engine: TransformersEngine, n: int) -> list[list[int]]:
    words = "one two three four five six seven eight nine ten".split()
    return [engine.encode_chat([{"role": "user", "content": " ".join(words[: i + 1])}], None) for i in range(n)]


async def test_concurrent_requests_share_a_batch_and_match_sequential(
    tiny_path: Path, engine: TransformersEngine
) -> None:
    # A long arrival window makes "one batch" deterministic; the scheduler stops waiting once 8 are in.
    with TransformersEngine.from_pretrained(tiny_path, max_batch_size=8, batch_wait_s=2.0) as batched:
        batch = prompts(batched, 8)  # different lengths: left padding is exercised
        params = [SamplingParams(max_tokens=20, temperature=0.8, top_p=0.95, seed=i) for i in range(8)]
        together = await asyncio.gather(*(batched.generate(p, s) for p, s in zip(batch, params, strict=True)))
        stats = batched.stats()
        assert stats.prefill_sizes == [8] and stats.peak_batch == 8 and stats.finished == 8
    # The same requests one at a time, on another engine over the same weights.
    alone = [await engine.generate(p, s) for p, s in zip(batch, params, strict=True)]
    for ids, a, b in zip(batch, together, alone, strict=True):
        # Both equal the trainer's full forward pass up to float32 rounding, so each other as well:
        # batched and alone run matmuls of other shapes, which round differently. At the rare position
        # where rounding moves a token across the top-p cut, the engine's value is the one with that
        # token on its side of the cut. Tolerances and why: numerics.py, measured by
        # `uv run python benchmarks/engine_numerics.py`.
        assert_logprobs_match(engine, ids, a.token_ids, a.logprobs, 0.8, 0.95)
        assert_logprobs_match(engine, ids, b.token_ids, b.logprobs, 0.8, 0.95)
        # Same seed, same tokens: a different token is only possible where the draw met a cut that
        # rounding made uncertain (then the two completions part there and are each checked above).
        if a.token_ids != b.token_ids:
            parted = next((i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids, strict=False)) if x != y), None)
            assert parted is not None, "one completion stopped early without sampling another token"
            logits = predicting_logits(engine.model, ids, a.token_ids[: parted + 1])[parted]
            assert cut_is_uncertain(logits, 0.8, 0.95), f"batched and alone sampled different tokens at {parted}"
        assert engine.decode(a.token_ids) == a.text


async def test_requests_join_a_running_batch(fresh: TransformersEngine) -> None:
    """Continuous batching: later arrivals join between decode steps and their logprobs stay exact."""
    batch = prompts(fresh, 5)
    long_stream = fresh.stream(batch[0], SamplingParams(max_tokens=200, seed=0))
    first = await anext(long_stream)
    late = [fresh.generate(p, SamplingParams(max_tokens=10, seed=i, temperature=0.7)) for i, p in enumerate(batch[1:])]
    outs = await asyncio.gather(*late)
    rest = [delta async for delta in long_stream]
    assert rest[-1].finish_reason == "length"
    assert len(first.token_ids) + sum(len(d.token_ids) for d in rest) == 200
    stats = fresh.stats()
    # The late four joined the running stream (in one prefill, or a few if they arrived between steps).
    assert stats.peak_batch == 5 and stats.prefill_sizes[0] == 1 and sum(stats.prefill_sizes[1:]) == 4
    for ids, out in zip(batch[1:], outs, strict=True):
        reference = reference_logprobs(fresh, ids, out.token_ids, 0.7, 1.0)
        assert torch.allclose(torch.tensor(out.logprobs), reference, atol=LOGPROB_ATOL, rtol=0)


async def test_more_requests_than_slots_wait_their_turn(tiny_path: Path) -> None:
    with TransformersEngine.from_pretrained(tiny_path, max_batch_size=3, batch_wait_s=0.02) as engine:
        outs = await asyncio.gather(
            *(engine.generate(p, SamplingParams(max_tokens=8, seed=1)) for p in prompts(engine, 7))
        )
        assert all(len(o.token_ids) == 8 for o in outs)
        stats = engine.stats()
        assert stats.peak_batch == 3 and stats.finished == 7 and stats.running == 0 and stats.waiting == 0


async def test_stream_matches_generate(engine: TransformersEngine) -> None:
    ids = prompts(engine, 3)[2]
    for stop in ([], ["e", "th"]):
        params = SamplingParams(max_tokens=40, seed=5, temperature=0.9, stop=stop)
        whole = await engine.generate(ids, params)
        deltas = [d async for d in engine.stream(ids, params)]
        assert [t for d in deltas for t in d.token_ids] == whole.token_ids
        assert [lp for d in deltas for lp in d.logprobs] == whole.logprobs
        assert "".join(d.text for d in deltas) == whole.text
        assert deltas[-1].finish_reason == whole.finish_reason
        assert all(d.finish_reason is None for d in deltas[:-1])
        if stop:
            assert all(s not in d.text for d in deltas for s in stop)


async def test_cancelling_a_stream_frees_its_slot(tiny_path: Path) -> None:
    with TransformersEngine.from_pretrained(tiny_path, max_batch_size=1) as engine:
        ids = prompts(engine, 1)[0]
        stream = engine.stream(ids, SamplingParams(max_tokens=2000, seed=0))
        await anext(stream)
        await anext(stream)
        await stream.aclose()
        # With one slot, this only finishes if the cancelled stream gave its slot back.
        out = await asyncio.wait_for(engine.generate(ids, SamplingParams(max_tokens=5)), timeout=20)
        assert len(out.token_ids) == 5
        stats = engine.stats()
        assert stats.cancelled == 1 and stats.running == 0


async def test_cancelling_a_generate_task_frees_its_slot(tiny_path: Path) -> None:
    with TransformersEngine.from_pretrained(tiny_path, max_batch_size=1) as engine:
        ids = prompts(engine, 1)[0]
        task = asyncio.create_task(engine.generate(ids, SamplingParams(max_tokens=2000, seed=0)))
        while engine.stats().running == 0:
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        out = await asyncio.wait_for(engine.generate(ids, SamplingParams(max_tokens=5)), timeout=20)
        assert len(out.token_ids) == 5 and engine.stats().cancelled == 1


def perturbed(engine: TransformersEngine, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {k: v + 0.05 * torch.randn(v.shape, generator=generator) for k, v in engine.model.state_dict().items()}


async def test_weight_swap_during_traffic(fresh: TransformersEngine) -> None:
    weights = {0: {k: v.clone() for k, v in fresh.model.state_dict().items()}}
    weights[1], weights[2] = perturbed(fresh, 1), perturbed(fresh, 2)
    batch = prompts(fresh, 6)

    trained = asyncio.Event()

    async def client(i: int) -> list[tuple[list[int], GenerationOutput]]:
        """Send requests back to back until the trainer is done, then one more."""
        results: list[tuple[list[int], GenerationOutput]] = []
        while not trained.is_set() or not results or results[-1][1].model_version != 2:
            ids = batch[(i + len(results)) % len(batch)]
            params = SamplingParams(max_tokens=6 + i, seed=i * 100 + len(results))
            results.append((ids, await fresh.generate(ids, params)))
        return results

    async def trainer() -> None:
        for version in (1, 2):
            await asyncio.sleep(0.05)
            await fresh.load_weights(weights[version], version)
            assert fresh.version == version
        trained.set()

    *per_client, _ = await asyncio.gather(*(client(i) for i in range(6)), trainer())
    results = [r for rs in per_client for r in rs]
    versions = {out.model_version for _, out in results}
    assert fresh.stats().failed == 0 and versions <= {0, 1, 2} and 2 in versions and len(versions) >= 2
    for per in per_client:  # each client sees versions only move forward
        assert [out.model_version for _, out in per] == sorted(out.model_version for _, out in per)
    # Each output's logprobs are those of the weights it names: one version per completion.
    for version in sorted(versions):
        fresh.model.load_state_dict(weights[version])
        for ids, out in (r for r in results if r[1].model_version == version):
            reference = reference_logprobs(fresh, ids, out.token_ids, 1.0, 1.0)
            assert torch.allclose(torch.tensor(out.logprobs), reference, atol=LOGPROB_ATOL, rtol=0)
    fresh.model.load_state_dict(weights[2])
    after = await fresh.generate(batch[0], SamplingParams(max_tokens=3))
    assert after.model_version == 2


async def test_load_weights_validation_and_tied_keys(fresh: TransformersEngine) -> None:
    state = {k: v.clone() for k, v in fresh.model.state_dict().items()}
    with pytest.raises(ValueError, match="does not have"):
        await fresh.load_weights({**state, "nope.weight": torch.zeros(1)}, 1)
    with pytest.raises(ValueError, match="missing"):
        await fresh.load_weights({k: v for k, v in state.items() if "layers.0." not in k}, 1)
    shape_key = next(iter(state))
    with pytest.raises(ValueError, match="shape"):
        await fresh.load_weights({**state, shape_key: torch.zeros(3)}, 1)
    # Tied embeddings: the output projection may be left out (safetensors files do so).
    tied = {k: v for k, v in state.items() if k != "lm_head.weight"}
    assert "lm_head.weight" in state
    await fresh.load_weights(tied, 5)
    assert fresh.version == 5 and fresh.stats().version == 5


async def test_closed_engine_rejects_requests(tiny_path: Path) -> None:
    engine = TransformersEngine.from_pretrained(tiny_path)
    engine.close()
    with pytest.raises(RuntimeError, match="closed"):
        await engine.generate([1, 2], SamplingParams())
