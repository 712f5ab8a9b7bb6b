"""The event-bus listener: role spans from LLM events, tool spans (AIR inputs) from tool events.

CrewAI's bus runs sync handlers on a thread pool, asynchronously to the agent and in no guaranteed
order (``ToolUsageFinished`` can be handled before ``ToolUsageStarted``), but each handler runs in
a copy of the *emitting* context. The listener relies only on that:

* the rollout (``current_rollout()``) and the tool-call id set by :mod:`._patches` are read from
  the emitting context, so they are exact under any number of concurrent crews;
* a role span joins its gateway call by **response id**, which does not depend on order;
* a tool's start and end are paired by ``emission_sequence`` (CrewAI's per-run counter), never by
  arrival order or wall-clock time.

``Crew.kickoff`` flushes the bus before it returns, so every span of a crew is recorded before the
runner closes its attempt. Every handler is :func:`~lightning_rl.plugins.guarded`: a listener bug
is counted and logged at debug level, never raised into the crew.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime
from typing import Any

from crewai.events import (
    LLMCallCompletedEvent,
    LLMCallStartedEvent,
    ToolUsageErrorEvent,
    ToolUsageFinishedEvent,
    ToolUsageStartedEvent,
    crewai_event_bus,
)
from crewai.events.base_events import BaseEvent
from crewai.events.event_bus import is_replaying
from crewai.llms.providers.openai.completion import OpenAICompletion

from lightning_crewai._patches import current_tool_call_id
from lightning_rl.plugins import guarded, record_role, record_tool
from lightning_rl.tracing import current_rollout

__all__ = ["CrewAIListener"]

_log = logging.getLogger("lightning_crewai")

_MAX_OPEN_TOOLS = 4096  # started-but-unfinished tool events remembered (oldest dropped first)

# What a tool event key is: (attempt id, tool-call id or (agent id, tool name, arguments)).
_ToolKey = tuple[str, str]


def _ns(when: datetime | None) -> int | None:
    return int(when.timestamp() * 1e9) if when is not None else None


def _arguments(args: Any) -> str:
    return args if isinstance(args, str) else json.dumps(args, default=str, sort_keys=True)


class CrewAIListener:
    """Registers its handlers on ``crewai_event_bus``; :meth:`close` takes them off again.

    Args:
        is_trainable: The instrumentor's role selection (None: undeclared, the trainer decides).
    """

    def __init__(self, is_trainable: Callable[[str | None], bool | None]) -> None:
        self._is_trainable = is_trainable
        self._lock = threading.Lock()
        self._started: OrderedDict[_ToolKey, ToolUsageStartedEvent] = OrderedDict()
        self._warned: set[str] = set()
        self._handlers: list[tuple[type[BaseEvent], Callable[..., Any]]] = [
            (LLMCallStartedEvent, guarded(self.on_llm_started)),
            (LLMCallCompletedEvent, guarded(self.on_llm_completed)),
            (ToolUsageStartedEvent, guarded(self.on_tool_started)),
            (ToolUsageFinishedEvent, guarded(self.on_tool_finished)),
            (ToolUsageErrorEvent, guarded(self.on_tool_error)),
        ]
        for event_type, handler in self._handlers:
            crewai_event_bus.on(event_type)(handler)

    def close(self) -> None:
        """Unregister every handler (idempotent)."""
        for event_type, handler in self._handlers:
            crewai_event_bus.off(event_type, handler)
        self._handlers = []
        with self._lock:
            self._started.clear()

    # -- LLM calls ---------------------------------------------------------------------------

    def on_llm_started(self, source: Any, event: LLMCallStartedEvent) -> None:
        """Warn once per LLM class that a rollout's calls are not routed (a non-OpenAI provider)."""
        if current_rollout() is None or isinstance(source, OpenAICompletion):
            return
        kind = type(source).__name__
        with self._lock:
            if kind in self._warned:
                return
            self._warned.add(kind)
        _log.warning(
            "agent role %r calls a %s, which lightning-crewai does not route to the gateway: its calls are not "
            "trained. Use LLM(model='openai/<name>', base_url=...) (any OpenAI-compatible server) for trained roles.",
            getattr(event, "agent_role", None),
            kind,
        )

    def on_llm_completed(self, source: Any, event: LLMCallCompletedEvent) -> None:
        """Join the role to the gateway's call by response id and declare whether it is trainable."""
        role: str | None = getattr(event, "agent_role", None)
        if not role or current_rollout() is None or is_replaying():
            return
        attributes = {"crewai.call_id": event.call_id, "crewai.emission_sequence": event.emission_sequence or 0}
        task_name: str | None = getattr(event, "task_name", None)
        if task_name:
            attributes["crewai.task_name"] = task_name
        record_role(role, response_id=event.response_id, trainable=self._is_trainable(role), attributes=attributes)

    # -- tools ---------------------------------------------------------------------------------

    def _key(self, event: ToolUsageStartedEvent | ToolUsageFinishedEvent | ToolUsageErrorEvent) -> _ToolKey | None:
        ctx = current_rollout()
        if ctx is None:
            return None
        call_id = current_tool_call_id()
        ident = call_id or f"{event.agent_id}\x1f{event.tool_name}\x1f{_arguments(event.tool_args)}"
        return ctx.attempt_id, ident

    def _pop_start(self, key: _ToolKey, before: int | None) -> ToolUsageStartedEvent | None:
        """The started event of ``key`` emitted before sequence ``before`` (whatever order they arrived in)."""
        with self._lock:
            started = self._started.get(key)
            if started is None:
                return None
            if before is not None and (started.emission_sequence or 0) > before:
                return None  # a later run of the same tool call; keep it for its own end event
            del self._started[key]
            return started

    def on_tool_started(self, source: Any, event: ToolUsageStartedEvent) -> None:
        """Remember when a tool started, until its end event is handled."""
        key = self._key(event)
        if key is None:
            return
        with self._lock:
            previous = self._started.get(key)
            if previous is None or (previous.emission_sequence or 0) < (event.emission_sequence or 0):
                self._started[key] = event
                self._started.move_to_end(key)
            while len(self._started) > _MAX_OPEN_TOOLS:
                self._started.popitem(last=False)

    def _record(
        self,
        event: ToolUsageFinishedEvent | ToolUsageErrorEvent,
        *,
        error: BaseException | str | None,
        output: str | None,
        start_ns: int | None,
    ) -> None:
        key = self._key(event)
        if key is None or is_replaying():  # a checkpoint replay re-dispatches events already recorded
            return
        started = self._pop_start(key, event.emission_sequence)
        if started is not None:
            start_ns = _ns(started.timestamp)
        record_tool(
            event.tool_name,
            call_id=current_tool_call_id(),
            role=event.agent_role,
            error=error,
            arguments=_arguments(event.tool_args),
            output=output,
            start_ns=start_ns,
            end_ns=_ns(event.timestamp),
            attributes={"crewai.emission_sequence": event.emission_sequence or 0},
        )

    def on_tool_finished(self, source: Any, event: ToolUsageFinishedEvent) -> None:
        """A tool ran; a failure it reported (``event.failure``) counts as a tool error."""
        failure = event.failure
        error = None if failure is None else (failure.message or "tool reported a failure")
        self._record(event, error=error, output=str(event.output), start_ns=_ns(event.started_at))

    def on_tool_error(self, source: Any, event: ToolUsageErrorEvent) -> None:
        """A tool raised: an AIR ``tool_error`` signal on the call that requested it."""
        error: Any = event.error
        text: BaseException | str = error if isinstance(error, BaseException) else str(error)
        self._record(event, error=text, output=None, start_ns=None)
