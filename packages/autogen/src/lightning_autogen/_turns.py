"""One agent turn, observed: the agent's role for its model calls, and its tool calls as tool spans.

AutoGen runs every agent turn through ``on_messages_stream`` (teams call it directly; a standalone
``AssistantAgent.run`` through ``on_messages``). Wrapping that async generator is enough: each step
runs inside :func:`~lightning_rl.plugins.acting_as` (the agent's name), reset before each event is
handed back so the role never leaks into the caller; and each ``FunctionExecutionResult`` of a
``ToolCallExecutionEvent`` becomes a tool span joined by ``call_id`` to the model call whose
``ToolCallRequestEvent`` asked for it (an AIR ``tool_success`` / ``tool_error`` signal).
"""

from __future__ import annotations

import time
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

from lightning_rl.plugins import Bounded, acting_as, guarded, record_role, record_tool
from lightning_rl.roles import RoleSelector
from lightning_rl.tracing import current_rollout

__all__ = ["StreamFn", "TrainableOf", "observed_stream", "declare_trainable", "trainable_flags"]

StreamItem = BaseAgentEvent | BaseChatMessage | Response
StreamFn = Callable[[Sequence[BaseChatMessage], CancellationToken], AsyncGenerator[StreamItem]]
"""The signature of a bound ``on_messages_stream``."""
TrainableOf = Callable[[], Mapping[str, bool]]
"""The trainable flags to declare for an attempt (role -> flag); empty when the user chose none."""

_declared: Bounded[str, set[str]] = Bounded(4096)  # attempt id -> roles declared


def trainable_flags(selection: Callable[[], RoleSelector | None], roles: Sequence[str]) -> TrainableOf:
    """The flags of ``roles`` under the selection current when asked (none when the user chose none)."""
    return lambda: {} if (chosen := selection()) is None else {role: chosen(role) for role in roles}


@guarded
def declare_trainable(trainable: TrainableOf) -> None:
    """Declare each role's trainable flag once per attempt (a no-op outside a rollout)."""
    ctx = current_rollout()
    flags = {} if ctx is None else trainable()
    if ctx is None or not flags:
        return
    done = _declared.get(ctx.attempt_id) or set()
    _declared.put(ctx.attempt_id, done)
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
