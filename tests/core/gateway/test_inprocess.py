"""Agents in the gateway's process skip the socket, and get exactly what HTTP would give them."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import openai
import pytest

from lightning_rl import semconv as sc
from lightning_rl.agent import LLM
from lightning_rl.engine.hf import TransformersEngine
from lightning_rl.gateway import create_gateway_app, running_gateway
from lightning_rl.gateway.inprocess import InProcessTransport, serving_here
from lightning_rl.tracing import rollout_context
from lightning_rl.types import Span

from .conftest import LIMITS, Gateway, claim_attempts, rollout_url

MESSAGES: list[Any] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}]


def transport_of(client: openai.AsyncOpenAI) -> object:
    return client._client._transport  # pyright: ignore[reportPrivateUsage]


async def test_model_calls_go_in_process_and_answer_as_over_http(gateway: Gateway, engine: TransformersEngine) -> None:
    c1, c2 = await claim_attempts(gateway.store, 2)
    inproc = LLM(base_url=rollout_url(gateway.url, c1), model=engine.model_name).async_openai_client(max_retries=0)
    http = gateway.client(rollout_url(gateway.url, c2), max_retries=0)
    assert isinstance(transport_of(inproc), InProcessTransport)
    try:
        params: dict[str, Any] = {"max_tokens": 12, "temperature": 0.8, "seed": 7, "logprobs": True}
        a = await inproc.chat.completions.create(model=engine.model_name, messages=MESSAGES, **params)
        b = await http.chat.completions.create(model=engine.model_name, messages=MESSAGES, **params)
        assert a.choices[0].message.content == b.choices[0].message.content
        assert a.choices[0].model_extra == b.choices[0].model_extra  # the exact token ids
        assert a.usage == b.usage
        models = await inproc.models.list()  # not a model call: answered over HTTP
        assert engine.model_name in [m.id for m in models.data]
    finally:
        await inproc.close()
    await gateway.flush()
    spans: list[list[Span]] = [
        await gateway.store.query_spans(rollout_id=c.rollout.id, name=sc.SPAN_LLM_CALL) for c in (c1, c2)
    ]
    assert [len(s) for s in spans] == [1, 1]
    for key in (sc.PROMPT_TOKEN_IDS, sc.RESPONSE_TOKEN_IDS, sc.RESPONSE_LOGPROBS, sc.TOKENS_EXACT):
        assert spans[0][0].attributes[key] == spans[1][0].attributes[key]
    assert spans[0][0].attempt_id == c1.attempt.id


async def test_streams_errors_and_timeouts(gateway: Gateway, engine: TransformersEngine) -> None:
    [claim] = await claim_attempts(gateway.store, 1)
    llm = LLM(base_url=rollout_url(gateway.url, claim), model=engine.model_name)
    client = llm.async_openai_client(max_retries=0)
    plain = LLM(base_url=f"{gateway.url}/v1", model="no-such-model").async_openai_client(max_retries=0)
    try:
        params: dict[str, Any] = {"max_tokens": 10, "temperature": 0.9, "seed": 3}
        whole = await client.chat.completions.create(model=engine.model_name, messages=MESSAGES, **params)
        stream = await client.chat.completions.create(model=engine.model_name, messages=MESSAGES, stream=True, **params)
        pieces = [chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices]
        assert len(pieces) > 1 and "".join(pieces) == whole.choices[0].message.content
        # errors come back as the server sends them
        with pytest.raises(openai.NotFoundError):
            await plain.chat.completions.create(model="no-such-model", messages=MESSAGES)
        with pytest.raises(openai.BadRequestError) as bad:
            await client.chat.completions.create(model=engine.model_name, messages=MESSAGES, max_tokens=10_000)
        assert "max_tokens" in str(bad.value)
        # the client's read timeout bounds the wait
        with pytest.raises(openai.APITimeoutError):
            await client.chat.completions.create(
                model=engine.model_name, messages=MESSAGES, max_tokens=64, timeout=0.001
            )
        # a stream closed early is a client that hung up: the engine frees its slot
        cancelled = gateway.app.state.gateway.streams_cancelled
        stream = await client.chat.completions.create(
            model=engine.model_name, messages=MESSAGES, stream=True, max_tokens=64, temperature=1.0
        )
        await anext(aiter(stream))
        await stream.close()
        for _ in range(200):
            if gateway.app.state.gateway.streams_cancelled > cancelled:
                break
            await asyncio.sleep(0.01)
        assert gateway.app.state.gateway.streams_cancelled == cancelled + 1
    finally:
        await client.close()
        await plain.close()


async def test_the_agents_context_does_not_reach_the_gateway(gateway: Gateway, engine: TransformersEngine) -> None:
    """The gateway records through its own writer; the rollout's span sink sees nothing of it."""
    [claim] = await claim_attempts(gateway.store, 1)
    seen: list[Span] = []
    llm = LLM(base_url=rollout_url(gateway.url, claim), model=engine.model_name)
    with rollout_context(claim.rollout.id, claim.attempt.id, sink=seen.append):
        client = llm.async_openai_client(max_retries=0)
        try:
            await client.chat.completions.create(model=engine.model_name, messages=MESSAGES, max_tokens=4)
        finally:
            await client.close()
    assert seen == []
    await gateway.flush()
    assert len(await gateway.store.query_spans(rollout_id=claim.rollout.id, name=sc.SPAN_LLM_CALL)) == 1


async def test_a_wrong_token_is_refused_over_http(engine: TransformersEngine) -> None:
    app = create_gateway_app(engine, token="s3cret", config=LIMITS)
    async with running_gateway(app) as url:
        good = LLM(base_url=f"{url}/v1", model=engine.model_name, api_key="s3cret").async_openai_client(max_retries=0)
        bad = LLM(base_url=f"{url}/v1", model=engine.model_name, api_key="wrong").async_openai_client(max_retries=0)
        try:
            reply = await good.chat.completions.create(model=engine.model_name, messages=MESSAGES, max_tokens=3)
            assert reply.choices[0].message.content is not None
            with pytest.raises(openai.AuthenticationError):
                await bad.chat.completions.create(model=engine.model_name, messages=MESSAGES, max_tokens=3)
        finally:
            await good.close()
            await bad.close()
    assert not serving_here(url)  # stopped serving: unregistered


async def test_other_threads_and_loops_use_http(gateway: Gateway, engine: TransformersEngine) -> None:
    llm = LLM(base_url=f"{gateway.url}/v1", model=engine.model_name)
    answers: list[str | None] = []

    def in_a_thread() -> None:
        async def call() -> None:
            assert not serving_here(llm.base_url)  # another event loop
            client = llm.async_openai_client(max_retries=0)
            assert not isinstance(transport_of(client), InProcessTransport)
            try:
                reply = await client.chat.completions.create(model=engine.model_name, messages=MESSAGES, max_tokens=3)
                answers.append(reply.choices[0].message.content)
            finally:
                await client.close()

        asyncio.run(call())
        sync = llm.openai_client(max_retries=0)
        try:
            reply = sync.chat.completions.create(model=engine.model_name, messages=MESSAGES, max_tokens=3)
            answers.append(reply.choices[0].message.content)
        finally:
            sync.close()

    thread = threading.Thread(target=in_a_thread)
    thread.start()
    await asyncio.to_thread(thread.join)
    assert len(answers) == 2
