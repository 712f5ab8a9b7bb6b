"""Per-row LoRA adapters in the engine: rows of different adapters decoded in one batch give what
each adapter gives served alone, and rows of no adapter give the base model's numbers exactly."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from lightning_rl.engine import SamplingParams
from lightning_rl.engine.base import GenerationOutput
from lightning_rl.engine.hf import TransformersEngine
from lightning_rl.engine.lora import AdapterWeights
from lightning_rl.errors import InvalidRequestError

from .numerics import LOGPROB_ATOL

peft = pytest.importorskip("peft")

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
RANK, ALPHA = 4, 16


def _peft_model(tiny_path: Path, names: list[str]) -> Any:
    """The tiny model with random (non-zero) LoRA adapters ``names``: each one changes the outputs."""
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_path)
    model: Any = None
    for i, name in enumerate(names):
        torch.manual_seed(100 + i)
        lora = peft.LoraConfig(
            r=RANK, lora_alpha=ALPHA, target_modules=TARGETS, lora_dropout=0.0, init_lora_weights=False
        )
        if model is None:
            model = peft.get_peft_model(base, lora, adapter_name=name)
        else:
            model.add_adapter(name, lora)
    return model


def _adapters(model: Any, names: list[str]) -> dict[str, AdapterWeights]:
    return {
        name: AdapterWeights(peft.get_peft_model_state_dict(model, adapter_name=name), ALPHA / RANK) for name in names
    }


@pytest.fixture
def served(tiny_path: Path) -> Iterator[tuple[TransformersEngine, Any]]:
    """An engine serving adapters ``alpha`` and ``beta`` over the tiny model, and the PEFT model they came from."""
    model = _peft_model(tiny_path, ["alpha", "beta"])
    with TransformersEngine.from_pretrained(tiny_path, max_batch_size=16, batch_wait_s=2.0) as engine:
        engine.enable_adapters(TARGETS)
        asyncio.run(engine.load_adapters(_adapters(model, ["alpha", "beta"]), version=3))
        yield engine, model


def _prompts(engine: TransformersEngine) -> list[list[int]]:
    texts = ["hello", "what is two plus two", "the cat sat on the mat and then"]
    return [engine.encode_chat([{"role": "user", "content": t}], None) for t in texts]


def _params(adapter: str | None, i: int) -> SamplingParams:
    # greedy and seeded sampling; top_p = 1 keeps every logprob a smooth function of the logits
    temperature = 0.0 if i % 2 == 0 else 1.0
    return SamplingParams(max_tokens=12, temperature=temperature, seed=7 + i, adapter=adapter)


def _assert_same(a: GenerationOutput, b: GenerationOutput) -> None:
    assert a.token_ids == b.token_ids
    assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=LOGPROB_ATOL, rtol=0)


def test_batched_rows_of_different_adapters_match_each_adapter_served_alone(
    served: tuple[TransformersEngine, Any],
) -> None:
    engine, _ = served
    prompts = _prompts(engine)
    plan = [(adapter, i, p) for adapter in (None, "alpha", "beta") for i, p in enumerate(prompts)]

    async def run() -> tuple[list[GenerationOutput], list[GenerationOutput]]:
        together = await asyncio.gather(*(engine.generate(p, _params(a, i)) for a, i, p in plan))
        peak = engine.stats().peak_batch
        assert peak == len(plan), f"the rows were not decoded in one batch (peak {peak})"
        alone = [await engine.generate(p, _params(a, i)) for a, i, p in plan]  # one row at a time
        return together, alone

    together, alone = asyncio.run(run())
    for (adapter, _, _), t, a in zip(plan, together, alone, strict=True):
        _assert_same(t, a)
        assert t.adapter == adapter and t.adapter_version == (1 if adapter else None)  # loaded once
        assert t.model_version == (3 if adapter else 0)  # the base rows keep the base's version
    # the adapters do change what is said: otherwise the comparison would prove nothing
    greedy = {a: out.token_ids for (a, i, _), out in zip(plan, together, strict=True) if i == 0}
    assert greedy[None] != greedy["alpha"] and greedy["alpha"] != greedy["beta"]


def test_an_adapter_row_matches_the_model_with_that_adapter_merged(
    served: tuple[TransformersEngine, Any], tiny_path: Path
) -> None:
    engine, model = served
    prompts = _prompts(engine)
    model.set_adapter("beta")
    merged = model.merge_and_unload(adapter_names=["beta"])
    with TransformersEngine(merged, engine.tokenizer, max_batch_size=4) as alone:

        async def run() -> tuple[list[GenerationOutput], list[GenerationOutput]]:
            mixed = await asyncio.gather(
                *(engine.generate(p, _params("beta", i)) for i, p in enumerate(prompts)),
                *(engine.generate(p, _params("alpha", i)) for i, p in enumerate(prompts)),
            )
            reference = [await alone.generate(p, _params(None, i)) for i, p in enumerate(prompts)]
            return list(mixed[: len(prompts)]), reference

        ours, reference = asyncio.run(run())
    for o, r in zip(ours, reference, strict=True):
        _assert_same(o, r)


def test_rows_of_no_adapter_are_the_base_models_numbers_exactly(
    served: tuple[TransformersEngine, Any], engine: TransformersEngine
) -> None:
    adapted, _ = served
    prompts = _prompts(adapted)

    async def run() -> tuple[list[GenerationOutput], list[GenerationOutput]]:
        base_rows = [await adapted.generate(p, _params(None, i)) for i, p in enumerate(prompts)]
        plain = [await engine.generate(p, _params(None, i)) for i, p in enumerate(prompts)]
        return base_rows, plain

    base_rows, plain = asyncio.run(run())
    for b, p in zip(base_rows, plain, strict=True):
        assert b.token_ids == p.token_ids and b.logprobs == p.logprobs


def test_loading_one_adapter_leaves_the_others_and_their_versions(served: tuple[TransformersEngine, Any]) -> None:
    engine, model = served
    [prompt] = _prompts(engine)[:1]

    async def run() -> None:
        before = await engine.generate(prompt, _params("alpha", 0))
        other = peft.get_peft_model_state_dict(model, adapter_name="beta")
        await engine.load_adapters({"beta": AdapterWeights({k: v * 2 for k, v in other.items()}, ALPHA / RANK)}, 4)
        after = await engine.generate(prompt, _params("alpha", 0))
        assert before.token_ids == after.token_ids and before.logprobs == after.logprobs
        assert engine.adapter_version("alpha") == 1 and engine.adapter_version("beta") == 2
        assert after.adapter_version == 1 and after.model_version == 4

    asyncio.run(run())


def test_unknown_adapters_and_engines_without_adapters_are_refused(
    served: tuple[TransformersEngine, Any], engine: TransformersEngine
) -> None:
    adapted, _ = served
    [prompt] = _prompts(adapted)[:1]
    with pytest.raises(InvalidRequestError, match="no adapter 'gamma' is loaded"):
        asyncio.run(adapted.generate(prompt, SamplingParams(max_tokens=2, adapter="gamma")))
    with pytest.raises(InvalidRequestError, match="enable_adapters"):
        asyncio.run(engine.load_adapters({}, 1))
    with pytest.raises(RuntimeError, match="once, before"):
        adapted.enable_adapters(TARGETS)
