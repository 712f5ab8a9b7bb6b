"""Prefill sharing: duplicate prompts and a common prefix are computed once, with unchanged results."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from lightning_rl.engine import SamplingParams, _attention
from lightning_rl.engine._prefix import common_prefix_len
from lightning_rl.engine.hf import TransformersEngine

from .test_engine_generate import reference_logprobs

SYSTEM = "You are a careful assistant. Use the calculator tool for every sum, then state the answer in words."
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Apply add, subtract or multiply to the two numbers.",
            "parameters": {"type": "object", "properties": {"operation": {"type": "string"}}},
        },
    }
]


def agent_prompts(engine: TransformersEngine) -> list[list[int]]:
    """Agent-like traffic: one system prompt and tool schema, different questions, a repeated one,
    and a later turn of one conversation (whose prompt extends another's)."""
    questions = ["What is 3 plus 4?", "What is 12 times 7?", "Compute 9 minus 2.", "What is 3 plus 4?"]
    chats = [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}] for q in questions]
    second_turn = [
        *chats[1],
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": '{"operation": "multiply"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_0", "content": "84"},
    ]
    return [engine.encode_chat(chat, TOOLS) for chat in [*chats, second_turn]]


def test_common_prefix_len_leaves_every_prompt_a_token() -> None:
    assert common_prefix_len([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 9]]) == 2
    assert common_prefix_len([[1, 2, 3], [1, 2, 3]]) == 2  # identical: the last token still runs
    assert common_prefix_len([[1, 2, 3], [1, 2, 3, 4, 5]]) == 2
    assert common_prefix_len([[7], [7, 8]]) == 0
    assert common_prefix_len([[1, 2], [3, 4]]) == 0


async def test_shared_prefill_matches_a_full_forward_pass(tiny_path: Path) -> None:
    with TransformersEngine.from_pretrained(tiny_path, max_batch_size=8, batch_wait_s=2.0) as engine:
        prompts = agent_prompts(engine)
        assert common_prefix_len(prompts) >= 32, "the test needs prompts that share a long prefix"
        seeds = [0, 1, 2, 0, 4]  # the repeated question (0 and 3) with the same seed
        params = [SamplingParams(max_tokens=16, temperature=0.9, seed=s) for s in seeds]
        outs = await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts, params, strict=True)))
        stats = engine.stats()
        assert stats.prefill_sizes == [len(prompts)]
        # The repeated question is not recomputed, nor is the shared prefix of the four distinct ones.
        assert stats.prefill_tokens_saved >= len(prompts[3]) + 3 * common_prefix_len(prompts)
        assert stats.prefill_tokens + stats.prefill_tokens_saved == sum(len(p) for p in prompts)
    for ids, out in zip(prompts, outs, strict=True):
        reference = reference_logprobs(engine, ids, out.token_ids, 0.9, 1.0)
        assert torch.allclose(torch.tensor(out.logprobs), reference, atol=1e-4, rtol=0)
        assert out.prompt_len == len(ids)
    # The same seed gives the same tokens for the duplicate prompt (its own generator, a copied row).
    assert outs[0].token_ids == outs[3].token_ids


async def test_shared_rows_join_and_leave_a_running_batch(tiny_path: Path) -> None:
    """Rows prefilled on a shared prefix (padding between prefix and rest) merge with running rows
    and survive other rows leaving; every completion stays exact."""
    with TransformersEngine.from_pretrained(tiny_path, max_batch_size=8, batch_wait_s=0.0) as engine:
        prompts = agent_prompts(engine)
        stream = engine.stream(prompts[4], SamplingParams(max_tokens=40, seed=10, temperature=1.0))
        first = await anext(stream)
        params = [SamplingParams(max_tokens=3 + 5 * i, seed=i, temperature=0.8) for i in range(4)]
        outs = await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts[:4], params, strict=True)))
        rest = [d async for d in stream]
        assert engine.stats().prefill_tokens_saved > 0
    streamed = [*first.token_ids, *(t for d in rest for t in d.token_ids)]
    streamed_lps = [*first.logprobs, *(x for d in rest for x in d.logprobs)]
    reference = reference_logprobs(engine, prompts[4], streamed, 1.0, 1.0)
    assert torch.allclose(torch.tensor(streamed_lps), reference, atol=1e-4, rtol=0)
    for ids, out in zip(prompts[:4], outs, strict=True):
        reference = reference_logprobs(engine, ids, out.token_ids, 0.8, 1.0)
        assert torch.allclose(torch.tensor(out.logprobs), reference, atol=1e-4, rtol=0)


def test_encode_chat_reuses_identical_requests(engine: TransformersEngine) -> None:
    """Repeated chat requests (a GRPO group's first turn) are rendered once; results are copies."""
    chat = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is 5 plus 6?"}]
    first = engine.encode_chat(chat, TOOLS)
    first.append(-1)  # a caller mutating its list must not change what the next caller gets
    calls: list[object] = []
    template = engine.tokenizer.apply_chat_template

    def counting(*args: object, **kwargs: object) -> object:
        calls.append(args)
        return template(*args, **kwargs)

    engine.tokenizer.apply_chat_template = counting
    try:
        again = engine.encode_chat([dict(m) for m in chat], TOOLS)
        other = engine.encode_chat([*chat[:1], {"role": "user", "content": "What is 5 plus 7?"}], TOOLS)
    finally:
        del engine.tokenizer.apply_chat_template
    assert again == first[:-1]
    assert len(calls) == 1 and other != again  # only the new request was rendered


async def test_the_shared_prefix_is_held_once_and_serves_later_joins(tiny_path: Path) -> None:
    """The running cache holds only what follows the shared prefix; a later turn that starts with it
    runs only its own tokens; a prompt with another system prompt runs beside them on its own cache;
    every completion stays exact."""
    with TransformersEngine.from_pretrained(tiny_path, max_batch_size=8, batch_wait_s=2.0) as engine:
        prompts = agent_prompts(engine)
        shared = common_prefix_len(prompts[:3])
        params = [SamplingParams(max_tokens=30, seed=i, temperature=1.0) for i in range(3)]
        firsts = [engine.stream(p, s) for p, s in zip(prompts[:3], params, strict=True)]
        heads = await asyncio.gather(*(anext(s) for s in firsts))
        batch = engine._batch  # pyright: ignore[reportPrivateUsage]
        held = batch._prefix  # pyright: ignore[reportPrivateUsage]
        assert held is not None and held.length == shared and held.rows.tolist() == [True] * 3
        # the cache's columns are the longest rest plus what was generated, not whole prompts
        assert batch.length < max(len(p) for p in prompts[:3]) - shared + 30
        saved = engine.stats().prefill_tokens_saved
        other = engine.encode_chat([{"role": "user", "content": "No system prompt here: what is 2 plus 2?"}], TOOLS)
        later = [prompts[4], other]  # a second turn on the held prefix, and a prompt off it
        outs = await asyncio.gather(
            *(engine.generate(p, SamplingParams(max_tokens=12, seed=7, temperature=1.0)) for p in later)
        )
        streamed = [[head, *[d async for d in stream]] for head, stream in zip(heads, firsts, strict=True)]
        assert engine.stats().prefill_tokens_saved >= saved + shared  # the second turn skipped the prefix
    completions = [
        (ids, [t for d in deltas for t in d.token_ids], [x for d in deltas for x in d.logprobs])
        for ids, deltas in zip(prompts[:3], streamed, strict=True)
    ]
    completions += [(ids, out.token_ids, out.logprobs) for ids, out in zip(later, outs, strict=True)]
    for ids, tokens, logprobs in completions:
        reference = reference_logprobs(engine, ids, tokens, 1.0, 1.0)
        assert torch.allclose(torch.tensor(logprobs), reference, atol=1e-4, rtol=0)


async def test_a_model_on_another_attention_gets_the_prefix_copied_per_row(tiny_path: Path) -> None:
    """Only the engine's own attention reads a held prefix; on eager attention the prefix is still
    computed once, then copied into each row, and completions stay exact."""
    with TransformersEngine.from_pretrained(
        tiny_path, max_batch_size=8, batch_wait_s=2.0, attn_implementation="eager"
    ) as engine:
        prompts = agent_prompts(engine)[:3]
        params = [SamplingParams(max_tokens=10, seed=i, temperature=1.0) for i in range(3)]
        outs = await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts, params, strict=True)))
        assert engine.stats().prefill_tokens_saved >= 2 * common_prefix_len(prompts)
    for ids, out in zip(prompts, outs, strict=True):
        reference = reference_logprobs(engine, ids, out.token_ids, 1.0, 1.0)
        assert torch.allclose(torch.tensor(out.logprobs), reference, atol=1e-4, rtol=0)


@pytest.mark.parametrize("chunk", [4_000_000, 500])
def test_prefix_attention_equals_attention_over_the_concatenated_keys(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against SDPA over [prefix, own columns] with the mask spelled out: rows on and off the prefix,
    padded columns and a padding query; in one chunk of rows and in many (``SCORE_CHUNK``)."""
    monkeypatch.setattr(_attention, "SCORE_CHUNK", chunk)
    generator = torch.Generator().manual_seed(0)
    rows, heads, kv_heads, q, own, shared, dim = 5, 6, 2, 3, 7, 11, 8

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator)

    query, key, value = rand(rows, heads, q, dim), rand(rows, kv_heads, own, dim), rand(rows, kv_heads, own, dim)
    prefix_key, prefix_value = rand(1, kv_heads, shared, dim), rand(1, kv_heads, shared, dim)
    on_prefix = torch.tensor([True, False, True, True, False])
    mask = torch.ones((rows, 1, q, own), dtype=torch.bool).tril(own - q)  # causal over the last q columns
    mask[1, :, :, :3] = False  # row 1: three padded columns
    mask[2, :, 0, :] = False  # row 2: its first query is padding and sees none of its own columns
    got = _attention.prefix_attention(query, key, value, prefix_key, prefix_value, on_prefix, mask, dim**-0.5)
    full_mask = torch.cat([on_prefix.view(rows, 1, 1, 1).expand(rows, 1, q, shared), mask], dim=-1)
    full_key = torch.cat([prefix_key.expand(rows, -1, -1, -1), key], dim=2)
    full_value = torch.cat([prefix_value.expand(rows, -1, -1, -1), value], dim=2)
    want = torch.nn.functional.scaled_dot_product_attention(
        query, full_key, full_value, attn_mask=full_mask, scale=dim**-0.5, enable_gqa=True
    ).transpose(1, 2)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
