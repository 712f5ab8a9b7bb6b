"""Send the Agents SDK's model calls to the current rollout's gateway, with the calling agent's role.

The SDK's two OpenAI models (``OpenAIChatCompletionsModel`` and ``OpenAIResponsesModel``, which
``OpenAIProvider`` builds for plain model names) send every request through the httpx client of
their ``AsyncOpenAI``. Whichever client the user configured (``OPENAI_BASE_URL``,
``set_default_openai_client``, a per-agent model, a per-run ``OpenAIProvider``), the first call
made inside a rollout adds core's routing hook to that httpx client. The hook asks, at request
time, which agent is running (from the SDK's current span) and rewrites the request to that role's
URL on the attempt's gateway. Outside a rollout the hook changes nothing, so the same agent keeps
working in production; ``uninstrument()`` removes the hook from every client it was added to.

Patching the two methods (instead of ``Runner.run``) keeps user-supplied ``RunConfig``s, hooks and
providers untouched, and covers streaming: ``stream_response`` is wrapped without re-yielding.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
from agents.models.openai_responses import OpenAIResponsesModel

from lightning_rl.plugins import current_route, guarded, install_hooks, remove_hooks

__all__ = ["ModelRouting"]

_PATCHED_METHODS = ("get_response", "stream_response")
_MODEL_CLASSES: tuple[type[Any], ...] = (OpenAIChatCompletionsModel, OpenAIResponsesModel)


class ModelRouting:
    """Installs (and removes) the per-request routing of the SDK's OpenAI models.

    Args:
        role: Asked at request time for the calling agent's name (the role).
    """

    def __init__(self, role: Callable[[], str | None]) -> None:
        self._role = role
        self._originals: dict[tuple[type[Any], str], Any] = {}
        self._hooked: weakref.WeakSet[Any] = weakref.WeakSet()

    @property
    def hooked_clients(self) -> int:
        """How many httpx clients carry the routing hook now."""
        return len(self._hooked)

    def install(self) -> None:
        for cls in _MODEL_CLASSES:
            for method in _PATCHED_METHODS:
                original = cls.__dict__.get(method)
                if original is None or (cls, method) in self._originals:
                    continue
                self._originals[(cls, method)] = original
                setattr(cls, method, self._wrap(original))

    def uninstall(self) -> None:
        for (cls, method), original in self._originals.items():
            setattr(cls, method, original)
        self._originals.clear()
        for http in list(self._hooked):
            guarded(remove_hooks)(http)
        self._hooked = weakref.WeakSet()

    def _wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        # A plain function returning the original's coroutine / async generator: awaiting,
        # streaming and closing behave exactly as without the plugin.
        @functools.wraps(original)
        def routed(model: Any, *args: Any, **kwargs: Any) -> Any:
            self._hook_model(model)
            return original(model, *args, **kwargs)

        return routed

    @guarded
    def _hook_model(self, model: Any) -> None:
        """Add the routing hook to ``model``'s httpx client, once, when inside a rollout."""
        if current_route() is None:
            return
        client = getattr(model, "_client", None)
        if client is None:
            client = model._get_client()  # the SDK creates its default client lazily
        http = getattr(client, "_client", None)  # the AsyncOpenAI's httpx (or httpx2) client
        if http is None or not hasattr(http, "event_hooks"):
            return
        if install_hooks(http, role=self._role):
            self._hooked.add(http)
