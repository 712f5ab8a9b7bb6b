"""The three class-level patches that make CrewAI's model calls routable and attributable.

Why class-level patches rather than CrewAI's own extension points:

* CrewAI's inline hooks (``before_llm_call``) are copied into each agent's executor when the agent
  is built, so they miss every agent created before ``instrument()``. Patching the provider class
  applies to every ``LLM`` and every agent, whenever they were made.
* The event bus runs its handlers later, on a thread pool, in a *copy* of the emitting context:
  a handler can read what the agent's thread had set, but cannot set anything the HTTP call sees.

So the work that must happen in the agent's own thread, at request time, is done here:

1. **Routing.** ``OpenAICompletion._get_sync_client`` / ``_get_async_client`` (every request of
   CrewAI's native OpenAI provider goes through them) get core's httpx request hook installed on
   the openai client they return. Inside a rollout each request is rewritten to the attempt's
   gateway URL; outside it is untouched. An ``interceptor=`` the user set still runs (after us).
2. **Role at request time.** ``OpenAICompletion.call`` / ``acall`` run under
   ``acting_as(from_agent.role)``, so the hook sends the call to the role's URL
   (``…/roles/{role}/v1``): the gateway records the role on the call itself, exactly, whatever
   the concurrency.
3. **Tool-call id.** ``AgentExecutor._execute_single_native_tool_call`` runs with the tool-call id
   of the call it executes in a context variable. CrewAI's tool events carry no id, but the bus
   copies the emitting context into the handler, so the listener reads the exact id there.

Each patch is recorded on the plugin's install handle, which undoes it; the wrappers never alter
what the wrapped code returns or raises, and their own bookkeeping is
:func:`~lightning_rl.plugins.guarded`.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable, Generator
from contextlib import contextmanager
from typing import Any

from crewai.agents.agent_executor import AgentExecutor
from crewai.llms.providers.openai.completion import OpenAICompletion
from crewai.utilities.agent_utils import extract_tool_call_info

from lightning_rl.plugins import Patches, acting_as, guarded

__all__ = ["install", "current_tool_call_id", "agent_role_of_call"]

_tool_call_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("lightning_crewai_tool_call", default=None)

# Position of ``from_agent`` in ``call(messages, tools, callbacks, available_functions, from_task, from_agent)``.
_FROM_AGENT_POSITION = 5


def current_tool_call_id() -> str | None:
    """The tool-call id CrewAI is executing in this context (None outside a native tool call)."""
    return _tool_call_id.get()


@guarded
def agent_role_of_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """The ``role`` of the ``from_agent`` passed to ``LLM.call`` / ``acall``, if any."""
    agent = kwargs.get("from_agent")
    if agent is None and len(args) > _FROM_AGENT_POSITION:
        agent = args[_FROM_AGENT_POSITION]
    role = getattr(agent, "role", None)
    return role if isinstance(role, str) and role else None


@guarded
def _tool_call_id_of(tool_call: Any) -> str | None:
    info = extract_tool_call_info(tool_call)
    return str(info[0]) if info and info[0] else None


@contextmanager
def _model_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Generator[None]:
    """Run a model call as its agent's role. A model call also starts a new context for tools: an
    outer tool's call id (a coworker delegated to from inside a tool) must not be claimed by the
    tools this call leads to."""
    role = agent_role_of_call(args, kwargs)
    token = _tool_call_id.set(None)
    try:
        if role is None:
            yield
        else:
            with acting_as(role):
                yield
    finally:
        _tool_call_id.reset(token)


def _wrap_call(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _model_call(args, kwargs):
            return original(self, *args, **kwargs)

    return call


def _wrap_acall(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def acall(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _model_call(args, kwargs):
            return await original(self, *args, **kwargs)

    return acall


def _wrap_tool_call(original: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    @functools.wraps(original)
    def execute(self: Any, tool_call: Any) -> Any:
        token = _tool_call_id.set(_tool_call_id_of(tool_call))
        try:
            return original(self, tool_call)
        finally:
            _tool_call_id.reset(token)

    return execute


def install(patches: Patches) -> None:
    """Apply every patch through the plugin's install handle (which undoes them)."""

    def wrap_get_client(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
        @functools.wraps(original)
        def get_client(self: Any) -> Any:
            client = original(self)
            guarded(patches.hook_client)(client)  # the httpx client inside openai.OpenAI / AsyncOpenAI
            return client

        return get_client

    patches.wrap(OpenAICompletion, "_get_sync_client", wrap_get_client)
    patches.wrap(OpenAICompletion, "_get_async_client", wrap_get_client)
    patches.wrap(OpenAICompletion, "call", _wrap_call)
    patches.wrap(OpenAICompletion, "acall", _wrap_acall)
    patches.wrap(AgentExecutor, "_execute_single_native_tool_call", _wrap_tool_call)
