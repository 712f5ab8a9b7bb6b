"""What plugins record: which role made an LLM call, tool executions, and their own failures.

The gateway already records every model call with exact tokens; a plugin adds what only the
framework knows. Two span kinds, both joinable exactly (never by timestamps):

* a **role span** (``agent``) per model call, carrying the role and the response id the gateway
  returned (the adapter joins on it), and whether the role is trainable;
* a **tool span** (``tool``) per tool execution, carrying the tool-call id the model emitted (the
  adapter attaches its ``tool_success`` / ``tool_error`` AIR signal to the call that requested it).

:func:`guarded` is the rule that a plugin never breaks its host: plugin code that fails is logged
at debug level and skipped, while the user's own exceptions pass through untouched.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, TypeVar

from lightning_rl import semconv
from lightning_rl.tracing import emit_span
from lightning_rl.types import Span

__all__ = ["record_role", "record_tool", "record_error", "guarded", "PluginFailures"]

_log = logging.getLogger("lightning_rl.plugins")

P = ParamSpec("P")
R = TypeVar("R")


class PluginFailures:
    """A process-wide count of swallowed plugin failures, so tests and metrics can see them."""

    count: int = 0
    last: BaseException | None = None


def guarded(fn: Callable[P, R]) -> Callable[P, R | None]:
    """Run ``fn``; if it raises, log at debug level, count it and return None instead."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R | None:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # instrumentation must never break the host framework
            PluginFailures.count += 1
            PluginFailures.last = exc
            _log.debug("plugin hook %s failed; ignored", getattr(fn, "__qualname__", fn), exc_info=True)
            return None

    return wrapper


def record_role(
    role: str | None,
    *,
    response_id: str | None = None,
    trainable: bool | None = None,
    agent_name: str | None = None,
    attributes: Mapping[str, Any] | None = None,
) -> Span | None:
    """Record that the model call answered with ``response_id`` was made by ``role``.

    With no ``response_id`` it only declares whether ``role`` is trainable (for calls whose role
    the gateway already knows from a role URL or header). Outside a rollout: a no-op (None).
    """
    attrs: dict[str, Any] = dict(attributes or {})
    if role is not None:
        attrs[semconv.ROLE] = role
    if response_id:
        attrs[semconv.GEN_AI_RESPONSE_ID] = response_id
    if trainable is not None:
        attrs[semconv.TRAINABLE] = trainable
    if agent_name:
        attrs[semconv.GEN_AI_AGENT_NAME] = agent_name
    return emit_span(semconv.SPAN_AGENT, attrs)


def record_error(
    name: str,
    error: BaseException,
    *,
    role: str | None = None,
    agent_name: str | None = None,
    attributes: Mapping[str, Any] | None = None,
) -> Span | None:
    """Record an exception raised by the user's code inside a rollout as span ``name`` (status ``error``).

    The message is cut to 2,000 characters (the status message to 500): a stack of nested framework
    errors can repeat a whole prompt, and the span is for finding the failure, not archiving it."""
    attrs: dict[str, Any] = {
        "error.type": type(error).__qualname__,
        "exception.message": str(error)[:2000],
        **(attributes or {}),
    }
    if role is not None:
        attrs[semconv.ROLE] = role
    if agent_name is not None:
        attrs[semconv.GEN_AI_AGENT_NAME] = agent_name
    return emit_span(name, attrs, status="error", status_message=_error_text(error)[:500])


def _text(value: object) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, default=str)
    except (TypeError, ValueError):
        return str(value)


def _error_text(error: BaseException | str) -> str:
    return f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else str(error)


def record_tool(
    name: str,
    *,
    call_id: str | None = None,
    role: str | None = None,
    error: BaseException | str | None = None,
    arguments: object = None,
    output: object = None,
    start_ns: int | None = None,
    end_ns: int | None = None,
    attributes: Mapping[str, Any] | None = None,
) -> Span | None:
    """Record one tool execution; ``error`` set means it failed (an AIR ``tool_error`` signal).

    ``call_id`` is the tool-call id from the model's response; without it the signal attaches to
    the latest earlier call of ``role``, and the span says so (``lightning.tool.joined_by``).
    ``arguments`` and ``output`` that are not strings are written as JSON (``str()`` when they are not
    serialisable): frameworks hand over dicts, lists and message contents. Outside a rollout: a no-op (None).
    """
    attrs: dict[str, Any] = dict(attributes or {})
    attrs[semconv.GEN_AI_TOOL_NAME] = name
    attrs[semconv.TOOL_STATUS] = "ok" if error is None else "error"
    attrs["lightning.tool.joined_by"] = "tool_call_id" if call_id else "latest_call_of_role"
    if call_id:
        attrs[semconv.GEN_AI_TOOL_CALL_ID] = call_id
    if role is not None:
        attrs[semconv.ROLE] = role
    if error is not None:
        attrs[semconv.TOOL_ERROR] = _error_text(error)[:2000]
    if arguments is not None:
        attrs["gen_ai.tool.call.arguments"] = _text(arguments)[:4000]
    if output is not None:
        attrs["gen_ai.tool.call.result"] = _text(output)[:4000]
    end = end_ns or time.time_ns()
    return emit_span(
        semconv.SPAN_TOOL,
        attrs,
        start_ns=start_ns or end,
        end_ns=end,
        status="unset" if error is None else "error",
        status_message=None if error is None else _error_text(error)[:500],
    )
