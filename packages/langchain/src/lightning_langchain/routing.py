"""Route ``ChatOpenAI`` calls made inside a rollout to that rollout's gateway URL.

A ``ChatOpenAI`` is built once and shared by rollouts, so core's routing hook (``Patches.hook_client``)
rewrites each request on its way out. ``BaseChatOpenAI``'s generation methods hook a model's httpx
clients the first time it is used in a rollout. The role comes from :data:`request_role` (set by the
inline callback handler); in the URL, it lets the gateway attribute streamed calls, which carry no id.
"""

from __future__ import annotations

import contextvars
import functools
import logging
from collections.abc import Callable
from typing import Any

import httpx

from lightning_rl.plugins import Patches, guarded
from lightning_rl.tracing import current_rollout

__all__ = ["request_role", "route_chat_openai", "hooked_clients"]

_log = logging.getLogger(__name__)

request_role: contextvars.ContextVar[str | None] = contextvars.ContextVar("lightning_langchain_role", default=None)
"""The role of the chat-model call being made in this context (set by the callback handler)."""

_METHODS = ("_generate", "_agenerate", "_stream", "_astream")


def hooked_clients() -> list[httpx.Client | httpx.AsyncClient]:
    """The httpx clients the plugin routes now (for tests and debugging)."""
    from lightning_langchain.instrumentor import LangChainInstrumentor

    return LangChainInstrumentor().patches.clients()


def route_chat_openai(patches: Patches) -> bool:
    """Wrap ``BaseChatOpenAI``'s generation methods on ``patches``; False when langchain-openai is missing."""
    try:
        from langchain_openai.chat_models.base import BaseChatOpenAI
    except ImportError:
        _log.debug("langchain-openai is not installed; ChatOpenAI calls are not routed")
        return False

    @guarded
    def hook_model(model: Any) -> None:
        for attr in ("root_client", "root_async_client"):
            patches.hook_client(getattr(model, attr, None), role=request_role.get)

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        # Not async, not a generator: it returns what the original returns (a result, a coroutine or
        # an iterator), so one wrapper serves all four methods and runs before any request is made.
        @functools.wraps(original)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            if current_rollout() is not None:
                hook_model(self)
            return original(self, *args, **kwargs)

        return wrapper

    for name in _METHODS:
        if name in BaseChatOpenAI.__dict__:
            patches.wrap(BaseChatOpenAI, name, wrap)
        else:
            _log.debug("BaseChatOpenAI.%s not found; that path is not routed", name)
    return True
