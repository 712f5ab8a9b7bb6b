"""Bad gateway input is refused the way the OpenAI API refuses it (400 naming the field), never a 500.

Issue 26.7: role ``"wizard"``, ``content: 123``, ``max_tokens: "5"`` or ``true``, a tool without its
function, junk ``logit_bias`` and an unknown ``previous_response_id`` were all answered 200.
"""

from __future__ import annotations

import copy
import random
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from lightning_rl.engine.hf import TransformersEngine
from lightning_rl.engine.tiny import default_tiny_model

from .gateway_helpers import GOOD_CHAT, assert_openai_error, serving


@pytest.fixture(scope="module")
def engine() -> Iterator[TransformersEngine]:
    eng = TransformersEngine.from_pretrained(default_tiny_model(), max_batch_size=8)
    yield eng
    eng.close()


@pytest.fixture
async def url(engine: TransformersEngine) -> AsyncIterator[str]:
    async with serving(engine) as root:
        yield root


def _chat(**changes: Any) -> dict[str, Any]:
    body = copy.deepcopy(GOOD_CHAT)
    body.update(changes)
    return body


TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        (_chat(messages=[{"role": "wizard", "content": "hi"}]), "messages[0].role", "invalid_value"),
        (_chat(messages=[{"content": "hi"}]), "messages[0].role", "missing_required_parameter"),
        (_chat(messages=[{"role": "user", "content": 123}]), "messages[0].content", "invalid_type"),
        (_chat(messages=[{"role": "user"}]), "messages[0].content", "missing_required_parameter"),
        (_chat(messages=[{"role": "user", "content": [1]}]), "messages[0].content[0]", "invalid_type"),
        (
            _chat(messages=[{"role": "user", "content": [{"type": "text"}]}]),
            "messages[0].content[0].text",
            "missing_required_parameter",
        ),
        (
            _chat(messages=[{"role": "user", "content": [{"type": "video", "url": "x"}]}]),
            "messages[0].content[0].type",
            "invalid_value",
        ),
        (_chat(messages=[{"role": "tool", "content": "42"}]), "messages[0].tool_call_id", "missing_required_parameter"),
        (
            _chat(messages=[{"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]}]),
            "messages[0].tool_calls[0].function",
            "missing_required_parameter",
        ),
        (_chat(messages="hi"), "messages", "invalid_type"),
        (_chat(messages=["hi"]), "messages[0]", "invalid_type"),
        (_chat(max_tokens="5"), "max_tokens", "invalid_type"),
        (_chat(max_tokens=True), "max_tokens", "invalid_type"),
        (_chat(max_tokens=2.5), "max_tokens", "invalid_type"),
        (_chat(max_tokens=0), "max_tokens", "invalid_value"),
        (_chat(max_completion_tokens=-3), "max_completion_tokens", "invalid_value"),
        (_chat(n="2"), "n", "invalid_type"),
        (_chat(n=0), "n", "invalid_value"),
        (_chat(temperature="hot"), "temperature", "invalid_type"),
        (_chat(temperature=True), "temperature", "invalid_type"),
        (_chat(stop=5), "stop", "invalid_type"),
        (_chat(stop=["a", 1]), "stop[1]", "invalid_type"),
        (_chat(stop=["a", "b", "c", "d", "e"]), "stop", "invalid_value"),
        (_chat(tools=[{"type": "function"}]), "tools[0].function", "missing_required_parameter"),
        (_chat(tools=[{"type": "function", "function": {}}]), "tools[0].function.name", "missing_required_parameter"),
        (_chat(tools=[{"type": "function", "function": {"name": "a b"}}]), "tools[0].function.name", "invalid_value"),
        (_chat(tools=[{"type": "retrieval"}]), "tools[0].type", "invalid_value"),
        (_chat(tools={"a": 1}), "tools", "invalid_type"),
        (_chat(tool_choice="sometimes", tools=[TOOL]), "tool_choice", "invalid_value"),
        (_chat(tool_choice="required"), "tool_choice", "invalid_value"),
        (_chat(tool_choice={"type": "function"}, tools=[TOOL]), "tool_choice.function", "missing_required_parameter"),
        (
            _chat(tool_choice={"type": "function", "function": {"name": "other"}}, tools=[TOOL]),
            "tool_choice",
            "invalid_value",
        ),
        (_chat(tool_choice=3), "tool_choice", "invalid_type"),
        (_chat(logit_bias="junk"), "logit_bias", "invalid_type"),
        (_chat(logit_bias={"hello": 5}), "logit_bias", "invalid_value"),
        (_chat(logit_bias={"50256": 500}), "logit_bias.50256", "invalid_value"),
        (_chat(logit_bias={"50256": "x"}), "logit_bias.50256", "invalid_type"),
        (_chat(logprobs="yes"), "logprobs", "invalid_type"),
        (_chat(top_logprobs=21), "top_logprobs", "invalid_value"),
        (_chat(seed=1.5), "seed", "invalid_type"),
        (_chat(model=7), "model", "invalid_type"),
        (_chat(response_format={"type": "xml"}), "response_format.type", "invalid_value"),
        # where a second (pydantic) pass used to answer in its own words with code null (issue 47)
        (_chat(top_p=0), "top_p", "invalid_value"),
        (_chat(seed=2**64), "seed", "invalid_type"),  # beyond 64 bits: parsed as a float
        (_chat(stream_options={"include_usage": "yes"}), "stream_options.include_usage", "invalid_type"),
        (
            _chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}]),
            "messages[0].content[0].type",
            "invalid_value",
        ),
        (_chat(n=100), "n", "invalid_value"),
    ],
)
async def test_chat_completions_bad_fields_are_400_naming_the_field(
    url: str, body: dict[str, Any], param: str, code: str
) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        error = assert_openai_error(await http.post(f"{url}/v1/chat/completions", json=body), 400, param)
    assert error["code"] == code
    assert error["type"] == "invalid_request_error"


async def test_valid_variants_still_served(url: str) -> None:
    """What the checks allow: content parts, tool turns, named tool choice, stop lists, logit bias."""
    bodies = [
        _chat(messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}]),
        _chat(
            messages=[
                {"role": "user", "content": "weather?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            ],
            tools=[TOOL],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
        ),
        _chat(stop=["a", "b"], logit_bias={"5": -100}, n=2, temperature=0, seed=-1),
        _chat(messages=[{"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi"}]),
    ]
    async with httpx.AsyncClient(timeout=60) as http:
        for body in bodies:
            r = await http.post(f"{url}/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "hi", "previous_response_id": "resp_123"}, "previous_response_id"),
        ({"input": 5}, "input"),
        ({}, "input"),
        ({"input": [{"role": "wizard", "content": "hi"}]}, "input[0].role"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
        ({"input": "hi", "max_output_tokens": "5"}, "max_output_tokens"),
        ({"input": "hi", "tools": [{"type": "function"}]}, "tools[0].name"),
        ({"input": "hi", "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
        ({"input": "hi", "top_p": 0}, "top_p"),
        ({"input": [{"type": "web_search_call"}]}, "input[0].type"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0].content[0].type"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": []}, "input"),
    ],
)
async def test_responses_bad_fields_are_400_naming_the_field(url: str, body: dict[str, Any], param: str) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        error = assert_openai_error(await http.post(f"{url}/v1/responses", json=body), 400, param)
    if param == "previous_response_id":
        assert error["code"] == "previous_response_not_found"
        assert "resp_123" in error["message"]


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"max_tokens": 2}, "prompt", "missing_required_parameter"),
        ({"prompt": "hi", "max_tokens": "2"}, "max_tokens", "invalid_type"),
        ({"prompt": {}}, "prompt", "invalid_type"),
        ({"prompt": ["a", 5]}, "prompt[1]", "invalid_type"),
        ({"prompt": [True]}, "prompt[0]", "invalid_type"),  # strict: true is no token id
        ({"prompt": [[1, "a"]]}, "prompt[0][1]", "invalid_type"),
        ({"prompt": []}, "prompt", "invalid_value"),
        ({"prompt": [[]]}, "prompt[0]", "invalid_value"),
        ({"prompt": ["a", "b"], "stream": True}, "prompt", "invalid_value"),
        ({"prompt": "hi", "logprobs": 50}, "logprobs", "invalid_value"),
        ({"prompt": "hi", "logprobs": -1}, "logprobs", "invalid_value"),
        ({"prompt": "hi", "top_p": 0}, "top_p", "invalid_value"),
    ],
)
async def test_completions_bad_fields_are_400(url: str, body: dict[str, Any], param: str, code: str) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        error = assert_openai_error(await http.post(f"{url}/v1/completions", json=body), 400, param)
    assert error["code"] == code


# --- fuzz: many malformed bodies, never a 500 ---------------------------------------------------------

_JUNK: list[Any] = [
    None,
    0,
    -1,
    2**70,
    1.5,
    -1e308,
    True,
    "",
    "5",
    "x" * 300,
    [],
    [None],
    [1, "a"],
    {},
    {"a": {"b": [1]}},
    {"type": "function"},
    {"role": "user"},
    [{"role": 1}],
    [{"type": "text", "text": 5}],
]


def _mutations(rng: random.Random, base: dict[str, Any], keys: list[str], n: int) -> Iterator[dict[str, Any]]:
    """Bodies made from ``base`` by replacing, deleting or nesting junk into a few fields."""
    for _ in range(n):
        body = copy.deepcopy(base)
        for _ in range(rng.randint(1, 3)):
            key = rng.choice(keys)
            action = rng.random()
            if action < 0.15:
                body.pop(key, None)
            elif action < 0.3 and isinstance(body.get(key), list) and body[key]:
                item = body[key][0]
                if isinstance(item, dict) and item:
                    item[rng.choice(list(item))] = rng.choice(_JUNK)
                else:
                    body[key][0] = rng.choice(_JUNK)
            else:
                body[key] = rng.choice(_JUNK)
        yield body


def _assert_openai_wording(r: httpx.Response) -> None:
    """An error as OpenAI words it: a message, a code, and none of pydantic's phrases (issue 47)."""
    error = r.json()["error"]
    assert error["message"] and error["code"], r.text
    assert "Input should" not in error["message"] and "invalid request:" not in error["message"], r.text


async def test_fuzzed_bodies_never_get_a_5xx(url: str) -> None:
    rng = random.Random(26)
    chat = {
        **GOOD_CHAT,
        "tools": [TOOL],
        "tool_choice": "auto",
        "stop": ["\n"],
        "logit_bias": {"5": 1},
        "temperature": 0.5,
        "n": 1,
    }
    chat_keys = [*chat, "max_completion_tokens", "top_logprobs", "logprobs", "seed", "stream", "response_format"]
    responses = {"input": [{"role": "user", "content": "hi"}], "max_output_tokens": 2, "tools": []}
    responses_keys = [*responses, "instructions", "tool_choice", "previous_response_id", "temperature"]
    completions = {"prompt": "hi", "max_tokens": 2}
    completions_keys = [*completions, "n", "stop", "logprobs", "echo", "seed"]
    cases: list[tuple[str, Any]] = []
    cases += [("chat/completions", b) for b in _mutations(rng, chat, chat_keys, 250)]
    cases += [("responses", b) for b in _mutations(rng, responses, responses_keys, 120)]
    cases += [("completions", b) for b in _mutations(rng, completions, completions_keys, 80)]
    raw = [b"", b"null", b"[]", b"{", b'{"messages": [{"role": "user", "content": "\xff"}]}', b"\x00" * 64]
    statuses: dict[int, int] = {}
    async with httpx.AsyncClient(timeout=60) as http:
        for endpoint, body in cases:
            if isinstance(body, dict) and body.get("stream") is True:
                body["stream"] = False  # streamed answers are covered by the 200s below; keep this fast
            r = await http.post(f"{url}/v1/{endpoint}", json=body)
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            assert r.status_code < 500, (endpoint, body, r.text)
            if r.status_code >= 400:
                _assert_openai_wording(r)
        for content in raw:
            for endpoint in ("chat/completions", "responses", "completions"):
                r = await http.post(f"{url}/v1/{endpoint}", content=content)
                assert 400 <= r.status_code < 500, (endpoint, content, r.text)
                _assert_openai_wording(r)
        assert (await http.post(f"{url}/v1/chat/completions", json=GOOD_CHAT)).status_code == 200
    assert statuses.get(400, 0) > 200  # most mutations are refused …
    assert statuses.get(200, 0) > 0  # … and the harmless ones served
