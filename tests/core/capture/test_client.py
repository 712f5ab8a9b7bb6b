"""The OpenAI client instrumented by OpenLLMetry or OpenInference, against an endpoint that is not the gateway.

The endpoint is the fake OpenAI-compatible upstream served over HTTP (it stands for a hosted API).
The same agent runs once through the Lightning gateway (exact tokens) and once straight against
the upstream with capture on: the transitions must carry equal text and roles, the captured ones
marked inexact with no token ids. With both on at once, each call is counted once.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest

from lightning_rl import semconv
from lightning_rl.capture import captured_calls
from lightning_rl.gateway import running_gateway
from lightning_rl.testing import FakeReply, FakeToolCall, FakeUpstream, GatewayHarness
from lightning_rl.tracing import current_rollout

from .conftest import FAMILIES, Family, captured, text_view

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]


def reply_for(body: dict[str, Any]) -> FakeReply | str:
    """Asks for the tool once, then answers with what the tool returned (streamed or not)."""
    messages: list[dict[str, Any]] = body["messages"]
    last = messages[-1]
    if last["role"] == "tool":
        return f"the sum is {last['content']}"
    if body.get("tools"):
        return FakeReply(tool_calls=[FakeToolCall("add", {"a": 2, "b": 3})])
    return f"hello {last['content']}"


async def agent(base_url: str, *, stream: bool) -> str:
    """A plain tool-using agent on the OpenAI client: the user's code, whatever the endpoint."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="sk-hosted", max_retries=0)
    try:
        messages: list[Any] = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "2+3?"}]
        first = await client.chat.completions.create(model="fake-model", messages=messages, tools=TOOLS)
        call = first.choices[0].message.tool_calls[0]  # pyright: ignore[reportOptionalSubscript]
        arguments = json.loads(call.function.arguments)  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType, reportUnknownArgumentType]
        messages.append(first.choices[0].message.model_dump(exclude_none=True))
        messages.append({"role": "tool", "tool_call_id": call.id, "content": str(arguments["a"] + arguments["b"])})
        if stream:
            text = ""
            chunks = await client.chat.completions.create(
                model="fake-model", messages=messages, tools=TOOLS, stream=True, stream_options={"include_usage": True}
            )
            async for chunk in chunks:
                if chunk.choices and chunk.choices[0].delta.content:
                    text += chunk.choices[0].delta.content
        else:
            second = await client.chat.completions.create(model="fake-model", messages=messages, tools=TOOLS)
            text = second.choices[0].message.content or ""
        hello = await client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "you"}])
        return f"{text} / {hello.choices[0].message.content}"
    finally:
        await client.close()


@pytest.fixture
async def hosted() -> AsyncIterator[tuple[FakeUpstream, str]]:
    """The "hosted API": an OpenAI-compatible server that is not Lightning's gateway."""
    upstream = FakeUpstream(responder=reply_for)
    async with running_gateway(upstream.app) as url:
        yield upstream, f"{url}/v1"


async def gateway_view(stream: bool) -> list[dict[str, Any]]:
    """The same agent through the gateway: exact transitions (the reference)."""
    async with GatewayHarness(responder=reply_for) as h:
        async with h.attempt() as claim:
            llm = current_rollout().llm  # pyright: ignore[reportOptionalMemberAccess]
            assert llm is not None
            assert await agent(llm.base_url, stream=stream) == "the sum is 5 / hello you"
        adapted = await h.adapt(claim, trainable="all")
    assert all(t.exact_tokens and t.response_ids for t in adapted.transitions)
    return text_view(adapted.transitions)


@pytest.mark.parametrize("stream", [False, True], ids=["chat", "streaming"])
@pytest.mark.parametrize("family", FAMILIES)
async def test_captured_transitions_equal_the_gateways(
    family: Family, stream: bool, hosted: tuple[FakeUpstream, str]
) -> None:
    upstream, url = hosted
    async with captured(family) as c:
        claim, out = await c.run(lambda: agent(url, stream=stream))
        assert out == "the sum is 5 / hello you"
        adapted = await c.adapt(claim)
        spans = await c.spans(claim)

    assert len(upstream.requests) == 3  # the agent really called the hosted endpoint, not the gateway
    ts = adapted.transitions
    assert [t.step_index for t in ts] == [0, 1, 2]
    assert all(not t.exact_tokens and t.prompt_ids == [] and t.response_ids == [] for t in ts)
    assert adapted.n_inexact == 3
    assert {t.text.source for t in ts if t.text} == {family}
    # text-level transitions say what was asked and answered, tool calls and usage included
    first, second, hello = ts
    assert first.text and first.text.tool_calls[0]["name"] == "add"
    assert json.loads(first.text.tool_calls[0]["arguments"]) == {"a": 2, "b": 3}
    assert first.tool_call_ids == [first.text.tool_calls[0]["id"]]
    assert first.text.tools and first.text.tools[0]["function"]["name"] == "add"
    assert second.text and second.text.response == "the sum is 5"
    assert second.text.messages[-1]["role"] == "tool" and second.text.messages[-1]["content"] == "5"
    assert hello.text and hello.text.model == "fake-model" and hello.text.input_tokens
    assert all(t.text and t.text.response_id and t.text.response_id.startswith("chatcmpl-") for t in ts)
    # equal to what the gateway path builds for the same conversation
    assert text_view(ts) == await gateway_view(stream)
    # the user's own exporter received every span the rollout stored, and the same ones
    assert {s.span_id for s in spans} <= {format(s.context.span_id, "016x") for s in c.exported() if s.context}
    assert len(c.exported()) == len(spans)


@pytest.mark.parametrize("family", FAMILIES)
async def test_with_gateway_and_capture_both_on_each_call_is_counted_once(family: Family) -> None:
    async with GatewayHarness(responder=reply_for) as h, captured(family):
        async with h.attempt() as claim:
            llm = current_rollout().llm  # pyright: ignore[reportOptionalMemberAccess]
            assert llm is not None
            await agent(llm.base_url, stream=True)
        # the capture's spans went to the harness's rollout, next to the gateway's own records
        spans = await h.spans(claim)
        assert len(captured_calls(spans)) == 3
        assert len([s for s in spans if s.name == semconv.SPAN_LLM_CALL]) == 3
        adapted = await h.adapt(claim, trainable="all")
    assert adapted.n_calls == 3 and adapted.n_inexact == 0
    assert all(t.exact_tokens and t.text and t.text.source == "gateway" for t in adapted.transitions)


@pytest.mark.parametrize("family", FAMILIES)
async def test_spans_outside_a_rollout_reach_only_the_users_exporter(
    family: Family, hosted: tuple[FakeUpstream, str]
) -> None:
    _, url = hosted
    async with captured(family) as c:
        await agent(url, stream=False)  # production traffic: no rollout
        assert c.sink == [] and len(c.exported()) == 3
        assert c.capture.processor.dropped >= 3
        claim, _ = await c.run(lambda: agent(url, stream=False))
        assert len(await c.spans(claim)) == 3 and len(c.exported()) == 6


async def test_both_families_at_once_still_give_one_transition_per_call(hosted: tuple[FakeUpstream, str]) -> None:
    _, url = hosted
    async with captured("openllmetry") as one, captured("openinference") as two:
        assert one.capture.provider is not two.capture.provider
        claim, _ = await one.run(lambda: agent(url, stream=False))
        adapted = await one.adapt(claim)
        stored = await one.spans(claim)
    # each family's processor routed its spans to the rollout: every call was seen twice
    sources = [c.source for s in stored for c in captured_calls([s])]
    assert sorted(set(sources)) == ["openinference", "openllmetry"] and len(sources) == 6
    assert len(adapted.transitions) == 3
    assert [t.text.response for t in adapted.transitions if t.text] == ["", "the sum is 5", "hello you"]
