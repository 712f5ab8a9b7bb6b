"""Bad input is answered with OpenAI-style error JSON, and the server stays up."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from lightning_rl.engine.hf import TransformersEngine
from lightning_rl.gateway import UpstreamBackend, create_gateway_app, running_gateway

from .conftest import LIMITS, Gateway, claim_attempts, rollout_url


def assert_openai_error(r: httpx.Response, status: int, *words: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    for word in words:
        assert word in error["message"], error["message"]
    return error


async def test_malformed_json_is_400(gateway: Gateway) -> None:
    async with httpx.AsyncClient() as http:
        headers = {"content-type": "application/json"}
        r = await http.post(f"{gateway.v1}/chat/completions", content=b'{"model": "x", "messages": [', headers=headers)
        assert_openai_error(r, 400, "not valid JSON")
        r = await http.post(f"{gateway.v1}/chat/completions", json=[1, 2])
        assert_openai_error(r, 400, "JSON object")


@pytest.mark.parametrize("body", [{}, {"messages": []}, {"messages": None}])
async def test_missing_or_empty_messages_is_400(gateway: Gateway, body: dict[str, Any]) -> None:
    async with httpx.AsyncClient() as http:
        error = assert_openai_error(await http.post(f"{gateway.v1}/chat/completions", json=body), 400, "messages")
    assert error["param"] == "messages"


async def test_unknown_model_is_404(gateway: Gateway, engine: TransformersEngine) -> None:
    body = {"model": "gpt-nope", "messages": [{"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient() as http:
        r = await http.post(f"{gateway.v1}/chat/completions", json=body)
        error = assert_openai_error(r, 404, "gpt-nope", engine.model_name)
    assert error["code"] == "model_not_found"


async def test_prompt_longer_than_context_is_400_with_both_lengths(
    gateway: Gateway, engine: TransformersEngine
) -> None:
    messages = [{"role": "user", "content": "weather " * (engine.max_context + 10)}]
    prompt_len = len(engine.encode_chat(messages, None))
    assert prompt_len > engine.max_context
    async with httpx.AsyncClient(timeout=60) as http:
        for stream in (False, True):
            body = {"model": engine.model_name, "messages": messages, "max_tokens": 4, "stream": stream}
            r = await http.post(f"{gateway.v1}/chat/completions", json=body)
            error = assert_openai_error(r, 400, str(prompt_len), str(engine.max_context))
            assert error["code"] == "context_length_exceeded"
        too_long = {"prompt": [5] * (engine.max_context + 1), "max_tokens": 2}
        r = await http.post(f"{gateway.v1}/completions", json=too_long)
        assert_openai_error(r, 400, str(engine.max_context + 1), str(engine.max_context))


@pytest.mark.parametrize(
    ("field", "value", "status"),
    [
        ("n", 5, 400),
        ("max_tokens", 65, 400),
        ("max_completion_tokens", 1000, 400),
        ("n", 0, 400),
        ("temperature", 3, 400),
        ("top_p", 0, 400),
        ("seed", 2**64, 400),  # beyond what a sampler's generator takes
        ("seed", 10**30, 400),  # beyond 64 bits: parsed as a float, still refused
    ],
)
async def test_limits_and_ranges_are_400(gateway: Gateway, field: str, value: int, status: int) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], field: value}
    async with httpx.AsyncClient() as http:
        error = assert_openai_error(await http.post(f"{gateway.v1}/chat/completions", json=body), status, field)
    assert error["param"] == field


async def test_upstream_down_is_503() -> None:
    app = create_gateway_app(UpstreamBackend("http://127.0.0.1:9/v1", model="m"))
    async with running_gateway(app) as url, httpx.AsyncClient(timeout=30) as http:
        for stream in (False, True):
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
            error = assert_openai_error(await http.post(f"{url}/v1/chat/completions", json=body), 503, "unavailable")
            assert error["code"] == "upstream_unavailable"


async def test_client_disconnecting_mid_stream_frees_its_slot(gateway: Gateway, engine: TransformersEngine) -> None:
    [claim] = await claim_attempts(gateway.store, 1)
    before = engine.stats()
    messages = [{"role": "user", "content": "hi"}]
    body = {"model": engine.model_name, "messages": messages, "max_tokens": 64, "stream": True, "seed": 3}
    async with httpx.AsyncClient(timeout=60) as http:
        async with http.stream("POST", f"{rollout_url(gateway.url, claim)}/chat/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data:"):
                    break  # first chunk arrived: leave
    for _ in range(200):
        stats = engine.stats()
        if stats.running == 0 and stats.cancelled > before.cancelled:
            break
        await asyncio.sleep(0.02)
    stats = engine.stats()
    assert stats.running == 0 and stats.cancelled == before.cancelled + 1
    gw = gateway.app.state.gateway
    assert gw.streams_cancelled == 1 and gw.in_flight == 0
    await gateway.flush()
    assert await gateway.store.query_spans(rollout_id=claim.rollout.id) == []  # the agent never got this answer


async def test_burst_of_bad_requests_between_good_ones(gateway: Gateway, engine: TransformersEngine) -> None:
    good = {"model": engine.model_name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    bad: list[tuple[str, Any]] = [
        ("/chat/completions", b"{not json"),
        ("/chat/completions", {"messages": []}),
        ("/chat/completions", {"model": "nope", "messages": [{"role": "user", "content": "x"}]}),
        ("/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 99}),
        ("/chat/completions", {"messages": "not a list"}),
        ("/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}),
        ("/completions", {"prompt": []}),
        ("/completions", {"prompt": [10**9], "max_tokens": 2}),
        ("/responses", {"input": [{"type": "web_search_call"}]}),
        ("/responses", {"input": "x", "tools": [{"type": "web_search"}]}),
    ]
    async with httpx.AsyncClient(timeout=60) as http:
        for round_ in range(3):
            assert (await http.post(f"{gateway.v1}/chat/completions", json=good)).status_code == 200
            results = await asyncio.gather(
                *(
                    http.post(f"{gateway.v1}{path}", content=b)
                    if isinstance(b, bytes)
                    else http.post(f"{gateway.v1}{path}", json=b)
                    for path, b in bad
                )
            )
            for (path, _), r in zip(bad, results, strict=True):
                assert 400 <= r.status_code < 500, (round_, path, r.text)
                assert r.json()["error"]["message"]
        assert (await http.post(f"{gateway.v1}/chat/completions", json=good)).status_code == 200
    assert gateway.app.state.gateway.errors.get(500, 0) == 0


async def test_unknown_extra_fields_are_ignored(gateway: Gateway, engine: TransformersEngine) -> None:
    body = {
        "model": "gpt-5.6-luna",
        "messages": [{"role": "user", "content": "hi", "name": "bob"}],
        "max_tokens": 2,
        "user": "u1",
        "metadata": {"a": 1},
        "parallel_tool_calls": True,
        "store": False,
        "reasoning_effort": "low",
        "frequency_penalty": 0.0,
        "n": None,
    }
    async with httpx.AsyncClient(timeout=60) as http:
        r = await http.post(f"{gateway.v1}/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "gpt-5.6-luna"  # the alias asked for is echoed


async def test_limits_config_is_respected_for_responses(engine: TransformersEngine) -> None:
    app = create_gateway_app(engine, config=LIMITS)
    async with running_gateway(app) as url, httpx.AsyncClient(timeout=30) as http:
        r = await http.post(f"{url}/v1/responses", json={"input": "hi", "max_output_tokens": 1000})
        assert_openai_error(r, 400, "max_output_tokens")


async def test_any_model_name_is_served_inside_a_rollout(gateway: Gateway, engine: TransformersEngine) -> None:
    """A framework configured with another model name runs unchanged during training."""
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    [claim] = await claim_attempts(gateway.store, 1)
    rollout, attempt = claim.rollout.id, claim.attempt.id
    async with httpx.AsyncClient(timeout=60) as http:
        by_url = await http.post(f"{rollout_url(gateway.url, claim)}/chat/completions", json=body)
        by_header = await http.post(
            f"{gateway.v1}/chat/completions",
            json=body,
            headers={
                "X-Lightning-Rollout": rollout,
                "X-Lightning-Attempt": attempt,
                "X-Lightning-Key": str(claim.attempt.gateway_key),
            },
        )
    for r in (by_url, by_header):
        assert r.status_code == 200, r.text
        assert r.json()["model"] == "gpt-4o-mini"  # echoed, so frameworks comparing names stay quiet
    await gateway.flush()
    spans = await gateway.store.query_spans(rollout_id=rollout)
    assert len(spans) == 2 and {s.attributes["gen_ai.response.model"] for s in spans} == {engine.model_name}


async def test_a_backend_refusing_to_start_a_call_is_an_error_answer_not_a_leak() -> None:
    """``start_call`` raising at once (a closed client, a body it cannot send) is answered, and not
    counted as in flight forever."""

    class Refusing(UpstreamBackend):
        def start_call(self, spec: Any, on_done: Any) -> None:
            raise RuntimeError("this backend is closed")

    app = create_gateway_app(Refusing("http://127.0.0.1:9/v1", model="m"))
    async with running_gateway(app) as url, httpx.AsyncClient(timeout=30) as http:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        r = await http.post(f"{url}/v1/chat/completions", json=body)
        assert r.status_code == 500 and "error" in r.json()
        r = await http.post(f"{url}/v1/completions", json={"model": "m", "prompt": ["a", "b"]})
        assert r.status_code == 500 and "error" in r.json()
        assert (await http.get(f"{url}/health")).status_code == 200
    assert app.state.gateway.in_flight == 0
