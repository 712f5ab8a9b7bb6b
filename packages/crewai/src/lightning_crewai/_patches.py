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

Each patch is undone by :func:`unpatch`; the wrappers never alter what the wrapped code returns or
raises, and their own bookkeeping is :func:`~lightning_rl.plugins.guarded`.
"""

from __future__ import annotations

import contextvars
import functools
import weakref
from collections.abc import Callable
from typing import Any

import httpx
from crewai.agents.agent_executor import AgentExecutor
from crewai.llms.providers.openai.completion import OpenAICompletion
from crewai.utilities.agent_utils import extract_tool_call_info

from lightning_rl.plugins import acting_as, guarded, install_hooks, remove_hooks

__all__ = ["patch", "unpatch", "current_tool_call_id", "agent_role_of_call"]

_tool_call_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("lightning_crewai_tool_call", default=None)

# (owner class, attribute name) -> the original attribute, while patched.
_originals: dict[tuple[type[Any], str], Any] = {}
# httpx clients we put the routing hook on, so uninstrument can take it off again.
_hooked: weakref.WeakSet[httpx.Client | httpx.AsyncClient] = weakref.WeakSet()

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
def _hook_client(openai_client: Any) -> None:
    http = getattr(openai_client, "_client", None)  # the httpx client inside openai.OpenAI / AsyncOpenAI
    if isinstance(http, httpx.Client | httpx.AsyncClient) and install_hooks(http):
        _hooked.add(http)


@guarded
def _tool_call_id_of(tool_call: Any) -> str | None:
    info = extract_tool_call_info(tool_call)
    return str(info[0]) if info and info[0] else None


def _wrap_get_client(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    @functools.wraps(original)
    def get_client(self: Any) -> Any:
        client = original(self)
        _hook_client(client)
        return client

    return get_client


def _wrap_call(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        role = agent_role_of_call(args, kwargs)
        # A model call starts a new context for tools: an outer tool's call id (a coworker
        # delegated to from inside a tool) must not be claimed by the tools this call leads to.
        token = _tool_call_id.set(None)
        try:
            if role is None:
                return original(self, *args, **kwargs)
            with acting_as(role):
                return original(self, *args, **kwargs)
        finally:
            _tool_call_id.reset(token)

    return call


def _wrap_acall(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def acall(self: Any, *args: Any, **kwargs: Any) -> Any:
        role = agent_role_of_call(args, kwargs)
        token = _tool_call_id.set(None)  # as in call(): no outer tool's id leaks into this call's tools
        try:
            if role is None:
                return await original(self, *args, **kwargs)
            with acting_as(role):
                return await original(self, *args, **kwargs)
        finally:
            _tool_call_id.reset(token)

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


_PATCHES: tuple[tuple[type[Any], str, Callable[[Any], Any]], ...] = (
    (OpenAICompletion, "_get_sync_client", _wrap_get_client),
    (OpenAICompletion, "_get_async_client", _wrap_get_client),
    (OpenAICompletion, "call", _wrap_call),
    (OpenAICompletion, "acall", _wrap_acall),
    (AgentExecutor, "_execute_single_native_tool_call", _wrap_tool_call),
)


def patch() -> None:
    """Apply every patch once (a second call is a no-op)."""
    for owner, name, wrap in _PATCHES:
        if (owner, name) in _originals:
            continue
        original = owner.__dict__[name]
        _originals[(owner, name)] = original
        setattr(owner, name, wrap(original))


def unpatch() -> None:
    """Restore the original attributes and take the routing hook off every client we hooked."""
    for (owner, name), original in list(_originals.items()):
        setattr(owner, name, original)
        del _originals[(owner, name)]
    for http in list(_hooked):
        remove_hooks(http)
    _hooked.clear()
