"""The embedded engine: sampling controls, exact text and logprobs that match a plain forward pass."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lightning_rl.engine import InferenceEngine, SamplingParams, sampled_logprobs, sampling_logprobs
from lightning_rl.engine._request import Request
from lightning_rl.engine.base import GenerationOutput, StreamDelta
from lightning_rl.engine.hf import TransformersEngine
from lightning_rl.engine.tiny import build_tiny_model
from lightning_rl.errors import InvalidRequestError

from .numerics import LOGPROB_ATOL, assert_logprobs_match

TOOLS = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]


def reference_logprobs(
    engine: TransformersEngine, prompt: Sequence[int], completion: Sequence[int], temperature: float, top_p: float
) -> torch.Tensor:
    """What a trainer computes: one unpadded full-sequence forward pass, then ``sampled_logprobs``."""
    with torch.no_grad():
        logits = engine.model(torch.tensor([[*prompt, *completion]])).logits[0]
    predicting = logits[len(prompt) - 1 : len(prompt) + len(completion) - 1]
    return sampled_logprobs(predicting, torch.tensor(completion), temperature, top_p)


def prompt(engine: TransformersEngine, text: str = "What is 6 * 7?") -> list[int]:
    return engine.encode_chat([{"role": "user", "content": text}], None)


def test_satisfies_the_protocol(engine: TransformersEngine) -> None:
    assert isinstance(engine, InferenceEngine)
    assert engine.max_context == 2048 and engine.version == 0
    assert engine.tokenizer.convert_tokens_to_ids("<|im_end|>") in engine.eos_token_ids


def test_encode_chat_uses_the_template_with_tools(engine: TransformersEngine, tiny_path: Path) -> None:
    messages = [{"role": "user", "content": "hi"}]
    ids = engine.encode_chat(messages, TOOLS)
    tokenizer = AutoTokenizer.from_pretrained(tiny_path)
    text = tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert ids == tokenizer.encode(text, add_special_tokens=False)
    assert "calculator(" in engine.tokenizer.decode(ids)
    # OpenAI-style string arguments render like dict arguments.
    call = {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": '{"x": 1}'}}
    as_string = engine.encode_chat([*messages, {"role": "assistant", "content": None, "tool_calls": [call]}], TOOLS)
    call["function"]["arguments"] = {"x": 1}  # type: ignore[index]
    as_dict = engine.encode_chat([*messages, {"role": "assistant", "content": None, "tool_calls": [call]}], TOOLS)
    assert as_string == as_dict
    with pytest.raises(InvalidRequestError):
        engine.encode_chat([], None)


def test_parse_assistant(engine: TransformersEngine) -> None:
    parsed = engine.parse_assistant('<tool_call>{"name": "calculator", "arguments": {"e": "1"}}</tool_call>')
    assert parsed.tool_calls[0].name == "calculator"
    assert engine.parse_assistant("<tool_call>{oops</tool_call>").parse_error is not None


async def test_max_tokens_and_exact_text(engine: TransformersEngine) -> None:
    ids = prompt(engine)
    out = await engine.generate(ids, SamplingParams(max_tokens=17, seed=1))
    assert len(out.token_ids) == len(out.logprobs) == 17 and out.finish_reason == "length"
    assert out.prompt_len == len(ids) and out.model_version == 0
    assert engine.decode(out.token_ids) == out.text
    assert all(lp <= 0 and math.isfinite(lp) for lp in out.logprobs)


async def test_same_seed_same_tokens(engine: TransformersEngine) -> None:
    ids = prompt(engine)
    a = await engine.generate(ids, SamplingParams(max_tokens=24, seed=7))
    b = await engine.generate(ids, SamplingParams(max_tokens=24, seed=7))
    c = await engine.generate(ids, SamplingParams(max_tokens=24, seed=8))
    assert a.token_ids == b.token_ids and a.logprobs == b.logprobs
    assert a.token_ids != c.token_ids


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 1.0), (1.0, 0.9), (0.7, 0.8)])
async def test_logprobs_match_a_full_forward_pass(engine: TransformersEngine, temperature: float, top_p: float) -> None:
    ids = prompt(engine, "Tell me about the weather today.")
    out = await engine.generate(ids, SamplingParams(max_tokens=40, temperature=temperature, top_p=top_p, seed=3))
    # Exact up to rounding, except where rounding moves a token across the top-p cut (numerics.py).
    assert_logprobs_match(engine, ids, out.token_ids, out.logprobs, temperature, top_p)


async def test_llama_architecture_serves_with_exact_logprobs(tmp_path: Path) -> None:
    folder = build_tiny_model(tmp_path / "llama", architecture="llama", hidden=64, layers=2, heads=2, kv_heads=1)
    with TransformersEngine.from_pretrained(folder, batch_wait_s=0.5, max_batch_size=3) as llama:
        batch = [prompt(llama, text) for text in ("hi", "what is the weather today?", "one two")]
        outs = await asyncio.gather(*(llama.generate(p, SamplingParams(max_tokens=12, seed=1)) for p in batch))
        assert llama.stats().prefill_sizes == [3]
        for ids, out in zip(batch, outs, strict=True):
            reference = reference_logprobs(llama, ids, out.token_ids, 1.0, 1.0)
            assert torch.allclose(torch.tensor(out.logprobs), reference, atol=LOGPROB_ATOL, rtol=0)


async def test_greedy_is_argmax_with_unscaled_logprobs(engine: TransformersEngine) -> None:
    ids = prompt(engine)
    out = await engine.generate(ids, SamplingParams(max_tokens=12, temperature=0.0, top_p=0.5))
    with torch.no_grad():
        logits = engine.model(torch.tensor([[*ids, *out.token_ids]])).logits[0, len(ids) - 1 : -1]
    assert out.token_ids == logits.argmax(-1).tolist()
    expected = torch.log_softmax(logits.float(), -1).max(-1).values
    assert torch.allclose(torch.tensor(out.logprobs), expected, atol=LOGPROB_ATOL, rtol=0)


async def test_top_logprobs(engine: TransformersEngine) -> None:
    ids = prompt(engine)
    out = await engine.generate(ids, SamplingParams(max_tokens=6, temperature=0.8, top_p=1.0, top_logprobs=5, seed=2))
    assert out.top_logprobs is not None and len(out.top_logprobs) == 6
    with torch.no_grad():
        logits = engine.model(torch.tensor([[*ids, *out.token_ids]])).logits[0, len(ids) - 1 : -1]
    full = sampling_logprobs(logits, 0.8, 1.0)
    for step, top in enumerate(out.top_logprobs):
        assert len(top) == 5
        values = [v for _, v in top]
        assert values == sorted(values, reverse=True)
        assert out.logprobs[step] <= values[0] + 1e-6
        expected_ids = torch.topk(full[step], 5).indices.tolist()
        assert [t for t, _ in top] == expected_ids
    # With a tight nucleus, only finite alternatives are listed.
    tight = await engine.generate(ids, SamplingParams(max_tokens=3, top_p=1e-6, top_logprobs=5, seed=2))
    assert tight.top_logprobs is not None and all(len(t) == 1 for t in tight.top_logprobs)


async def test_stop_strings(engine: TransformersEngine) -> None:
    ids = prompt(engine, "Say something long.")
    free = await engine.generate(ids, SamplingParams(max_tokens=60, seed=11))
    text = free.text
    stop = next(text[i : i + 3] for i in range(10, len(text) - 3) if "\ufffd" not in text[i : i + 3])
    cut = text.index(stop)
    stopped = await engine.generate(ids, SamplingParams(max_tokens=60, seed=11, stop=["zzzz-never", stop]))
    assert stopped.finish_reason == "stop"
    assert stopped.text == text[:cut]
    # Every sampled token is kept (the trainer needs them); their text starts with text + stop.
    assert stopped.token_ids == free.token_ids[: len(stopped.token_ids)]
    assert engine.decode(stopped.token_ids).startswith(stopped.text + stop)
    assert not engine.decode(stopped.token_ids[:-1]).startswith(text[: cut + len(stop)])


async def test_eos_from_generation_config_stops(tiny_path: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    tokenizer = AutoTokenizer.from_pretrained(tiny_path)
    with TransformersEngine(model, tokenizer, model_name="tiny") as probe:
        ids = prompt(probe)
        greedy = await probe.generate(ids, SamplingParams(max_tokens=8, temperature=0))
    # Declare the fourth greedy token an eos token, as a real generation_config lists several.
    eos = greedy.token_ids[3]
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, eos]
    with TransformersEngine(model, tokenizer, model_name="tiny") as engine:
        out = await engine.generate(ids, SamplingParams(max_tokens=8, temperature=0))
    first = greedy.token_ids.index(eos)
    assert out.finish_reason == "stop" and out.token_ids == greedy.token_ids[: first + 1]


def test_special_eos_is_kept_in_ids_but_not_in_text(engine: TransformersEngine) -> None:
    """The chat eos ``<|im_end|>`` ends the completion, stays in ``token_ids`` and is not in ``text``."""
    delivered: list[object] = []
    im_end = engine.tokenizer.convert_tokens_to_ids("<|im_end|>")
    words = engine.encode_text("Hello world")
    request = Request(
        prompt_ids=[1],
        params=SamplingParams(),
        max_new_tokens=50,
        eos_ids=engine.eos_token_ids,
        decode=engine.decode,
        deliver=lambda item: delivered.append(item) is None,
        generator=torch.Generator(),
        streaming=False,
    )
    for token in [*words, im_end]:
        request.push(token, -0.5, None)
    request.deliver_final()
    (out,) = delivered
    assert isinstance(out, GenerationOutput)
    assert out.finish_reason == "stop" and out.token_ids == [*words, im_end] and out.text == "Hello world"


async def test_context_limit(tiny_path: Path, engine: TransformersEngine) -> None:
    ids = prompt(engine)
    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    tokenizer = AutoTokenizer.from_pretrained(tiny_path)
    with TransformersEngine(model, tokenizer, max_context=len(ids) + 5) as small:
        out = await small.generate(ids, SamplingParams(max_tokens=100, seed=0))
        assert out.finish_reason == "length" and len(out.token_ids) == 5
        with pytest.raises(InvalidRequestError, match=rf"{len(ids) + 5} tokens.*{len(ids) + 5}"):
            await small.generate([5] * (len(ids) + 5), SamplingParams())


@pytest.mark.parametrize(
    ("ids", "params", "match"),
    [
        ([], SamplingParams(), "empty"),
        ([1, 10**6], SamplingParams(), "token ids"),
        ([1, 2], SamplingParams(max_tokens=0), "max_tokens"),
        ([1, 2], SamplingParams(temperature=-1), "temperature"),
        ([1, 2], SamplingParams(temperature=float("nan")), "temperature"),
        ([1, 2], SamplingParams(top_p=0), "top_p"),
        ([1, 2], SamplingParams(top_logprobs=-1), "top_logprobs"),
        ([1, 2], SamplingParams(stop=[""]), "stop"),
    ],
)
async def test_bad_requests_are_rejected(
    engine: TransformersEngine, ids: list[int], params: SamplingParams, match: str
) -> None:
    with pytest.raises(InvalidRequestError, match=match):
        await engine.generate(ids, params)
    with pytest.raises(InvalidRequestError, match=match):
        async for _ in engine.stream(ids, params):
            pass


def test_streamed_text_never_splits_a_character(engine: TransformersEngine) -> None:
    """Byte-level tokens can split a character; the stream holds the bytes back until it is whole."""
    delivered: list[object] = []
    ids = engine.encode_text("a😀b")
    assert len(ids) > 3  # the emoji spans several byte tokens
    request = Request(
        prompt_ids=[1],
        params=SamplingParams(stop=["b!"]),
        max_new_tokens=len(ids),
        eos_ids=engine.eos_token_ids,
        decode=engine.decode,
        deliver=lambda item: delivered.append(item) is None,
        generator=torch.Generator(),
        streaming=True,
    )
    for token in ids:
        request.push(token, -1.0, None)
    request.deliver_final()
    pieces = [d.text for d in delivered if isinstance(d, StreamDelta)]
    assert len(pieces) == len(ids) and "".join(pieces) == "a😀b"
    assert "\ufffd" not in "".join(pieces) and "😀" in pieces
    assert pieces[-1] == "b"  # held back while it could have started the stop string "b!"
