"""The plugin of ``docs/plugins.md``'s walkthrough ("Write a plugin for a new framework"), run for real.

The "framework" is the plain ``openai`` SDK (always installed): the plugin routes every
``AsyncOpenAI`` chat call made inside a rollout to its gateway, under the role the agent's code runs
as, records the role by response id with its trainable flag, and turns the model's tool calls and
their results into tool spans. The doc quotes this file; a test below checks the quotes still match.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import openai
from openai.resources.chat.completions import AsyncCompletions
from openai.types.chat import ChatCompletion

from lightning_rl import semconv
from lightning_rl.plugins import Instrumentor, ToolRuns, acting_as, current_role, guarded, record_role
from lightning_rl.testing import FakeReply, FakeToolCall, GatewayHarness

DOC = Path(__file__).parents[3] / "docs" / "plugins.md"


# --8<-- [start:plugin]
class OpenAIChatInstrumentor(Instrumentor):
    """Route and record the plain ``openai`` SDK's chat calls (roles come from ``acting_as``)."""

    name = "walkthrough-openai"
    framework = "openai"  # the distribution whose version is checked before anything is patched
    supported = ">=1.0,<3"

    tools: ToolRuns[str]

    def _instrument(self, **kwargs: Any) -> None:
        patches = self.patches  # everything recorded here is undone by uninstrument()
        self.tools = ToolRuns()

        @guarded  # a bug in the plugin is logged and counted, never raised into the agent
        def after_call(response: ChatCompletion) -> None:
            role = current_role()
            record_role(role, response_id=response.id, trainable=self.is_trainable(role))
            for call in response.choices[0].message.tool_calls or ():
                if call.type == "function":
                    self.tools.start(call.id, call.function.name, call_id=call.id, role=role)

        def wrap(original: Any) -> Any:
            @functools.wraps(original)
            async def create(completions: AsyncCompletions, *args: Any, **kw: Any) -> Any:
                patches.hook_client(completions._client)  # pyright: ignore[reportPrivateUsage]
                response = await original(completions, *args, **kw)
                if isinstance(response, ChatCompletion):  # a stream carries no id: the role URL has the role
                    after_call(response)
                return response

            return create

        patches.wrap(AsyncCompletions, "create", wrap)

    def tool_result(self, call_id: str, output: str, error: str | None = None) -> None:
        """The agent ran the tool ``call_id`` asked for: a tool span (an AIR signal)."""
        run = self.tools.pop(call_id)
        if run is not None:
            self.tools.end(run, output=output, error=error)


# --8<-- [end:plugin]

MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]


# --8<-- [start:test]
async def test_the_walkthrough_plugin_routes_attributes_and_records_tools() -> None:
    original = AsyncCompletions.__dict__["create"]
    plugin = OpenAIChatInstrumentor().instrument(trainable=["writer"])
    script = [FakeReply(tool_calls=[FakeToolCall("lookup", {"q": "x"})]), "the review"]
    try:
        async with GatewayHarness(script=script) as h:
            # the agent's client points elsewhere, with another model name: routing fixes both
            client = openai.AsyncOpenAI(base_url="https://api.openai.com/v1", api_key="sk-user")
            async with h.attempt() as claim:
                with acting_as("writer"):
                    first = await client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
                [call] = first.choices[0].message.tool_calls or []
                plugin.tool_result(call.id, output="", error="lookup failed")
                with acting_as("critic"):
                    await client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
            spans = await h.spans(claim)
            calls = [s for s in spans if s.name == semconv.SPAN_LLM_CALL]
            assert [c.attributes[semconv.ROLE] for c in calls] == ["writer", "critic"]
            [tool] = [s for s in spans if s.name == semconv.SPAN_TOOL]
            assert tool.attributes[semconv.GEN_AI_TOOL_CALL_ID] == call.id and tool.status.code == "error"
            adapted = await h.adapt(claim)
            assert [t.role for t in adapted.transitions] == ["writer"]  # only the trainable role
            await client.close()
    finally:
        plugin.uninstrument()
    assert AsyncCompletions.__dict__["create"] is original  # the SDK is as it was


# --8<-- [end:test]


def test_the_doc_quotes_this_file() -> None:
    """Every Python block of the walkthrough is a part of this file, so the doc cannot drift."""
    doc = DOC.read_text()
    section = doc[doc.index("## Write a plugin for a new framework") :]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    source = Path(__file__).read_text()
    assert blocks and all(block in source for block in blocks)
