"""Route ``ChatOpenAI`` calls made inside a rollout to that rollout's gateway URL.

Users build their ``ChatOpenAI`` once, often at import time, and many rollouts share it, so every
request is rewritten on its way out by core's routing hook instead (see
:meth:`lightning_rl.plugins.Patches.hook_client`). The hook goes on lazily: the generation methods
of ``BaseChatOpenAI`` (``_generate``, ``_agenerate``, ``_stream``, ``_astream``: every sync/async,
streaming or not, chat-completions or Responses-API call passes through one) are wrapped so that
the first time a model is used inside a rollout, its OpenAI clients' httpx clients get the hook.
That covers models built before ``instrument()`` too.

The role a request is sent under comes from :data:`request_role`, a context variable the callback
handler sets in ``on_chat_model_start``. The handler runs inline (``run_inline = True``), so the
value reaches the request (LangChain copies that context into the tasks and threads it starts).
With the role in the URL the gateway attributes the call directly, which also covers streamed chat
completions, whose messages carry no response id.
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
