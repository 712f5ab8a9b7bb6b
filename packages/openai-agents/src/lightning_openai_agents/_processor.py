"""A tracing processor that learns, from the Agents SDK's own span tree, which agent made each call.

The SDK opens an ``AgentSpanData`` span for every agent it runs (a new one after each handoff) and,
below it, a ``GenerationSpanData`` (chat completions) or ``ResponseSpanData`` (responses API) span
around every model call and a ``FunctionSpanData`` span around every function-tool call. The span
that is current while the SDK sends a request is therefore a generation/response span whose
ancestors include the calling agent's span: walking up gives the agent's name *at request time*,
which the routing hook turns into a role URL on the gateway (exact, whatever runs concurrently).

When a generation ends, its output lists the tool calls (ids, names, arguments) the model asked
for; the function spans that follow in the same turn are matched to them by name and arguments, so
each tool span carries the model's tool-call id (the adapter's exact join for AIR). A failed tool
shows up as the function span's ``error`` (the SDK has no tool-error hook; 0.24 redacts the text,
which does not matter: the signal is the failure itself).

Every callback is :func:`~lightning_rl.plugins.guarded`: a bug here never reaches the host.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from agents.tracing import (
    AgentSpanData,
    FunctionSpanData,
    GenerationSpanData,
    ResponseSpanData,
    Span,
    Trace,
    TracingProcessor,
    get_current_span,
)

from lightning_rl.plugins import ToolCallRef, guarded, record_role, record_tool, same_arguments, tool_calls_in

__all__ = ["LightningTracingProcessor"]


def _error_text(error: Mapping[str, Any]) -> str:
    """The most specific text of a span error (``data.error`` when the SDK kept it)."""
    data = error.get("data")
    detail = data.get("error") if isinstance(data, Mapping) else None  # pyright: ignore[reportUnknownMemberType]
    message = str(error.get("message") or "tool failed")
    return f"{message}: {detail}" if detail else message


class LightningTracingProcessor(TracingProcessor):
    """Maps spans to agent names; records roles (with trainable flags) and tool executions.

    Args:
        trainable: Asked for each agent name; a bool is recorded as the role's trainable flag,
            None records nothing (the trainer decides).
    """

    def __init__(self, trainable: Callable[[str], bool | None]) -> None:
        self._trainable = trainable
        self._lock = threading.Lock()
        self._parent: dict[str, str | None] = {}  # span id -> parent span id
        self._agent: dict[str, str] = {}  # agent span id -> agent name
        self._by_trace: dict[str, set[str]] = {}  # trace id -> its live span ids (for spans never ended)
        self._pending: dict[str, list[ToolCallRef]] = {}  # turn (parent) span id -> unclaimed tool calls

    # --- lookups --------------------------------------------------------------------------------

    def agent_of(self, span_id: str | None) -> str | None:
        """The name of the nearest agent span at or above ``span_id`` (None if unknown)."""
        seen = 0
        with self._lock:
            while span_id is not None and seen < 256:
                name = self._agent.get(span_id)
                if name is not None:
                    return name
                span_id = self._parent.get(span_id)
                seen += 1
        return None

    def current_agent(self) -> str | None:
        """The agent whose code is running now (from the SDK's current span), or None."""
        try:
            span = get_current_span()
            return None if span is None else self.agent_of(span.span_id)
        except Exception:  # a lookup must never fail the host's request
            return None

    @property
    def tracked_spans(self) -> int:
        """How many spans are remembered (each is forgotten when it ends, or when its trace ends)."""
        with self._lock:
            return len(self._parent)

    # --- TracingProcessor -----------------------------------------------------------------------

    def on_trace_start(self, trace: Trace) -> None:
        return None

    @guarded
    def on_trace_end(self, trace: Trace) -> None:
        with self._lock:
            self._drop(self._by_trace.pop(trace.trace_id, set()))

    def _drop(self, span_ids: Iterable[str]) -> None:
        for span_id in span_ids:
            self._parent.pop(span_id, None)
            self._agent.pop(span_id, None)
            self._pending.pop(span_id, None)

    @guarded
    def on_span_start(self, span: Span[Any]) -> None:
        with self._lock:
            self._parent[span.span_id] = span.parent_id
            self._by_trace.setdefault(span.trace_id, set()).add(span.span_id)
            data = span.span_data
            if isinstance(data, AgentSpanData):
                self._agent[span.span_id] = data.name

    @guarded
    def on_span_end(self, span: Span[Any]) -> None:
        data = span.span_data
        if isinstance(data, GenerationSpanData):
            self._model_call_ended(span, None, tool_calls_in(data.output))
        elif isinstance(data, ResponseSpanData):
            response = data.response
            response_id = str(response.id) if response is not None and response.id else None
            self._model_call_ended(span, response_id, tool_calls_in([response] if response is not None else None))
        elif isinstance(data, FunctionSpanData):
            self._tool_ended(span, data)
        self._forget(span)

    @guarded
    def _forget(self, span: Span[Any]) -> None:
        """Drop an ended span: its children ended before it, so nothing asks about it any more.
        (One trace may wrap a whole training loop; waiting for its end would grow without bound.)"""
        with self._lock:
            self._drop([span.span_id])
            live = self._by_trace.get(span.trace_id)
            if live is not None:
                live.discard(span.span_id)
                if not live:
                    del self._by_trace[span.trace_id]

    def shutdown(self) -> None:
        with self._lock:
            self._drop(list(self._parent))
            self._by_trace.clear()

    def force_flush(self) -> None:
        return None

    # --- recording ------------------------------------------------------------------------------

    def _model_call_ended(self, span: Span[Any], response_id: str | None, calls: list[ToolCallRef]) -> None:
        agent = self.agent_of(span.span_id)
        if calls and span.parent_id is not None:
            with self._lock:
                self._pending.setdefault(span.parent_id, []).extend(calls)
        if agent is None:
            return
        trainable = self._trainable(agent)
        if response_id is not None or trainable is not None:
            # The call already carries the role (role URL); this adds the exact response-id join
            # and the user's trainable flag for the role.
            record_role(agent, response_id=response_id, trainable=trainable, agent_name=agent)

    def _claim_call(self, turn_id: str | None, name: str, arguments: str | None) -> ToolCallRef | None:
        """The first unclaimed call of ``name`` (same arguments when known) requested in the turn."""
        if turn_id is None:
            return None
        with self._lock:
            calls = self._pending.get(turn_id, [])
            for i, call in enumerate(calls):
                if call.name == name and same_arguments(call.arguments, arguments):
                    return calls.pop(i)
        return None

    def _tool_ended(self, span: Span[Any], data: FunctionSpanData) -> None:
        call = self._claim_call(span.parent_id, data.name, data.input)
        error = span.error
        record_tool(
            data.name,
            call_id=call.call_id if call is not None else None,
            role=self.agent_of(span.span_id),
            error=_error_text(error) if error else None,
            arguments=data.input if data.input is not None else (call.arguments if call is not None else None),
            output=None if data.output is None else str(data.output),
        )
