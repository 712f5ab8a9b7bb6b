"""One agent turn, observed: the agent's role for its model calls, and its tool calls as tool spans.

AutoGen runs every agent turn through ``on_messages_stream`` (teams call it directly; a standalone
``AssistantAgent.run`` reaches it through ``on_messages``). Wrapping that async generator gives the
plugin everything it needs without touching the framework's internals:

* each step of the turn runs inside :func:`~lightning_rl.plugins.acting_as` (the agent's name),
  so the model calls it makes carry the agent's role (see ``_routing``). The role is set only while
  the agent's own code runs and reset before each event is handed back, so it never leaks into
  the caller;
* the events it yields include ``ToolCallRequestEvent`` (the model's tool calls, with the ids the
  gateway parsed from the response) and ``ToolCallExecutionEvent`` (one ``FunctionExecutionResult``
  per call, with ``call_id`` and ``is_error``): each result becomes a core tool span, joined to the
  requesting model call by that id, hence an AIR ``tool_success`` / ``tool_error`` signal.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import Any

from autogen_agentchat.base import Response
from autogen_agentchat.messages import (
    BaseAgentEvent,
    BaseChatMessage,
    ToolCallExecutionEvent,
    ToolCallRequestEvent,
)
from autogen_core import CancellationToken, FunctionCall

from lightning_rl.plugins import acting_as, guarded, record_role, record_tool
from lightning_rl.tracing import current_rollout

__all__ = ["StreamFn", "TrainableOf", "observed_stream", "declare_trainable"]

StreamItem = BaseAgentEvent | BaseChatMessage | Response
StreamFn = Callable[[Sequence[BaseChatMessage], CancellationToken], AsyncGenerator[StreamItem]]
"""The signature of a bound ``on_messages_stream``."""
TrainableOf = Callable[[], Mapping[str, bool]]
"""The trainable flags to declare for an attempt (role -> flag); empty when the user chose none."""

_MAX_ATTEMPTS = 4096
_declared: OrderedDict[str, set[str]] = OrderedDict()


@guarded
def declare_trainable(trainable: TrainableOf) -> None:
    """Declare each role's trainable flag once per attempt (a no-op outside a rollout)."""
    ctx = current_rollout()
    flags = {} if ctx is None else trainable()
    if ctx is None or not flags:
        return
    done = _declared.setdefault(ctx.attempt_id, set())
    _declared.move_to_end(ctx.attempt_id)
    while len(_declared) > _MAX_ATTEMPTS:
        _declared.popitem(last=False)
    for role, flag in flags.items():
        if role not in done:
            record_role(role, trainable=flag, agent_name=role)
            done.add(role)


class _ToolCalls:
    """Pairs each tool result with the request that asked for it, and records it."""

    def __init__(self, role: str) -> None:
        self.role = role
        self.requested: dict[str, tuple[FunctionCall, int]] = {}

    @guarded
    def observe(self, item: object) -> None:
        if isinstance(item, ToolCallRequestEvent):
            now = time.time_ns()
            for call in item.content:
                self.requested[call.id] = (call, now)
        elif isinstance(item, ToolCallExecutionEvent):
            for result in item.content:
                call, start = self.requested.pop(result.call_id, (None, None))
                record_tool(
                    result.name,
                    call_id=result.call_id or None,
                    role=self.role,
                    error=result.content if result.is_error else None,
                    arguments=None if call is None else call.arguments,
                    output=result.content,
                    start_ns=start,
                )


def observed_stream(role: str, original: StreamFn, trainable: TrainableOf) -> StreamFn:
    """``original`` (a bound ``on_messages_stream``), run as ``role`` and with its tool calls recorded."""

    async def on_messages_stream(
        messages: Sequence[BaseChatMessage], cancellation_token: CancellationToken
    ) -> AsyncGenerator[StreamItem]:
        declare_trainable(trainable)
        tools = _ToolCalls(role)
        inner = original(messages, cancellation_token)
        try:
            while True:
                with acting_as(role):
                    try:
                        item = await anext(inner)
                    except StopAsyncIteration:
                        return
                tools.observe(item)
                yield item
        finally:
            await inner.aclose()

    marker: Any = on_messages_stream
    marker.__lightning_original__ = original
    return on_messages_stream
