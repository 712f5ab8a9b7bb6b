"""``AutoGenInstrumentor``: the process-wide integration (``wrap`` is the per-object one).

``instrument()`` patches three class methods, each restored by ``uninstrument()``:

* ``AssistantAgent.on_messages_stream``: every agent turn runs as the agent's role and records its
  tool results (the same observed stream ``wrap`` installs per object);
* ``BaseOpenAIChatCompletionClient.create`` / ``create_stream``: the first call of each OpenAI (or
  Azure) model client installs the routing hook on its httpx client, so clients built before or
  after ``instrument()`` are all routed;
* ``SelectorGroupChatManager.select_speaker``: speaker selection runs as ``selector_role``.

Trainable flags come from ``instrument(trainable=...)``.
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any, ClassVar

import httpx
from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.messages import BaseChatMessage
from autogen_agentchat.teams._group_chat._selector_group_chat import SelectorGroupChatManager
from autogen_core import CancellationToken
from autogen_ext.models.openai import BaseOpenAIChatCompletionClient

from lightning_autogen._routing import add_owner, http_client_of, remove_owner
from lightning_autogen._turns import StreamItem, declare_trainable, observed_stream
from lightning_rl.plugins import Instrumentor, acting_as, guarded

__all__ = ["AutoGenInstrumentor"]

_PATCHED: tuple[tuple[type, str], ...] = (
    (AssistantAgent, "on_messages_stream"),
    (BaseOpenAIChatCompletionClient, "create"),
    (BaseOpenAIChatCompletionClient, "create_stream"),
    (SelectorGroupChatManager, "select_speaker"),
)


class AutoGenInstrumentor(Instrumentor):
    """Route and record every AutoGen AgentChat agent in the process.

    ``AutoGenInstrumentor().instrument(trainable=["solver"])`` once at start-up; build agents and
    teams as usual. Option: ``selector_role`` (default ``"selector"``), the role of
    ``SelectorGroupChat``'s speaker-selection calls.
    """

    name = "autogen"
    framework = "autogen-agentchat"
    supported = ">=0.7.5,<0.8"
    install_hint = "pip install 'lightning-autogen[autogen]'"

    _originals: ClassVar[dict[tuple[type, str], Any]] = {}
    _routed: weakref.WeakSet[httpx.AsyncClient]

    def _flags(self, *roles: str) -> Callable[[], dict[str, bool]]:
        def flags() -> dict[str, bool]:
            return {} if self.trainable is None else {role: self.trainable(role) for role in roles}

        return flags

    @guarded
    def _route(self, model_client: object) -> None:
        http = http_client_of(model_client)
        if http is not None and http not in self._routed and add_owner(http):
            self._routed.add(http)

    def _instrument(self, *, selector_role: str = "selector", **kwargs: Any) -> None:
        if kwargs:
            raise TypeError(f"unknown option(s) {sorted(kwargs)} for the autogen plugin; it takes selector_role.")
        self._routed = weakref.WeakSet()
        originals = {(cls, attr): cls.__dict__[attr] for cls, attr in _PATCHED}
        stream, create, create_stream, select = (originals[key] for key in _PATCHED)

        def on_messages_stream(
            agent: AssistantAgent, messages: Sequence[BaseChatMessage], cancellation_token: CancellationToken
        ) -> AsyncGenerator[StreamItem]:
            observed = observed_stream(agent.name, stream.__get__(agent), self._flags(agent.name))
            return observed(messages, cancellation_token)

        async def routed_create(client: BaseOpenAIChatCompletionClient, *args: Any, **kw: Any) -> Any:
            self._route(client)
            return await create(client, *args, **kw)

        def routed_create_stream(client: BaseOpenAIChatCompletionClient, *args: Any, **kw: Any) -> Any:
            self._route(client)
            return create_stream(client, *args, **kw)

        async def select_speaker(manager: SelectorGroupChatManager, *args: Any, **kw: Any) -> Any:
            declare_trainable(self._flags(selector_role))
            with acting_as(selector_role):
                return await select(manager, *args, **kw)

        replacements = (on_messages_stream, routed_create, routed_create_stream, select_speaker)
        for (cls, attr), replacement in zip(_PATCHED, replacements, strict=True):
            marked: Any = replacement
            marked.__lightning_original__ = originals[(cls, attr)]
            setattr(cls, attr, replacement)
        type(self)._originals = originals

    def _uninstrument(self) -> None:
        for (cls, attr), original in type(self)._originals.items():
            setattr(cls, attr, original)
        type(self)._originals = {}
        for http in list(self._routed):
            remove_owner(http)
        self._routed = weakref.WeakSet()
