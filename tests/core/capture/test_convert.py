"""Span shapes the installed instrumentations do not emit, read from hand-written attributes.

The other tests run the real instrumentations; these cover the attribute layouts of other releases
and of other emitters of the same conventions: OpenLLMetry's older flattened ``gen_ai.prompt.N.*``
/ ``gen_ai.completion.N.*``, GenAI ``execute_tool`` spans and OpenLLMetry's decorated agent/tool spans.
"""

from __future__ import annotations

from typing import Any

from lightning_rl.adapter import adapt_attempt
from lightning_rl.capture import captured_calls, captured_tools, normalize_messages
from lightning_rl.types import Rollout, Span, SpanStatus, Task


def _span(span_id: str, name: str, attrs: dict[str, Any], *, start: int, parent: str | None = None) -> Span:
    return Span(
        span_id=span_id,
        parent_id=parent,
        name=name,
        start_ns=start,
        end_ns=start + 10,
        attributes=attrs,
        rollout_id="ro",
        attempt_id="at",
        status=SpanStatus(code="error" if attrs.pop("_error", False) else "ok"),
    )


def test_older_openllmetry_attributes_and_decorated_agent_and_tool_spans() -> None:
    agent = _span("a1", "planner.agent", {"traceloop.span.kind": "agent", "traceloop.entity.name": "planner"}, start=0)
    call = _span(
        "c1",
        "openai.chat",
        {
            "llm.request.type": "chat",
            "gen_ai.request.model": "m",
            "gen_ai.response.id": "chatcmpl-1",
            "gen_ai.prompt.0.role": "user",
            "gen_ai.prompt.0.content": "weather?",
            "gen_ai.completion.0.role": "assistant",
            "gen_ai.completion.0.content": "",
            "gen_ai.completion.0.tool_calls.0.id": "call_1",
            "gen_ai.completion.0.tool_calls.0.name": "lookup",
            "gen_ai.completion.0.tool_calls.0.arguments": '{"city": "Oslo"}',
            "gen_ai.usage.input_tokens": 7,
        },
        start=1,
        parent="a1",
    )
    tool = _span(
        "t1",
        "execute_tool lookup",
        {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup", "gen_ai.tool.call.id": "call_1"},
        start=20,
    )
    decorated = _span("t2", "lookup.tool", {"traceloop.span.kind": "tool", "_error": True}, start=30)
    [got] = captured_calls([agent, call, tool, decorated])
    assert got.source == "openllmetry" and got.role == "planner" and got.input_tokens == 7
    assert got.messages == [{"role": "user", "content": "weather?"}]
    assert got.tool_calls == [{"id": "call_1", "name": "lookup", "arguments": '{"city": "Oslo"}'}]
    tools = captured_tools([agent, call, tool, decorated])
    assert [(t.name, t.failed, t.tool_call_id) for t in tools] == [
        ("lookup", False, "call_1"),
        ("lookup.tool", True, None),
    ]
    rollout = Rollout(task=Task(input=None))
    adapted = adapt_attempt(rollout, "at", [agent, call, tool], air={"tool_success": 0.5})
    [t] = adapted.transitions
    assert t.role == "planner" and t.reward == 0.5 and not t.exact_tokens


def test_messages_normalise_to_one_shape() -> None:
    openai_shape: list[Any] = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "name": "u"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c", "content": "ok"},
    ]
    genai_shape: list[Any] = [
        {"role": "user", "parts": [{"type": "text", "content": "ab"}]},
        {"role": "assistant", "parts": [{"type": "tool_call", "id": "c", "name": "f", "arguments": {}}]},
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c", "response": "ok"}]},
    ]
    assert (
        normalize_messages(openai_shape)
        == normalize_messages(genai_shape)
        == [
            {"role": "user", "content": "ab"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "name": "f", "arguments": "{}"}]},
            {"role": "tool", "content": "ok", "tool_call_id": "c"},
        ]
    )
