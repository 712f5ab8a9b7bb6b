"""Upstream mode against the scripted fake vLLM server: exact ids when returned, inexact otherwise."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest

from lightning_rl import semconv as sc
from lightning_rl.gateway import UpstreamBackend, create_gateway_app, running_gateway
from lightning_rl.semconv import RESPONSE_TEXT
from lightning_rl.store import MemoryStore
from lightning_rl.testing import FakeReply, FakeToolCall, FakeUpstream, fake_token_ids

from .conftest import Gateway, claim_attempts, rollout_url

TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {}}}}]
MESSAGES = [{"role": "user", "content": "find it"}]


@pytest.fixture
async def fake() -> FakeUpstream:
    return FakeUpstream(
        ["plain answer", FakeReply(tool_calls=[FakeToolCall("search", {"q": "x"})]), "streamed answer"],
        model="served-model",
    )


@pytest.fixture
async def upstream_gateway(fake: FakeUpstream, store: MemoryStore) -> AsyncIterator[Gateway]:
    async with running_gateway(fake.app) as up:
        app = create_gateway_app(UpstreamBackend(f"{up}/v1"), store=store)
        async with running_gateway(app) as url:
            gw = Gateway(url, app, store)
            yield gw
            await gw.aclose()


async def test_exact_ids_text_and_tool_calls_from_a_vllm_like_upstream(
    upstream_gateway: Gateway, fake: FakeUpstream
) -> None:
    gw = upstream_gateway
    [claim] = await claim_attempts(gw.store, 1)
    client = gw.client(rollout_url(gw.url, claim))
    r1 = await client.chat.completions.create(model="gpt-5.6-luna", messages=MESSAGES)  # type: ignore[arg-type]
    r2 = await client.chat.completions.create(model="served-model", messages=MESSAGES, tools=TOOLS)  # type: ignore[arg-type]
    stream = await client.chat.completions.create(model="served-model", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
    streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert r1.choices[0].message.content == "plain answer" and r1.choices[0].logprobs is None
    [call] = r2.choices[0].message.tool_calls or []
    assert call.function.name == "search" and r2.choices[0].finish_reason == "tool_calls"
    assert streamed == "streamed answer"
    # what the gateway forwarded: the served model name, and vLLM's token-id extension
    assert [b["model"] for b in fake.requests] == ["served-model"] * 3
    assert all(b["return_token_ids"] is True and b["logprobs"] is True for b in fake.requests)
    await gw.flush()
    spans = await gw.store.query_spans(rollout_id=claim.rollout.id)
    assert len(spans) == 3
    prompt = fake_token_ids(json.dumps(MESSAGES, sort_keys=True))
    for span, text in zip(spans, ["plain answer", "", "streamed answer"], strict=True):
        a = span.attributes
        assert a[sc.TOKENS_EXACT] is True and a[sc.PROMPT_TOKEN_IDS] == prompt
        assert a[RESPONSE_TEXT] == text
        assert len(a[sc.RESPONSE_LOGPROBS]) == len(a[sc.RESPONSE_TOKEN_IDS])
    assert bytes(spans[0].attributes[sc.RESPONSE_TOKEN_IDS]).decode() == "plain answer"
    assert bytes(spans[2].attributes[sc.RESPONSE_TOKEN_IDS]).decode() == "streamed answer"
    [recorded] = json.loads(spans[1].attributes[sc.TOOL_CALLS])
    assert recorded == {"id": call.id, "name": "search", "arguments": call.function.arguments}


async def test_streamed_tool_calls_and_responses_api_through_upstream(store: MemoryStore) -> None:
    fake = FakeUpstream([FakeReply("thinking", tool_calls=[FakeToolCall("search", {"q": 1})]), "final words"])
    [claim] = await claim_attempts(store, 1)
    async with running_gateway(fake.app) as up:
        app = create_gateway_app(UpstreamBackend(up, model="fake-model"), store=store)
        async with running_gateway(app) as url, httpx.AsyncClient(timeout=30) as http:
            base = rollout_url(url, claim)
            body = {"model": "fake-model", "messages": MESSAGES, "tools": TOOLS, "stream": True}
            async with http.stream("POST", f"{base}/chat/completions", json=body) as r:
                lines = [line async for line in r.aiter_lines() if line.startswith("data:")]
            assert lines[-1] == "data: [DONE]"
            r = await http.post(f"{base}/responses", json={"model": "gpt-5.6-luna", "input": "go"})
            assert r.status_code == 200 and r.json()["output"][0]["content"][0]["text"] == "final words"
            assert fake.requests[-1]["messages"] == [{"role": "user", "content": "go"}]
        assert await app.state.gateway.writer.flush(5)
    first, second = await store.query_spans(rollout_id=claim.rollout.id)
    [call] = json.loads(first.attributes[sc.TOOL_CALLS])
    assert call["name"] == "search" and json.loads(call["arguments"]) == {"q": 1}
    assert first.attributes[RESPONSE_TEXT] == "thinking"
    assert second.attributes[sc.TOKENS_EXACT] is True


async def test_upstream_without_token_ids_records_text_marked_inexact(store: MemoryStore) -> None:
    fake = FakeUpstream(["no ids here", "nor here"], return_token_ids=False)
    [claim] = await claim_attempts(store, 1)
    async with running_gateway(fake.app) as up:
        app = create_gateway_app(UpstreamBackend(up), store=store)
        async with running_gateway(app) as url, httpx.AsyncClient(timeout=30) as http:
            base = rollout_url(url, claim)
            r = await http.post(f"{base}/chat/completions", json={"model": "fake-model", "messages": MESSAGES})
            assert r.status_code == 200 and r.json()["choices"][0]["token_ids"] is None
            body = {"model": "fake-model", "messages": MESSAGES, "stream": True}
            async with http.stream("POST", f"{base}/chat/completions", json=body) as s:
                assert (await s.aread()).endswith(b"data: [DONE]\n\n")
        assert await app.state.gateway.writer.flush(5)
    spans = await store.query_spans(rollout_id=claim.rollout.id)
    assert [s.attributes[RESPONSE_TEXT] for s in spans] == ["no ids here", "nor here"]
    for span in spans:
        assert span.attributes[sc.TOKENS_EXACT] is False
        assert span.attributes[sc.RESPONSE_TOKEN_IDS] is None and span.attributes[sc.PROMPT_TOKEN_IDS] is None
        assert span.attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] is not None  # the upstream's own usage


async def test_completions_and_version_hook_in_upstream_mode(store: MemoryStore) -> None:
    fake = FakeUpstream(["abc", "def"])
    [claim] = await claim_attempts(store, 1)
    async with running_gateway(fake.app) as up:
        app = create_gateway_app(UpstreamBackend(up), store=store, admin_token="adm1n")
        async with running_gateway(app) as url, httpx.AsyncClient(timeout=30) as http:
            base = rollout_url(url, claim)
            r = await http.post(f"{base}/completions", json={"prompt": [7, 8, 9], "max_tokens": 3, "logprobs": 0})
            assert r.json()["choices"][0]["token_ids"] == list(b"abc")
            admin = {"authorization": "Bearer adm1n"}
            r = await http.post(f"{url}/admin/weights", json={"version": 4}, headers=admin)
            assert r.json() == {"version": 4}
            r = await http.post(f"{base}/completions", json={"prompt": "hey", "max_tokens": 3})
            assert r.json()["prompt_token_ids"] == list(b"hey")
            r = await http.post(f"{url}/v1/chat/completions", json={"model": "other", "messages": MESSAGES})
            assert r.status_code == 404
        assert await app.state.gateway.writer.flush(5)
    spans = await store.query_spans(rollout_id=claim.rollout.id)
    assert [s.attributes[sc.MODEL_VERSION] for s in spans] == [0, 4]
    assert spans[0].attributes[sc.PROMPT_TOKEN_IDS] == [7, 8, 9]


async def test_a_long_prompt_is_forwarded_whole(upstream_gateway: Gateway, fake: FakeUpstream) -> None:
    """A prompt far past the HTTP server's 64 KiB read buffer (long agent contexts are common)."""
    gw = upstream_gateway
    [claim] = await claim_attempts(gw.store, 1)
    long_text = "lorem ipsum " * 40_000  # ~480 KB
    client = gw.client(rollout_url(gw.url, claim))
    r = await client.chat.completions.create(model="served-model", messages=[{"role": "user", "content": long_text}])
    assert r.choices[0].message.content == "plain answer"
    assert fake.requests[-1]["messages"][0]["content"] == long_text


async def test_call_in_task_reports_result_error_and_cancellation_once() -> None:
    """A backend without ``start_call`` is run through ``call_in_task``: every ending reaches ``on_done``."""
    import asyncio

    from lightning_rl.gateway.upstreams import CallResult, call_in_task

    seen: dict[str, list[tuple[CallResult | None, BaseException | None]]] = {"ok": [], "fails": [], "hangs": []}
    result = CallResult(prompt_ids=[1, 2], choices=[], tokens_exact=True)

    async def ok() -> CallResult:
        await asyncio.sleep(0)
        return result

    async def fails() -> CallResult:
        raise ValueError("upstream said no")

    async def hangs() -> CallResult:
        await asyncio.Event().wait()  # held only by its own task: must not be garbage collected
        raise AssertionError("unreachable")

    for name, coro in (("ok", ok()), ("fails", fails()), ("hangs", hangs())):
        call_in_task(coro, lambda r, e, name=name: seen[name].append((r, e)))
    await asyncio.sleep(0.01)
    assert seen["ok"] == [(result, None)]
    [(none, error)] = seen["fails"]
    assert none is None and isinstance(error, ValueError)
    assert seen["hangs"] == []
    [task] = [t for t in asyncio.all_tasks() if t.get_coro().__qualname__.endswith("hangs")]  # type: ignore[union-attr]
    task.cancel()
    await asyncio.sleep(0.01)
    [(none, error)] = seen["hangs"]
    assert none is None and isinstance(error, asyncio.CancelledError)
