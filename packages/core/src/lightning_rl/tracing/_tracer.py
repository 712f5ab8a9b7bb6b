"""Rewards, signals and a light built-in tracer, all attributed to the current rollout.

The built-in tracer exists for agents and plugins that do not want OpenTelemetry: ``span(name)``
records start, end, status and exceptions, nests through a context variable, and hands the finished
``Span`` to the rollout's sink. ``emit_reward`` and ``emit_signal`` are zero-length spans with
well-known names (``lightning.reward``, ``lightning.signal``) the adapter reads.

Every function here is a no-op outside a rollout (with a debug log): an agent instrumented for
training must still run unchanged in production, where no rollout context exists.
"""

from __future__ import annotations

import logging
import math
import numbers
import time
import traceback
import uuid
from collections.abc import Generator, Mapping
from contextlib import contextmanager
from typing import Any, Literal

from lightning_rl import semconv
from lightning_rl.tracing._context import RolloutContext, current_rollout, current_span_id
from lightning_rl.types import Span, SpanEvent, SpanStatus

__all__ = [
    "SpanHandle",
    "span",
    "start_span",
    "emit_span",
    "emit_reward",
    "emit_signal",
    "clean_attributes",
    "as_reward",
    "EXCEPTION_EVENT",
]

_log = logging.getLogger("lightning_rl.tracing")

EXCEPTION_EVENT = "exception"
"""OpenTelemetry's event name for a recorded exception (with ``exception.type/message/stacktrace``)."""

_SIGNAL_ALIASES: Mapping[str, str] = {
    "tool_call_id": semconv.GEN_AI_TOOL_CALL_ID,
    "role": semconv.ROLE,
    "tool_name": semconv.GEN_AI_TOOL_NAME,
}
"""Short keyword names ``emit_signal`` accepts for the attributes the adapter joins on."""

StatusCode = Literal["unset", "ok", "error"]


def _new_span_id() -> str:
    return uuid.uuid4().hex[:16]


def _clean_value(value: Any) -> Any:
    """Coerce a value into something every store backend serialises identically (JSON)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, list | tuple):
        return [_clean_value(v) for v in value]  # pyright: ignore[reportUnknownVariableType]
    if isinstance(value, Mapping):
        return {str(k): _clean_value(v) for k, v in value.items()}  # pyright: ignore[reportUnknownVariableType]
    return str(value)


def clean_attributes(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    """A JSON-safe copy of span attributes: non-finite floats and unknown objects become strings."""
    if not attributes:
        return {}
    return {str(k): _clean_value(v) for k, v in attributes.items()}


def _exception_event(exc: BaseException) -> SpanEvent:
    stack = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return SpanEvent(
        name=EXCEPTION_EVENT,
        time_ns=time.time_ns(),
        attributes={
            "exception.type": type(exc).__qualname__,
            "exception.message": str(exc),
            "exception.stacktrace": stack[-8000:],
        },
    )


class SpanHandle:
    """An open span of the built-in tracer. ``end()`` records it; calling it again does nothing.

    A handle captures its rollout when it starts, so a plugin may end it later from another
    callback or thread and it is still attributed to the right attempt. Outside a rollout the
    handle is inert (``recording`` is False) and every method is a cheap no-op.
    """

    __slots__ = (
        "_ctx",
        "name",
        "kind",
        "span_id",
        "parent_id",
        "start_ns",
        "attributes",
        "events",
        "_status",
        "_ended",
    )

    def __init__(
        self,
        ctx: RolloutContext | None,
        name: str,
        *,
        kind: str = "internal",
        parent_id: str | None = None,
        attributes: Mapping[str, Any] | None = None,
        start_ns: int | None = None,
    ) -> None:
        self._ctx = ctx
        self.name = name
        self.kind = kind
        self.span_id = _new_span_id()
        self.parent_id = parent_id
        self.start_ns = start_ns if start_ns is not None else time.time_ns()
        self.attributes: dict[str, Any] = dict(attributes or {})
        self.events: list[SpanEvent] = []
        self._status = SpanStatus()
        self._ended = ctx is None

    @property
    def recording(self) -> bool:
        """Whether this span will be exported (it is inside a rollout and not ended yet)."""
        return not self._ended

    def set_attribute(self, key: str, value: Any) -> None:
        if not self._ended:
            self.attributes[key] = value

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        if not self._ended:
            self.attributes.update(attributes)

    def add_event(self, name: str, attributes: Mapping[str, Any] | None = None) -> None:
        if not self._ended:
            self.events.append(SpanEvent(name=name, time_ns=time.time_ns(), attributes=clean_attributes(attributes)))

    def set_status(self, code: StatusCode, message: str | None = None) -> None:
        if not self._ended:
            self._status = SpanStatus(code=code, message=message)

    def record_exception(self, exc: BaseException) -> None:
        """Add an OpenTelemetry-style ``exception`` event and mark the span as an error."""
        if not self._ended:
            self.events.append(_exception_event(exc))
            self._status = SpanStatus(code="error", message=f"{type(exc).__name__}: {exc}"[:2000])

    def end(self, end_ns: int | None = None) -> Span | None:
        """Finish the span and hand it to the rollout's sink; returns the recorded span (None if inert)."""
        if self._ended or self._ctx is None:
            return None
        self._ended = True
        recorded = Span(
            trace_id=self._ctx.trace_id,
            span_id=self.span_id,
            parent_id=self.parent_id,
            name=self.name,
            kind=self.kind,
            start_ns=self.start_ns,
            end_ns=end_ns if end_ns is not None else max(time.time_ns(), self.start_ns),
            attributes=clean_attributes(self.attributes),
            events=self.events,
            status=self._status,
            rollout_id=self._ctx.rollout_id,
            attempt_id=self._ctx.attempt_id,
        )
        self._ctx.record(recorded)
        return recorded


def start_span(
    name: str,
    *,
    kind: str = "internal",
    parent_id: str | None = None,
    attributes: Mapping[str, Any] | None = None,
) -> SpanHandle:
    """Open a span in the current rollout without making it the current span; end it with ``.end()``.

    For callback-style instrumentation (a framework's ``on_tool_start`` / ``on_tool_end``). The
    parent defaults to the current span of the built-in tracer.
    """
    ctx = current_rollout()
    if ctx is None:
        _log.debug("start_span(%r) outside a rollout: not recorded", name)
        return SpanHandle(None, name)
    return SpanHandle(ctx, name, kind=kind, parent_id=parent_id or current_span_id.get(), attributes=attributes)


@contextmanager
def span(name: str, *, kind: str = "internal", **attributes: Any) -> Generator[SpanHandle]:
    """Record the ``with`` block as a span of the current rollout, nested under the current span.

    An exception escaping the block is recorded on the span (status ``error`` plus an ``exception``
    event) and re-raised unchanged::

        with span("retrieve", query=q) as s:
            docs = search(q)
            s.set_attribute("n_docs", len(docs))
    """
    handle = start_span(name, kind=kind, attributes=attributes)
    if not handle.recording:
        yield handle
        return
    token = current_span_id.set(handle.span_id)
    try:
        yield handle
    except BaseException as exc:
        handle.record_exception(exc)
        raise
    finally:
        current_span_id.reset(token)
        handle.end()


def emit_span(
    name: str,
    attributes: Mapping[str, Any] | None = None,
    *,
    kind: str = "internal",
    start_ns: int | None = None,
    end_ns: int | None = None,
    status: StatusCode = "unset",
    status_message: str | None = None,
    parent_id: str | None = None,
) -> Span | None:
    """Record one finished span in the current rollout (zero-length unless times are given).

    Returns the recorded span, or None outside a rollout.
    """
    ctx = current_rollout()
    if ctx is None:
        _log.debug("emit_span(%r) outside a rollout: not recorded", name)
        return None
    handle = SpanHandle(
        ctx, name, kind=kind, parent_id=parent_id or current_span_id.get(), attributes=attributes, start_ns=start_ns
    )
    if status != "unset":
        handle.set_status(status, status_message)
    return handle.end(end_ns)


def as_reward(value: Any, what: str = "reward") -> float:
    """``value`` as a finite float; numpy and other ``numbers.Real`` scalars are accepted, bools are not.

    Raises:
        TypeError: ``value`` is not a real number, or is a bool (say 1.0 or 0.0).
        ValueError: ``value`` is NaN or infinite.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what} must be a real number (int or float), got {type(value).__name__}: {value!r}.")
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(f"{what} must be finite, got {out}; clip or replace NaN/inf before emitting it.")
    return out


def emit_reward(value: float, **attributes: Any) -> Span | None:
    """Record the reward of the current rollout attempt; the last one emitted is the final reward.

    The agent may instead simply return its reward; a returned value wins over emitted ones.
    Outside a rollout this does nothing (and returns None).

    Raises:
        TypeError: ``value`` is not a number (bools are refused: say 1.0 or 0.0).
        ValueError: ``value`` is NaN or infinite.
    """
    ctx = current_rollout()
    if ctx is None:
        _log.debug("emit_reward(%r) outside a rollout: ignored", value)
        return None
    reward = as_reward(value, "emit_reward value")
    ctx.set_reward(reward)
    return emit_span(semconv.SPAN_REWARD, {**attributes, semconv.REWARD_VALUE: reward})


def emit_signal(name: str, value: float = 1.0, **attributes: Any) -> Span | None:
    """Record an intermediate-reward input (AIR), e.g. ``emit_signal("tool_error", tool_call_id=call.id)``.

    The trainer's credit assignment turns signals into rewards through a policy such as
    ``{"tool_error": -0.1}`` and attaches each one to the LLM call that requested its tool, so pass
    ``tool_call_id`` whenever the signal concerns a tool call. ``role`` and ``tool_name`` are also
    understood; other keyword attributes are stored as given. Outside a rollout this does nothing.

    Raises:
        TypeError / ValueError: ``value`` is not a finite number.
    """
    ctx = current_rollout()
    if ctx is None:
        _log.debug("emit_signal(%r) outside a rollout: ignored", name)
        return None
    if not name:
        raise ValueError("emit_signal needs a non-empty signal name, e.g. 'tool_error'.")
    signal_value = as_reward(value, "emit_signal value")
    attrs = {_SIGNAL_ALIASES.get(k, k): v for k, v in attributes.items() if v is not None}
    attrs[semconv.SIGNAL_NAME] = name
    attrs[semconv.SIGNAL_VALUE] = signal_value
    return emit_span(semconv.SPAN_SIGNAL, attrs)
