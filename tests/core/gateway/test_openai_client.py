"""The real ``openai`` client against the gateway serving the tiny engine: every API, stream and not."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai

from lightning_rl import semconv as sc
from lightning_rl.engine.hf import TransformersEngine
from lightning_rl.semconv import API, RESPONSE_TEXT, STREAM
from lightning_rl.types import Span

from .conftest import Gateway, claim_attempts, rollout_url

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
MESSAGES: list[Any] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}]


async def spans_of(gw: Gateway, rollout_id: str) -> list[Span]:
    await gw.flush()
    return await gw.store.query_spans(rollout_id=rollout_id, name=sc.SPAN_LLM_CALL)


def check_exact(span: Span, engine: TransformersEngine, messages: Any, tools: Any = None) -> None:
    """The recorded ids are what the engine consumed and sampled; decoding them gives the text."""
    a = span.attributes
    assert a[sc.TOKENS_EXACT] is True
    assert a[sc.PROMPT_TOKEN_IDS] == engine.encode_chat(messages, tools)
    ids = a[sc.RESPONSE_TOKEN_IDS]
    assert ids and len(a[sc.RESPONSE_LOGPROBS]) == len(ids)
    assert all(lp <= 0.0 for lp in a[sc.RESPONSE_LOGPROBS])
    assert engine.decode(ids).startswith(a[RESPONSE_TEXT])  # equal unless a stop string was cut off
    assert a[sc.GEN_AI_USAGE_INPUT_TOKENS] == len(a[sc.PROMPT_TOKEN_IDS])
    assert a[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == len(ids)
    assert a[sc.MODEL_VERSION] == engine.version


async def test_async_chat_non_streaming_returns_and_records_exact_tokens(
    gateway: Gateway, engine: TransformersEngine
) -> None:
    [claim] = await claim_attempts(gateway.store, 1)
    client = gateway.client(rollout_url(gateway.url, claim))
    r = await client.chat.completions.create(
        model=engine.model_name, messages=MESSAGES, max_tokens=12, temperature=0.8, logprobs=True, top_logprobs=2
    )
    choice = r.choices[0]
    extra_ids = choice.model_extra["token_ids"] if choice.model_extra else None
    assert extra_ids and engine.decode(extra_ids).startswith(choice.message.content or "")
    assert r.model_extra and r.model_extra["prompt_token_ids"] == engine.encode_chat(MESSAGES, None)
    assert choice.logprobs and choice.logprobs.content and len(choice.logprobs.content) == len(extra_ids)
    assert len(choice.logprobs.content[0].top_logprobs) == 2
    assert r.usage and r.usage.completion_tokens == len(extra_ids)
    [span] = await spans_of(gateway, claim.rollout.id)
    check_exact(span, engine, MESSAGES)
    assert span.attributes[sc.RESPONSE_TOKEN_IDS] == extra_ids
    assert span.attributes[sc.GEN_AI_RESPONSE_ID] == r.id
    assert span.attempt_id == claim.attempt.id
    assert span.attributes[sc.GEN_AI_REQUEST_TEMPERATURE] == 0.8


async def test_streaming_and_non_streaming_record_the_same_kind_of_data(
    gateway: Gateway, engine: TransformersEngine
) -> None:
    [claim] = await claim_attempts(gateway.store, 1)
    client = gateway.client(rollout_url(gateway.url, claim))
    await client.chat.completions.create(model=engine.model_name, messages=MESSAGES, max_tokens=8)
    stream = await client.chat.completions.create(
        model=engine.model_name, messages=MESSAGES, max_tokens=8, stream=True, stream_options={"include_usage": True}
    )
    text, last_ids, usage = "", None, None
    async for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.delta.content or ""
            if c.finish_reason is not None:
                last_ids = c.model_extra["token_ids"] if c.model_extra else None
                assert chunk.model_extra and chunk.model_extra["prompt_token_ids"] == engine.encode_chat(MESSAGES, None)
    assert last_ids and engine.decode(last_ids).startswith(text)
    assert usage and usage.completion_tokens == len(last_ids)
    plain, streamed = await spans_of(gateway, claim.rollout.id)
    assert plain.attributes[STREAM] is False and streamed.attributes[STREAM] is True
    assert set(plain.attributes) == set(streamed.attributes)
    for span in (plain, streamed):
        check_exact(span, engine, MESSAGES)
    assert streamed.attributes[RESPONSE_TEXT] == text
    assert streamed.attributes[sc.RESPONSE_TOKEN_IDS] == last_ids


async def test_n_choices_give_one_span_each(gateway: Gateway, engine: TransformersEngine) -> None:
    [claim] = await claim_attempts(gateway.store, 1)
    client = gateway.client(rollout_url(gateway.url, claim))
    r = await client.chat.completions.create(model=engine.model_name, messages=MESSAGES, max_tokens=6, n=3, seed=7)
    assert [c.index for c in r.choices] == [0, 1, 2]
    stream = await client.chat.completions.create(
        model=engine.model_name, messages=MESSAGES, max_tokens=6, n=2, stream=True
    )
    finished: dict[int, list[int]] = {}
    async for chunk in stream:
        for c in chunk.choices:
            if c.finish_reason is not None:
                finished[c.index] = c.model_extra["token_ids"] if c.model_extra else []
    assert sorted(finished) == [0, 1]
    spans = await spans_of(gateway, claim.rollout.id)
    assert len(spans) == 5
    assert sorted(s.attributes[sc.CHOICE_INDEX] for s in spans) == [0, 0, 1, 1, 2]
    assert len({s.attributes[sc.GEN_AI_RESPONSE_ID] for s in spans}) == 2
    for span in spans:
        check_exact(span, engine, MESSAGES)


async def test_tools_are_rendered_into_the_prompt_and_tool_history_is_accepted(
    gateway: Gateway, engine: TransformersEngine
) -> None:
    [claim] = await claim_attempts(gateway.store, 1)
    client = gateway.client(rollout_url(gateway.url, claim))
    history: list[Any] = [
        *MESSAGES,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    r = await client.chat.completions.create(
        model=engine.model_name, messages=history, tools=TOOLS, tool_choice="auto", max_tokens=8
    )
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    stream = await client.chat.completions.create(
        model=engine.model_name, messages=history, tools=TOOLS, max_tokens=8, stream=True
    )
    async for _ in stream:
        pass
    spans = await spans_of(gateway, claim.rollout.id)
    assert len(spans) == 2
    for span in spans:
        check_exact(span, engine, history, TOOLS)
        assert "get_weather" in engine.decode(span.attributes[sc.PROMPT_TOKEN_IDS])
        calls = json.loads(span.attributes[sc.TOOL_CALLS])
        assert isinstance(calls, list)


async def test_sync_client(gateway: Gateway, engine: TransformersEngine) -> None:
    [claim] = await claim_attempts(gateway.store, 1)

    def calls() -> tuple[str, str]:
        client = openai.OpenAI(base_url=rollout_url(gateway.url, claim), api_key="unused")
        r = client.chat.completions.create(model=engine.model_name, messages=MESSAGES, max_tokens=5)
        s = client.chat.completions.create(model=engine.model_name, messages=MESSAGES, max_tokens=5, stream=True)
        streamed = "".join(c.choices[0].delta.content or "" for c in s if c.choices)
        client.close()
        return r.choices[0].message.content or "", streamed

    plain, streamed = await asyncio.to_thread(calls)  # the server runs on this test's loop
    spans = await spans_of(gateway, claim.rollout.id)
    assert [s.attributes[RESPONSE_TEXT] for s in spans] == [plain, streamed]
    for span in spans:
        check_exact(span, engine, MESSAGES)


async def test_completions_with_text_and_token_id_prompts(gateway: Gateway, engine: TransformersEngine) -> None:
    [claim] = await claim_attempts(gateway.store, 1)
    client = gateway.client(rollout_url(gateway.url, claim))
    prompt_ids = engine.encode_text("The weather today is")
    r1 = await client.completions.create(model=engine.model_name, prompt="The weather today is", max_tokens=5)
    r2 = await client.completions.create(model=engine.model_name, prompt=prompt_ids, max_tokens=5, logprobs=1)
    assert r2.choices[0].logprobs and len(r2.choices[0].logprobs.tokens or []) == len(
        r2.choices[0].model_extra["token_ids"] if r2.choices[0].model_extra else []
    )
    stream = await client.completions.create(model=engine.model_name, prompt=prompt_ids, max_tokens=5, stream=True)
    streamed = "".join([c.choices[0].text async for c in stream if c.choices])
    spans = await spans_of(gateway, claim.rollout.id)
    assert len(spans) == 3
    for span, text in zip(spans, (r1.choices[0].text, r2.choices[0].text, streamed), strict=True):
        assert span.attributes[sc.PROMPT_TOKEN_IDS] == prompt_ids
        assert span.attributes[API] == "completions"
        assert span.attributes[RESPONSE_TEXT] == text
        assert engine.decode(span.attributes[sc.RESPONSE_TOKEN_IDS]).startswith(text)


async def test_responses_api_as_the_agents_sdk_uses_it(gateway: Gateway, engine: TransformersEngine) -> None:
    [claim] = await claim_attempts(gateway.store, 1)
    client = gateway.client(rollout_url(gateway.url, claim))
    tools: list[Any] = [
        {
            "type": "function",
            "name": "get_weather",
            "description": "w",
            "parameters": TOOLS[0]["function"]["parameters"],
            "strict": True,
        }
    ]
    items: list[Any] = [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
        {"type": "function_call", "call_id": "call_9", "name": "get_weather", "arguments": '{"city":"Paris"}'},
        {"type": "function_call_output", "call_id": "call_9", "output": "sunny"},
    ]
    r = await client.responses.create(
        model="gpt-5.6-luna", instructions="Be brief.", input=items, tools=tools, max_output_tokens=8
    )
    assert r.id.startswith("resp_") and r.usage and r.usage.output_tokens > 0
    assert r.status in ("completed", "incomplete")
    events: list[str] = []
    final = None
    stream = await client.responses.create(model="gpt-5.6-luna", input="Say hi", max_output_tokens=8, stream=True)
    async for event in stream:
        events.append(event.type)
        if event.type in ("response.completed", "response.incomplete"):
            final = event.response
    assert events[0] == "response.created" and events[-1] in ("response.completed", "response.incomplete")
    assert final is not None and final.output_text
    spans = await spans_of(gateway, claim.rollout.id)
    assert [s.attributes[sc.GEN_AI_RESPONSE_ID] for s in spans] == [r.id, final.id]
    assert spans[1].attributes[RESPONSE_TEXT] == final.output_text
    expected = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_9",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_9", "content": "sunny"},
    ]
    chat_tools = [{"type": "function", "function": {k: tools[0][k] for k in ("name", "description", "parameters")}}]
    check_exact(spans[0], engine, expected, chat_tools)
    check_exact(spans[1], engine, [{"role": "user", "content": "Say hi"}])


async def test_models_lists_the_served_model_and_aliases(gateway: Gateway, engine: TransformersEngine) -> None:
    client = gateway.client()
    names = [m.id async for m in client.models.list()]
    assert names[0] == engine.model_name and "gpt-5.6-luna" in names
