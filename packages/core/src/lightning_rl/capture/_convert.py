"""Spans of the standard LLM instrumentations -> model calls as text, ready to become transitions.

Two families instrument OpenAI-compatible clients and agent frameworks with OpenTelemetry, each
with its own attribute names:

* **OpenLLMetry** (``opentelemetry-instrumentation-openai``) follows the OpenTelemetry GenAI
  conventions: ``gen_ai.input.messages`` / ``gen_ai.output.messages`` as JSON lists of
  ``{"role", "parts"}`` (older releases flatten them as ``gen_ai.prompt.N.*`` /
  ``gen_ai.completion.N.*``), ``gen_ai.response.id``, ``gen_ai.usage.*``.
* **OpenInference** (``openinference-instrumentation-*``) marks spans with
  ``openinference.span.kind`` and records the request and response in ``input.value`` /
  ``output.value`` plus flattened ``llm.input_messages.N.message.*`` / ``llm.output_messages.*``.

Everything here reads the Lightning ``Span`` copies stored for an attempt (never OpenTelemetry
objects), so spans that reached the store by OTLP from another process convert the same way.

One model call is often seen twice: a framework span (LangChain's ``ChatOpenAI``, the Agents SDK's
``generation``) and the client span of the OpenAI instrumentation under it or beside it, or the
two families both installed. Such spans are merged into one call, joined on the parent/child link,
on the response id, or (streamed calls of frameworks that lose the id) on the same response in
overlapping time. The client span, closest to the wire, gives the text; any of them gives the role.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from lightning_rl import semconv
from lightning_rl.langchain_runs import response_id_of, role_from_metadata
from lightning_rl.types import Span

__all__ = [
    "Source",
    "CapturedCall",
    "CapturedTool",
    "captured_calls",
    "captured_tools",
    "call_spans",
    "capture_source",
    "normalize_messages",
    "normalize_tool_calls",
]

Source = Literal["openllmetry", "openinference"]

_OI_MESSAGE = re.compile(r"^llm\.(input|output)_messages\.(\d+)\.message\.(.+)$")
_OI_TOOL_CALL = re.compile(r"^tool_calls\.(\d+)\.tool_call\.(id|function\.name|function\.arguments)$")
_OI_CONTENT_PART = re.compile(r"^contents\.(\d+)\.message_content\.(type|text)$")
_OL_LEGACY = re.compile(r"^gen_ai\.(prompt|completion)\.(\d+)\.(.+)$")
_OL_LEGACY_TOOL = re.compile(r"^tool_calls\.(\d+)\.(id|name|arguments)$")
_OI_TOOL_SCHEMA = re.compile(r"^llm\.tools\.(\d+)\.tool\.json_schema$")
_LLM_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})


# --------------------------------------------------------------------------------------------
# Messages in one shape (OpenAI chat), whatever recorded them
# --------------------------------------------------------------------------------------------


def _json(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value


def _arguments(value: Any) -> str:
    """Tool-call arguments as the JSON text the model produced (a parsed dict is serialised again)."""
    if isinstance(value, str):
        return value
    return json.dumps(value if value is not None else {})


def _content_text(content: Any) -> str:
    """A message's content as text: a string as is, a list of parts joined, anything else as JSON."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts: list[str] = []
        for part in cast(list[Any], content):
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict):
                p = cast(dict[str, Any], part)
                text = p.get("text", p.get("content"))
                if isinstance(text, str) and p.get("type", "text") in ("text", "input_text", "output_text"):
                    texts.append(text)
        return "".join(texts)
    return json.dumps(content)


def normalize_tool_calls(calls: Any) -> list[dict[str, Any]]:
    """Tool calls as ``[{"id", "name", "arguments"}]`` from the OpenAI shape or a flat one."""
    out: list[dict[str, Any]] = []
    if not isinstance(calls, list):
        return out
    for raw in cast(list[Any], calls):
        if not isinstance(raw, dict):
            continue
        call = cast(dict[str, Any], raw)
        fn = call.get("function")
        fn_map = cast(dict[str, Any], fn) if isinstance(fn, dict) else call
        out.append(
            {
                "id": str(call.get("id") or ""),
                "name": str(fn_map.get("name") or ""),
                "arguments": _arguments(fn_map.get("arguments", fn_map.get("args"))),
            }
        )
    return out


def _normalize_message(raw: Mapping[str, Any]) -> dict[str, Any]:
    """One message as ``{"role", "content"}`` plus ``tool_calls`` / ``tool_call_id`` when present."""
    role = str(raw.get("role") or "user")
    parts = raw.get("parts")
    if isinstance(parts, list) and "content" not in raw:  # GenAI conventions: typed parts
        text: list[str] = []
        calls: list[dict[str, Any]] = []
        call_id: str | None = None
        for p in cast(list[Any], parts):
            if not isinstance(p, dict):
                continue
            part = cast(dict[str, Any], p)
            kind = part.get("type")
            if kind == "text":
                text.append(_content_text(part.get("content")))
            elif kind == "tool_call":
                calls.append(
                    {
                        "id": str(part.get("id") or ""),
                        "name": str(part.get("name") or ""),
                        "arguments": _arguments(part.get("arguments")),
                    }
                )
            elif kind == "tool_call_response":
                call_id = str(part.get("id") or "") or None
                response = part.get("response")
                text.append(response if isinstance(response, str) else json.dumps(response))
        message: dict[str, Any] = {"role": role, "content": "".join(text)}
        if calls:
            message["tool_calls"] = calls
        if call_id:
            message["tool_call_id"] = call_id
        return message
    message = {"role": role, "content": _content_text(raw.get("content"))}
    calls = normalize_tool_calls(raw.get("tool_calls"))
    if calls:
        message["tool_calls"] = calls
    if raw.get("tool_call_id"):
        message["tool_call_id"] = str(raw["tool_call_id"])
    return message


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    """A conversation in one comparable shape: role, content text, tool calls, tool-call id.

    The gateway's record of a request and both instrumentation families normalise through this,
    so the same conversation compares equal whichever path recorded it. Other fields (``name``,
    images) are dropped: they differ between what a framework holds and what it sends.
    """
    if not isinstance(messages, list):
        return []
    return [_normalize_message(cast(dict[str, Any], m)) for m in cast(list[Any], messages) if isinstance(m, dict)]


def _tool_definitions(value: Any) -> list[dict[str, Any]] | None:
    """Tool definitions in the OpenAI shape ``{"type": "function", "function": {...}}``."""
    if not isinstance(value, list) or not value:
        return None
    out: list[dict[str, Any]] = []
    for raw in cast(list[Any], value):
        if not isinstance(raw, dict):
            continue
        tool = cast(dict[str, Any], raw)
        if isinstance(tool.get("function"), dict):
            out.append({"type": "function", "function": tool["function"]})
        else:
            fn = {k: v for k, v in tool.items() if k in ("name", "description", "parameters")}
            out.append({"type": "function", "function": fn})
    return out or None


# --------------------------------------------------------------------------------------------
# One call per family
# --------------------------------------------------------------------------------------------


@dataclass
class CapturedCall:
    """One model call as an instrumentation recorded it: text only, no token ids."""

    span: Span
    source: Source
    messages: list[dict[str, Any]]
    response: str
    tool_calls: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    model: str | None = None
    response_id: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    finish_reasons: list[str] = field(default_factory=list[str])
    role: str | None = None
    wire: bool = False
    """True when the span is the client's own (the request as sent), not a framework's view of it."""

    @property
    def start_ns(self) -> int:
        return self.span.start_ns

    @property
    def end_ns(self) -> int:
        return self.span.end_ns or self.span.start_ns


def capture_source(span: Span) -> Source | None:
    """Which family recorded ``span`` as a model call (None: not a captured model call)."""
    attrs = span.attributes
    if span.name == semconv.SPAN_LLM_CALL:
        return None
    if attrs.get(semconv.OI_SPAN_KIND) == "LLM":
        return "openinference"
    if attrs.get(semconv.GEN_AI_OPERATION_NAME) in _LLM_OPERATIONS or attrs.get("llm.request.type") == "chat":
        if semconv.GEN_AI_INPUT_MESSAGES in attrs or any(k.startswith("gen_ai.prompt.") for k in attrs):
            return "openllmetry"
    return None


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _oi_flattened(attrs: Mapping[str, Any], direction: str) -> list[dict[str, Any]]:
    """``llm.<direction>_messages.N.message.*`` back into a list of OpenAI-shaped messages."""
    found: dict[int, dict[str, Any]] = {}
    calls: dict[int, dict[int, dict[str, Any]]] = {}
    parts: dict[int, dict[int, dict[str, Any]]] = {}
    for key, value in attrs.items():
        m = _OI_MESSAGE.match(key)
        if m is None or m.group(1) != direction:
            continue
        index, rest = int(m.group(2)), m.group(3)
        message = found.setdefault(index, {})
        tc = _OI_TOOL_CALL.match(rest)
        cp = _OI_CONTENT_PART.match(rest)
        if tc is not None:
            calls.setdefault(index, {}).setdefault(int(tc.group(1)), {})[tc.group(2).rsplit(".", 1)[-1]] = value
        elif cp is not None:
            parts.setdefault(index, {}).setdefault(int(cp.group(1)), {})[cp.group(2)] = value
        elif rest in ("role", "content", "tool_call_id", "name"):
            message[rest] = value
    out: list[dict[str, Any]] = []
    for index in sorted(found):
        message = found[index]
        if "content" not in message and index in parts:
            message["content"] = [parts[index][k] for k in sorted(parts[index])]
        if index in calls:
            message["tool_calls"] = [calls[index][k] for k in sorted(calls[index])]
        out.append(message)
    return out


def _openinference_call(span: Span) -> CapturedCall:
    attrs = span.attributes
    request = _json(attrs.get(semconv.OI_INPUT_VALUE))
    output = _json(attrs.get(semconv.OI_OUTPUT_VALUE))
    wire = isinstance(request, dict) and isinstance(cast(dict[str, Any], request).get("messages"), list)
    request_map = cast(dict[str, Any], request) if wire else {}
    if wire and all(isinstance(m, dict) and "role" in m for m in request_map["messages"]):
        messages = normalize_messages(request_map["messages"])
    else:
        messages = normalize_messages(_oi_flattened(attrs, "input"))
        wire = False
    outputs = normalize_messages(_oi_flattened(attrs, "output"))
    response = outputs[0] if outputs else {"content": "", "role": "assistant"}
    tools = _tool_definitions(request_map.get("tools")) if wire else None
    if tools is None:
        schemas = sorted(
            (int(m.group(1)), _json(v)) for k, v in attrs.items() if (m := _OI_TOOL_SCHEMA.match(k)) is not None
        )
        tools = _tool_definitions([s for _, s in schemas])
    response_id: str | None = None
    if isinstance(output, dict):
        out_map = cast(dict[str, Any], output)
        rid = out_map.get("id")
        response_id = rid if isinstance(rid, str) and "generations" not in out_map else response_id_of(out_map)
    finish = attrs.get("llm.finish_reason")
    return CapturedCall(
        span=span,
        source="openinference",
        messages=messages,
        response=str(response.get("content") or ""),
        tool_calls=cast(list[dict[str, Any]], response.get("tool_calls", [])),
        tools=tools,
        model=cast(str | None, attrs.get(semconv.OI_MODEL_NAME)),
        response_id=response_id,
        input_tokens=_int(attrs.get(semconv.OI_TOKEN_COUNT_PROMPT)),
        output_tokens=_int(attrs.get(semconv.OI_TOKEN_COUNT_COMPLETION)),
        finish_reasons=[str(finish)] if finish else [],
        wire=wire,
    )


def _openllmetry_legacy(attrs: Mapping[str, Any], kind: str) -> list[dict[str, Any]]:
    """The older flattened ``gen_ai.prompt.N.*`` / ``gen_ai.completion.N.*`` messages."""
    found: dict[int, dict[str, Any]] = {}
    for key, value in attrs.items():
        m = _OL_LEGACY.match(key)
        if m is None or m.group(1) != kind:
            continue
        message = found.setdefault(int(m.group(2)), {})
        rest = m.group(3)
        tc = _OL_LEGACY_TOOL.match(rest)
        if tc is not None:
            message.setdefault("_calls", {}).setdefault(int(tc.group(1)), {})[tc.group(2)] = value
        else:
            message[rest] = value
    out: list[dict[str, Any]] = []
    for index in sorted(found):
        message = found[index]
        raw_calls: dict[int, dict[str, Any]] = message.pop("_calls", {})
        if raw_calls:
            message["tool_calls"] = [raw_calls[k] for k in sorted(raw_calls)]
        out.append(message)
    return out


def _openllmetry_call(span: Span) -> CapturedCall:
    attrs = span.attributes
    inputs = _json(attrs.get(semconv.GEN_AI_INPUT_MESSAGES))
    outputs = _json(attrs.get(semconv.GEN_AI_OUTPUT_MESSAGES))
    messages = normalize_messages(inputs if isinstance(inputs, list) else _openllmetry_legacy(attrs, "prompt"))
    responses = normalize_messages(outputs if isinstance(outputs, list) else _openllmetry_legacy(attrs, "completion"))
    response = responses[0] if responses else {"content": ""}
    finish = attrs.get(semconv.GEN_AI_RESPONSE_FINISH_REASONS)
    finish_list = [str(f) for f in cast(list[Any], finish)] if isinstance(finish, list) else []
    rid = attrs.get(semconv.GEN_AI_RESPONSE_ID)
    return CapturedCall(
        span=span,
        source="openllmetry",
        messages=messages,
        response=str(response.get("content") or ""),
        tool_calls=cast(list[dict[str, Any]], response.get("tool_calls", [])),
        tools=_tool_definitions(_json(attrs.get(semconv.GEN_AI_TOOL_DEFINITIONS))),
        model=cast(str | None, attrs.get(semconv.GEN_AI_RESPONSE_MODEL) or attrs.get(semconv.GEN_AI_REQUEST_MODEL)),
        response_id=rid if isinstance(rid, str) and rid else None,
        input_tokens=_int(attrs.get(semconv.GEN_AI_USAGE_INPUT_TOKENS)),
        output_tokens=_int(attrs.get(semconv.GEN_AI_USAGE_OUTPUT_TOKENS)),
        finish_reasons=finish_list,
        wire=True,
    )


# --------------------------------------------------------------------------------------------
# Roles: what the framework named, nearest span first
# --------------------------------------------------------------------------------------------


def _langchain_role(metadata: Any) -> str | None:
    """The role in a LangChain run's metadata (OpenInference records it), as the LangChain plugin names it."""
    meta = _json(metadata)
    return role_from_metadata(cast(dict[str, Any], meta)).role if isinstance(meta, dict) else None


def _own_role(span: Span) -> str | None:
    attrs = span.attributes
    explicit = attrs.get(semconv.ROLE)
    if isinstance(explicit, str) and explicit:
        return explicit
    role = _langchain_role(attrs.get(semconv.OI_METADATA))
    if role is not None:
        return role
    if attrs.get(semconv.OI_SPAN_KIND) == "AGENT":
        for key in (semconv.OI_AGENT_NAME, semconv.OI_GRAPH_NODE_ID):
            if isinstance(attrs.get(key), str) and attrs[key]:
                return cast(str, attrs[key])
    name = attrs.get(semconv.GEN_AI_AGENT_NAME)
    if isinstance(name, str) and name:
        return name
    if attrs.get(semconv.TRACELOOP_SPAN_KIND) == "agent" and isinstance(attrs.get(semconv.TRACELOOP_ENTITY_NAME), str):
        return cast(str, attrs[semconv.TRACELOOP_ENTITY_NAME])
    return None


def _role(span: Span, by_id: Mapping[str, Span]) -> str | None:
    seen: set[str] = set()
    current: Span | None = span
    while current is not None and current.span_id not in seen:
        seen.add(current.span_id)
        role = _own_role(current)
        if role is not None:
            return role
        current = by_id.get(current.parent_id) if current.parent_id else None
    return None


def _ancestors(span: Span, by_id: Mapping[str, Span]) -> set[str]:
    out: set[str] = set()
    current = by_id.get(span.parent_id) if span.parent_id else None
    while current is not None and current.span_id not in out:
        out.add(current.span_id)
        current = by_id.get(current.parent_id) if current.parent_id else None
    return out


# --------------------------------------------------------------------------------------------
# Calls of one attempt, each once
# --------------------------------------------------------------------------------------------


def _same_call(a: CapturedCall, b: CapturedCall) -> bool:
    if a.response_id and b.response_id:
        return a.response_id == b.response_id
    overlap = a.start_ns <= b.end_ns and b.start_ns <= a.end_ns
    names = [c["name"] for c in a.tool_calls] == [c["name"] for c in b.tool_calls]
    return overlap and names and a.response == b.response and len(a.messages) == len(b.messages)


def _merge(group: Sequence[CapturedCall]) -> CapturedCall:
    """One call from the spans that saw it: the wire-level span's text, the first role any of them names."""
    best = sorted(group, key=lambda c: (not c.wire, c.response_id is None, c.start_ns))[0]
    best.role = next((c.role for c in group if c.role is not None), None)
    best.response_id = best.response_id or next((c.response_id for c in group if c.response_id), None)
    best.tools = best.tools or next((c.tools for c in group if c.tools), None)
    return best


def captured_calls(spans: Iterable[Span]) -> list[CapturedCall]:
    """The model calls recorded by OpenLLMetry or OpenInference among ``spans``, each once, by start time.

    ``spans`` are one attempt's spans (any order). A captured span whose descendant is also a
    captured call is the same call seen by a framework; so are two calls with the same response
    id, or, without ids, the same response over overlapping time: each group becomes one call.
    """
    every = list(spans)
    by_id = {s.span_id: s for s in every}
    raw: list[CapturedCall] = []
    for span in every:
        source = capture_source(span)
        if source is None:
            continue
        call = _openinference_call(span) if source == "openinference" else _openllmetry_call(span)
        call.role = _role(span, by_id)
        raw.append(call)
    # a framework's call span with the client's span inside it: same call
    ids = {c.span.span_id for c in raw}
    outer_of: dict[str, str] = {}
    for call in raw:
        for ancestor in _ancestors(call.span, by_id):
            if ancestor in ids:
                outer_of.setdefault(ancestor, call.span.span_id)
    groups: list[list[CapturedCall]] = []
    for call in sorted(raw, key=lambda c: (c.start_ns, c.span.seq)):
        for group in groups:
            linked = any(
                outer_of.get(g.span.span_id) == call.span.span_id or outer_of.get(call.span.span_id) == g.span.span_id
                for g in group
            )
            if linked or any(_same_call(g, call) for g in group):
                group.append(call)
                break
        else:
            groups.append([call])
    merged = [_merge(g) for g in groups]
    return sorted(merged, key=lambda c: (c.start_ns, c.span.seq))


def _as_call_span(call: CapturedCall) -> Span:
    """A captured call shaped like the gateway's ``llm.call`` span, for views (no token ids)."""
    attrs: dict[str, Any] = {
        semconv.GEN_AI_INPUT_MESSAGES: json.dumps(call.messages),
        semconv.RESPONSE_TEXT: call.response,
        semconv.RESPONSE_CONTENT: call.response,
        semconv.TOOL_CALLS: json.dumps(call.tool_calls),
        semconv.TOKENS_EXACT: False,
        semconv.API: "chat.completions",
        semconv.GEN_AI_RESPONSE_ID: call.response_id,
        semconv.GEN_AI_RESPONSE_MODEL: call.model,
        semconv.GEN_AI_USAGE_INPUT_TOKENS: call.input_tokens,
        semconv.GEN_AI_USAGE_OUTPUT_TOKENS: call.output_tokens,
        semconv.GEN_AI_RESPONSE_FINISH_REASONS: call.finish_reasons,
        "lightning.capture.source": call.source,
    }
    if call.role is not None:
        attrs[semconv.ROLE] = call.role
    return call.span.model_copy(update={"name": semconv.SPAN_LLM_CALL, "attributes": attrs})


def call_spans(spans: Iterable[Span]) -> list[Span]:
    """Every model call of an attempt as an ``llm.call`` span, by start time: the gateway's own, plus
    each captured call the gateway did not serve (``lightning.tokens_exact`` False, no token ids).

    For views (the dashboard's calls); the adapter reads captured calls with ``captured_calls``.
    """
    every = list(spans)
    gateway = [s for s in every if s.name == semconv.SPAN_LLM_CALL]
    served = {s.attributes.get(semconv.GEN_AI_RESPONSE_ID) for s in gateway}
    extra = [_as_call_span(c) for c in captured_calls(every) if c.response_id is None or c.response_id not in served]
    return sorted(gateway + extra, key=lambda s: (s.start_ns, s.seq))


# --------------------------------------------------------------------------------------------
# Tool executions (AIR)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CapturedTool:
    """A tool execution recorded by an instrumentation: what AIR needs of it."""

    span: Span
    name: str | None
    failed: bool
    tool_call_id: str | None
    role: str | None


def captured_tools(spans: Iterable[Span]) -> list[CapturedTool]:
    """OpenInference ``TOOL`` spans and GenAI ``execute_tool`` / OpenLLMetry ``tool`` spans among ``spans``."""
    every = list(spans)
    out: list[CapturedTool] = []
    for span in every:
        attrs = span.attributes
        if span.name == semconv.SPAN_TOOL:
            continue  # a Lightning plugin's tool span: the adapter reads it directly
        if attrs.get(semconv.OI_SPAN_KIND) == "TOOL":
            name = attrs.get(semconv.OI_TOOL_NAME)
            if not name:  # the Agents SDK's handoffs are TOOL spans too, without a tool name: not a tool run
                continue
            call_id = attrs.get(semconv.OI_TOOL_ID) or attrs.get(semconv.OI_TOOL_CALL_ID)
        elif attrs.get(semconv.GEN_AI_OPERATION_NAME) == semconv.GEN_AI_OPERATION_EXECUTE_TOOL:
            name = attrs.get(semconv.GEN_AI_TOOL_NAME)
            call_id = attrs.get(semconv.GEN_AI_TOOL_CALL_ID)
        elif attrs.get(semconv.TRACELOOP_SPAN_KIND) == "tool":
            name = attrs.get(semconv.TRACELOOP_ENTITY_NAME) or span.name
            call_id = None
        else:
            continue
        explicit = attrs.get(semconv.ROLE)
        out.append(
            CapturedTool(
                span=span,
                name=str(name) if name else None,
                failed=span.status.code == "error",
                tool_call_id=str(call_id) if call_id else None,
                role=str(explicit) if explicit else None,
            )
        )
    return out
