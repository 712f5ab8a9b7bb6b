"""``LangChainInstrumentor``: one call makes every LangChain/LangGraph run in the process trainable.

It installs the callback handler and the ``ChatOpenAI`` routing on the plugin's install handle. The
handler is the *default* of a context variable given to LangChain's configure hook, so every run in
every thread gets it. There is no public way to unregister the hook: the undo edits the private
``_configure_hooks`` list and disables the handler, which stops it even should that list change.
"""

from __future__ import annotations

import contextvars
import logging
from typing import Any, ClassVar

from lightning_langchain.handler import LightningCallbackHandler
from lightning_langchain.routing import route_chat_openai
from lightning_rl.plugins import Instrumentor
from lightning_rl.roles import RoleSelector, RoleSpec

__all__ = ["LangChainInstrumentor", "instrument", "uninstrument", "current_handler"]

_log = logging.getLogger(__name__)


class LangChainInstrumentor(Instrumentor):
    """The Lightning plugin for LangChain / LangGraph (entry point ``langchain``); options: the README's "Options"."""

    name: ClassVar[str] = "langchain"
    framework: ClassVar[str] = "langchain-core"
    supported: ClassVar[str] = ">=1.0,<2"
    install_hint: ClassVar[str] = "pip install 'lightning-langchain[langchain]'"

    _handler: LightningCallbackHandler | None = None

    @property
    def handler(self) -> LightningCallbackHandler | None:
        """The registered handler while instrumented, else None."""
        return self._handler

    def _instrument(self, **kwargs: Any) -> None:
        from langchain_core.tracers.context import register_configure_hook

        route = bool(kwargs.pop("route", True))
        if kwargs:
            raise TypeError(f"unknown option(s) for the langchain plugin: {sorted(kwargs)}; the only one is route=.")
        handler = LightningCallbackHandler(self.is_trainable)
        # A fresh variable per instrument(): its default is the handler, visible in every context.
        var: contextvars.ContextVar[LightningCallbackHandler | None] = contextvars.ContextVar(
            "lightning_langchain_handler", default=handler
        )
        register_configure_hook(var, inheritable=True)
        self._handler = handler
        self.patches.on_restore(lambda: self._unregister(var))
        if route:
            route_chat_openai(self.patches)

    def _unregister(self, var: contextvars.ContextVar[Any]) -> None:
        if self._handler is not None:
            self._handler.enabled = False
        self._handler = None
        try:
            from langchain_core.tracers import context

            hooks: list[Any] = context._configure_hooks  # pyright: ignore[reportPrivateUsage]
            hooks[:] = [entry for entry in hooks if entry[0] is not var]
        except Exception:  # the handler is disabled anyway
            _log.debug("could not remove the LangChain configure hook; the handler is disabled instead", exc_info=True)


def instrument(trainable: RoleSpec | RoleSelector = None, **kwargs: Any) -> LangChainInstrumentor:
    """Instrument LangChain/LangGraph for training (idempotent): ``trainable=`` roles (a runnable's own
    ``lightning_trainable`` flag wins), ``check_version=True``, ``route=True`` (the README's "Options")."""
    return LangChainInstrumentor().instrument(trainable=trainable, **kwargs)


def uninstrument() -> None:
    """Undo :func:`instrument`: the handler is unregistered and ``ChatOpenAI`` is restored."""
    LangChainInstrumentor().uninstrument()


def current_handler() -> LightningCallbackHandler | None:
    """The globally registered handler, or None when not instrumented."""
    return LangChainInstrumentor().handler
