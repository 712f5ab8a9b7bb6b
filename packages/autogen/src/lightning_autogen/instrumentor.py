"""``AutoGenInstrumentor``: the process-wide integration (``wrap`` is the per-object one).

``instrument()`` patches four class methods on its install handle, restored by ``uninstrument()``:

* ``AssistantAgent.on_messages_stream``: every agent turn runs as the agent's role and records its
  tool results (the same observed stream ``wrap`` installs per object);
* ``BaseOpenAIChatCompletionClient.create`` / ``create_stream``: the first call of each OpenAI (or
  Azure) model client installs the routing hook on its httpx client, so clients built before or
  after ``instrument()`` are all routed;
* ``SelectorGroupChatManager.select_speaker``: speaker selection runs as ``selector_role``.

Trainable flags come from ``instrument(trainable=...)``.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.messages import BaseChatMessage
from autogen_agentchat.teams._group_chat._selector_group_chat import SelectorGroupChatManager
from autogen_core import CancellationToken
from autogen_ext.models.openai import BaseOpenAIChatCompletionClient

from lightning_autogen._routing import route
from lightning_autogen._turns import StreamItem, declare_trainable, observed_stream, trainable_flags
from lightning_rl.plugins import Instrumentor, acting_as, guarded

__all__ = ["AutoGenInstrumentor"]


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

    def _instrument(self, *, selector_role: str = "selector", **kwargs: Any) -> None:
        if kwargs:
            raise TypeError(f"unknown option(s) {sorted(kwargs)} for the autogen plugin; it takes selector_role.")
        patches = self.patches
        stream = patches.original(AssistantAgent, "on_messages_stream")
        select = patches.original(SelectorGroupChatManager, "select_speaker")

        def on_messages_stream(
            agent: AssistantAgent, messages: Sequence[BaseChatMessage], cancellation_token: CancellationToken
        ) -> AsyncGenerator[StreamItem]:
            observed = observed_stream(
                agent.name, stream.__get__(agent), trainable_flags(lambda: self.trainable, [agent.name])
            )
            return observed(messages, cancellation_token)

        def routing(original: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(original)
            def routed(client: BaseOpenAIChatCompletionClient, *args: Any, **kw: Any) -> Any:
                guarded(route)(patches, client)
                return original(client, *args, **kw)  # the coroutine / async generator, as is

            return routed

        async def select_speaker(manager: SelectorGroupChatManager, *args: Any, **kw: Any) -> Any:
            declare_trainable(trainable_flags(lambda: self.trainable, [selector_role]))
            with acting_as(selector_role):
                return await select(manager, *args, **kw)

        marked: Any = on_messages_stream
        marked.__lightning_original__ = stream  # what wrap() observes under the instrumentor
        patches.patch(AssistantAgent, "on_messages_stream", on_messages_stream)
        patches.wrap(BaseOpenAIChatCompletionClient, "create", routing)
        patches.wrap(BaseOpenAIChatCompletionClient, "create_stream", routing)
        patches.patch(SelectorGroupChatManager, "select_speaker", select_speaker)
