"""The LangChain callback handler: role, tool and error spans (what each holds: the README).

It runs inline, in the caller's context, so the role it sets in ``routing.request_role`` reaches the
HTTP request (streamed calls have no response id to join on). ``on_tool_error`` runs before the
exception leaves the tool, so the error is kept even when it aborts the graph. Every callback is
``guarded``: a failure of the handler never reaches the user's graph.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import BaseMessage, ToolMessage
from langchain_core.outputs import LLMResult

from lightning_langchain.roles import RoleInfo, resolve_role
from lightning_langchain.routing import request_role
from lightning_rl.langchain_runs import response_id_of as response_id
from lightning_rl.plugins import Bounded, ToolRuns, guarded, record_error, record_role
from lightning_rl.tracing import current_rollout

__all__ = ["LightningCallbackHandler", "response_id", "SPAN_ERROR"]

SPAN_ERROR = "langchain.error"
"""Span recording an exception raised in the user's code inside a rollout (status ``error``)."""


def _tool_call_ids(response: LLMResult) -> list[str]:
    messages: list[Any] = [getattr(g, "message", None) for gs in response.generations for g in gs]
    calls: list[Any] = [c for m in messages for c in getattr(m, "tool_calls", None) or ()]
    return [i for c in calls if isinstance(c, Mapping) and isinstance(i := c.get("id"), str) and i]


def _role_of(callback_kwargs: Mapping[str, Any]) -> RoleInfo:
    """The role of a run from the ``metadata`` and ``tags`` (inherited by the run) LangChain passes a callback."""
    return resolve_role(callback_kwargs.get("metadata"), callback_kwargs.get("tags"))


def _is_control_flow(error: BaseException) -> bool:
    """LangGraph's interrupts and bubbling signals are not errors of the user's code."""
    if not isinstance(error, Exception):  # cancellation, KeyboardInterrupt, ...
        return True
    return any(cls.__name__ in ("GraphBubbleUp", "GraphInterrupt", "ParentCommand") for cls in type(error).__mro__)


class LightningCallbackHandler(BaseCallbackHandler):
    """Records LangChain runs into the current rollout (outside one: nothing); installed by ``instrument()``
    or passed in ``config={"callbacks": [...]}``. ``is_trainable``: a role's flag when its runnable sets none."""

    run_inline = True
    raise_error = False

    def __init__(self, is_trainable: Callable[[str | None], bool | None] | None = None) -> None:
        super().__init__()
        self.enabled = True
        self._is_trainable: Callable[[str | None], bool | None] = is_trainable or (lambda _role: None)
        self._llm_runs: Bounded[UUID, RoleInfo] = Bounded()
        self._tool_runs: ToolRuns[UUID] = ToolRuns()
        self._chain_runs: Bounded[UUID, RoleInfo] = Bounded()
        # (attempt, tool-call id) -> role: some tool parsers reuse ids across rollouts ("add:0").
        self._role_of_tool_call: Bounded[tuple[str, str], str] = Bounded()
        # Exceptions recorded, by id (kept so the id stays unique; exceptions take no weak references).
        self._recorded: Bounded[int, BaseException] = Bounded(256)

    def _active(self) -> bool:
        return self.enabled and current_rollout() is not None

    def _trainable(self, info: RoleInfo) -> bool | None:
        return info.trainable if info.trainable is not None else self._is_trainable(info.role)

    @guarded
    def on_chat_model_start(
        self, serialized: dict[str, Any], messages: list[list[BaseMessage]], *, run_id: UUID, **kwargs: Any
    ) -> None:
        if not self._active():
            return
        request_role.set(None)  # should what follows fail, no earlier call's role may leak into this request
        info = _role_of(kwargs)
        self._llm_runs.put(run_id, info)
        request_role.set(info.role)  # read by the routing hook when this call's request goes out

    @guarded
    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        info = self._llm_runs.pop(run_id)
        if info is None or not self._active():
            return
        ctx = current_rollout()
        if info.role is not None and ctx is not None:
            for call_id in _tool_call_ids(response):
                self._role_of_tool_call.put((ctx.attempt_id, call_id), info.role)
        rid = response_id(response)
        record_role(
            info.role,
            response_id=rid,
            trainable=self._trainable(info),
            agent_name=info.agent_name,
            attributes={
                "lightning.role.source": info.source,
                # Without an id (streamed chat completions) the role reached the gateway in the URL.
                "lightning.role.joined_by": "response_id" if rid else "request_route",
                "langchain.run_id": str(run_id),
            },
        )

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._llm_runs.pop(run_id)

    @guarded
    def on_tool_start(self, serialized: dict[str, Any], input_str: str, *, run_id: UUID, **kwargs: Any) -> None:
        if not self._active():
            return
        tool_call_id = kwargs.get("tool_call_id")
        call_id = tool_call_id if isinstance(tool_call_id, str) and tool_call_id else None
        # The role of the call that asked for the tool; else the role of where the tool runs
        # (a tool called from inside a "writer" node belongs to the writer).
        ctx = current_rollout()
        role = self._role_of_tool_call.get((ctx.attempt_id, call_id)) if call_id and ctx is not None else None
        if role is None:
            role = _role_of(kwargs).role
        name = str((serialized or {}).get("name") or "tool")
        inputs = kwargs.get("inputs")
        self._tool_runs.start(
            run_id, name, call_id=call_id, role=role, arguments=input_str if inputs is None else inputs
        )

    @guarded
    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        run = self._tool_runs.pop(run_id)
        if run is None or not self._active():
            return
        call_id, error, text = None, None, output
        if isinstance(output, ToolMessage):
            call_id = output.tool_call_id or None
            text = output.content
            if output.status == "error":  # a tool that handles its own errors (handle_tool_error=...)
                error = str(text or "tool error")
        self._tool_runs.end(run, error=error, output=text, call_id=call_id)

    @guarded
    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        run = self._tool_runs.pop(run_id)
        if run is None or not self._active():
            return
        self._tool_runs.end(run, error=error)
        self._recorded.put(id(error), error)

    @guarded
    def on_chain_start(
        self, serialized: dict[str, Any], inputs: dict[str, Any], *, run_id: UUID, **kwargs: Any
    ) -> None:
        if self._active():
            self._chain_runs.put(run_id, _role_of(kwargs))

    def on_chain_end(self, outputs: dict[str, Any], *, run_id: UUID, **kwargs: Any) -> None:
        self._chain_runs.pop(run_id)

    @guarded
    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        info = self._chain_runs.pop(run_id)
        if info is None or not self._active() or _is_control_flow(error) or self._recorded.get(id(error)) is error:
            return
        self._recorded.put(id(error), error)  # recorded once, by the innermost run it passes through
        record_error(
            SPAN_ERROR, error, role=info.role, agent_name=info.agent_name, attributes={"langchain.run_id": str(run_id)}
        )
