"""Route ``ChatOpenAI`` calls made inside a rollout to that rollout's gateway URL.

Users build their ``ChatOpenAI`` (directly or through ``init_chat_model``) once, often at import
time, pointed at OpenAI or a local server; many rollouts then share it concurrently. So the model
cannot be rebuilt per rollout: instead every request is rewritten on its way out, by core's httpx
request hook (:func:`lightning_rl.plugins.install_hooks`), which reads the rollout from its
context variable at request time. Outside a rollout the hook leaves the request alone.

The hook is installed lazily: the generation methods of ``BaseChatOpenAI`` (``_generate``,
``_agenerate``, ``_stream``, ``_astream``: every sync/async, streaming or not, chat-completions or
Responses-API call passes through one of them) are wrapped so that, the first time an instance is
used inside a rollout, the hook goes onto its OpenAI clients' httpx clients. That covers models
built before ``instrument()`` too. ``unpatch`` restores the methods and takes the hook off every
client it was put on.

The role a request is sent under comes from :data:`request_role`, a context variable the callback
handler sets in ``on_chat_model_start``. The handler runs inline (``run_inline = True``), so it
runs in the context of the call itself and the value reaches the request (LangChain copies that
context into the tasks and threads it starts). With the role in the URL the gateway attributes the
call directly, which also covers streamed chat completions, whose messages carry no response id.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

import httpx

from lightning_rl.plugins import guarded, install_hooks, remove_hooks
from lightning_rl.tracing import current_rollout

__all__ = ["request_role", "patch_chat_openai", "unpatch_chat_openai", "hooked_clients"]

_log = logging.getLogger(__name__)

request_role: contextvars.ContextVar[str | None] = contextvars.ContextVar("lightning_langchain_role", default=None)
"""The role of the chat-model call being made in this context (set by the callback handler)."""

_METHODS = ("_generate", "_agenerate", "_stream", "_astream")
_originals: dict[str, Callable[..., Any]] = {}
_hooked: weakref.WeakSet[Any] = weakref.WeakSet()
_lock = threading.Lock()


def _role_source() -> str | None:
    return request_role.get()


def hooked_clients() -> list[httpx.Client | httpx.AsyncClient]:
    """The httpx clients that currently carry the routing hook (for tests and debugging)."""
    return list(_hooked)


@guarded
def _hook_model(model: Any) -> None:
    """Put the routing hook on ``model``'s httpx clients (once per client)."""
    for attr in ("root_client", "root_async_client"):
        openai_client = getattr(model, attr, None)
        http = getattr(openai_client, "_client", None)
        if http is None or not hasattr(http, "event_hooks") or http in _hooked:
            continue
        with _lock:  # rollouts in worker threads may reach a fresh client at the same time
            if install_hooks(http, role=_role_source):  # False: a routing hook is there already (yours); kept
                _hooked.add(http)


def _wrap(original: Callable[..., Any]) -> Callable[..., Any]:
    # Not async, not a generator: it returns what the original returns (a result, a coroutine or
    # an iterator), so one wrapper serves all four methods and runs before any request is made.
    @functools.wraps(original)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if current_rollout() is not None:
            _hook_model(self)
        return original(self, *args, **kwargs)

    return wrapper


def patch_chat_openai() -> bool:
    """Wrap ``BaseChatOpenAI``'s generation methods; False when langchain-openai is not installed."""
    try:
        from langchain_openai.chat_models.base import BaseChatOpenAI
    except ImportError:
        _log.debug("langchain-openai is not installed; ChatOpenAI calls are not routed")
        return False
    with _lock:
        if _originals:
            return True
        for name in _METHODS:
            original = BaseChatOpenAI.__dict__.get(name)
            if original is None:
                _log.debug("BaseChatOpenAI.%s not found; that path is not routed", name)
                continue
            _originals[name] = original
            setattr(BaseChatOpenAI, name, _wrap(original))
    return True


def unpatch_chat_openai() -> None:
    """Restore ``BaseChatOpenAI``'s methods and remove the hook from every client it was put on."""
    with _lock:
        if _originals:
            from langchain_openai.chat_models.base import BaseChatOpenAI

            for name, original in _originals.items():
                setattr(BaseChatOpenAI, name, original)
            _originals.clear()
        for http in list(_hooked):
            remove_hooks(http)
            _hooked.discard(http)
