"""The CrewAI plugin against real crews and the real gateway: routing, exact roles, AIR, lifecycle.

Every crew here is real CrewAI (agents, tasks, a tool, the native OpenAI provider, the event bus)
talking to the real gateway (``GatewayHarness``); the only double is the scripted upstream standing
in for vLLM. The crews' ``LLM`` points at a port where nothing listens, so every call that reaches
the gateway was routed by the plugin. One ``LLM`` is shared by all agents of all crews, so a role
can only come from the call itself, never from the client.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from typing import Any, cast

import pytest
from crewai import LLM, Agent, Crew, CrewOutput, Process, Task
from crewai.agents.agent_executor import AgentExecutor
from crewai.events import LLMCallCompletedEvent, crewai_event_bus
from crewai.llms.providers.openai.completion import OpenAICompletion
from crewai.tools import tool

import lightning_crewai
from lightning_crewai import CrewAIInstrumentor
from lightning_rl import semconv
from lightning_rl.adapter import air_policy
from lightning_rl.plugins import PluginFailures, load_plugin
from lightning_rl.testing import FakeReply, FakeToolCall, GatewayHarness
from lightning_rl.types import Claim, Span

RESEARCHER = "researcher"
WRITER = "senior writer"  # a space: the role travels in the URL path, quoted
# CrewAI reads its own deprecated Agent fields (function_calling_llm, allow_code_execution, ...)
# while building every agent; only deprecation warnings raised from CrewAI's modules are ignored.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:crewai")

UNROUTED = "http://127.0.0.1:9/v1"  # nothing listens here
TABLE = {"k0": "amber", "k2": "cobalt"}  # k1 and k3 are missing: the lookup raises


@tool("lookup")
def lookup(key: str) -> str:
    """Return the value stored under key."""
    if key not in TABLE:
        raise KeyError(f"no value stored under {key}")
    return TABLE[key]


def _key(messages: list[dict[str, Any]]) -> str:
    found = re.search(r"key (k\d+)", " ".join(str(m.get("content") or "") for m in messages))
    return found.group(1) if found else "k?"


def reply(body: dict[str, Any]) -> FakeReply | str:
    """The scripted model: the researcher calls ``lookup`` once, then reports; the writer answers."""
    messages: list[dict[str, Any]] = body["messages"]
    if body.get("tools"):  # only the researcher has tools
        if messages[-1]["role"] != "tool":
            return FakeReply(tool_calls=[FakeToolCall("lookup", {"key": _key(messages)})])
        return f"REPORT {_key(messages)}: {messages[-1]['content']}"
    return f"FINAL for {_key(messages)}"


def build_crew(i: int, llm: LLM) -> Crew:
    """Two agents: the researcher looks up key ``k{i}`` with a tool, the writer answers from its report."""
    researcher = Agent(role=RESEARCHER, goal="Find stored values", backstory="Careful.", tools=[lookup], llm=llm)
    writer = Agent(role=WRITER, goal="Write the final answer", backstory="Brief.", llm=llm)
    research = Task(description=f"Look up key k{i}.", expected_output="The value.", agent=researcher)
    write = Task(description=f"Answer for key k{i}.", expected_output="One line.", agent=writer, context=[research])
    return Crew(agents=[researcher, writer], tasks=[research, write], process=Process.sequential, verbose=False)


async def kickoff(crew: Crew, *, native_async: bool = False) -> str:
    """The crew's final text, from ``kickoff_async()`` (a thread per crew) or ``akickoff()`` (native async)."""
    out = await (crew.akickoff() if native_async else crew.kickoff_async())
    assert isinstance(out, CrewOutput)
    return out.raw


def user_llm() -> LLM:
    """The LLM a user configures (its own URL, key and model name); the plugin reroutes it."""
    return LLM(model="openai/gpt-4o-mini", base_url=UNROUTED, api_key="sk-user", max_retries=0)


@pytest.fixture
def plugin() -> Iterator[CrewAIInstrumentor]:
    instrumentor = CrewAIInstrumentor()
    yield instrumentor
    instrumentor.uninstrument()


def _calls(spans: list[Span]) -> list[Span]:
    return sorted((s for s in spans if s.name == semconv.SPAN_LLM_CALL), key=lambda s: (s.start_ns, s.seq))


async def test_concurrent_crews_are_routed_attributed_and_get_air_on_the_requesting_call(
    plugin: CrewAIInstrumentor,
) -> None:
    # Agents and the LLM are built BEFORE instrument(): the plugin must still cover them.
    llm = user_llm()
    crews = [build_crew(i, llm) for i in range(4)]
    plugin.instrument(trainable=[RESEARCHER])

    async with GatewayHarness(responder=reply) as h:

        async def one(i: int) -> tuple[Claim, str]:
            async with h.attempt(task_input=i) as claim:
                raw = await kickoff(crews[i], native_async=i >= 2)  # both entry points
            return claim, raw

        done = await asyncio.gather(*(one(i) for i in range(4)))
        policy = air_policy(tool_error=-1.0, tool_success=0.5)
        for i, (claim, raw) in enumerate(done):
            assert raw == f"FINAL for k{i}"  # each crew saw only its own conversation
            spans = await h.spans(claim)
            calls = _calls(spans)
            # exact roles on the gateway's own calls: researcher (tool call, report), then writer
            assert [c.attributes.get(semconv.ROLE) for c in calls] == [RESEARCHER, RESEARCHER, WRITER]
            [requested] = json.loads(calls[0].attributes[semconv.TOOL_CALLS])
            # the listener's role spans join the same calls by response id and declare trainability
            roles = {s.attributes[semconv.GEN_AI_RESPONSE_ID]: s for s in spans if s.name == semconv.SPAN_AGENT}
            for call in calls:
                declared = roles[call.attributes[semconv.GEN_AI_RESPONSE_ID]]
                assert declared.attributes[semconv.ROLE] == call.attributes[semconv.ROLE]
                assert declared.attributes[semconv.TRAINABLE] is (call.attributes[semconv.ROLE] == RESEARCHER)
            [tool_span] = [s for s in spans if s.name == semconv.SPAN_TOOL]
            assert tool_span.attributes[semconv.GEN_AI_TOOL_CALL_ID] == requested["id"]
            assert tool_span.attributes["lightning.tool.joined_by"] == "tool_call_id"
            assert tool_span.attributes[semconv.ROLE] == RESEARCHER

            # only the trainable role is trained; the tool's signal lands on the call that requested it
            adapted = await h.adapt(claim, air=policy)
            assert [t.role for t in adapted.transitions] == [RESEARCHER, RESEARCHER]
            assert adapted.n_untrainable == 1
            failed = i % 2 == 1
            first, second = adapted.transitions
            assert first.tool_call_ids == [requested["id"]]
            assert first.reward == pytest.approx(-1.0 if failed else 0.5) and second.reward == 0.0
            if failed:
                assert tool_span.status.code == "error"
                assert f"no value stored under k{i}" in tool_span.attributes[semconv.TOOL_ERROR]
            else:
                assert tool_span.attributes["gen_ai.tool.call.result"] == TABLE[f"k{i}"]


def _ours(event_type: type[Any]) -> int:
    handlers = crewai_event_bus._sync_handlers.get(event_type, frozenset())  # pyright: ignore[reportPrivateUsage]
    return sum(getattr(h, "__module__", "") == "lightning_crewai._listener" for h in handlers)


async def test_instrument_is_idempotent_and_uninstrument_restores_crewai(plugin: CrewAIInstrumentor) -> None:
    assert load_plugin("crewai") is plugin  # the entry point resolves to the singleton
    originals = {
        name: OpenAICompletion.__dict__[name] for name in ("call", "acall", "_get_sync_client", "_get_async_client")
    }
    original_tool_call = AgentExecutor.__dict__["_execute_single_native_tool_call"]

    lightning_crewai.instrument(trainable=[WRITER])
    patched_call = OpenAICompletion.__dict__["call"]
    lightning_crewai.instrument(trainable=[RESEARCHER])  # ignored: already instrumented
    assert OpenAICompletion.__dict__["call"] is patched_call is not originals["call"]
    assert plugin.is_trainable(WRITER) and not plugin.is_trainable(RESEARCHER)
    assert _ours(LLMCallCompletedEvent) == 1

    llm = user_llm()
    async with GatewayHarness(responder=reply) as h:
        auditor = Agent(role="auditor", goal="Check", backstory="Strict.", llm=llm)
        async with h.attempt(task_input=0) as routed:
            assert await kickoff(build_crew(0, llm)) == "FINAL for k0"
            # CrewAI's async client (LLM.acall) is routed and attributed the same way
            assert await llm.acall("Answer for key k5.", from_agent=auditor) == "FINAL for k5"
        await cast(Any, llm)._get_async_client().close()  # its connection belongs to this test's event loop
        roles = [c.attributes.get(semconv.ROLE) for c in _calls(await h.spans(routed))]
        assert roles == [RESEARCHER, RESEARCHER, WRITER, "auditor"]

        lightning_crewai.uninstrument()
        lightning_crewai.uninstrument()
        assert {name: OpenAICompletion.__dict__[name] for name in originals} == originals
        assert AgentExecutor.__dict__["_execute_single_native_tool_call"] is original_tool_call
        assert _ours(LLMCallCompletedEvent) == 0 and not plugin.is_instrumented
        hooks = cast(Any, llm)._get_sync_client()._client.event_hooks["request"]  # pyright: ignore[reportPrivateUsage]
        assert not any(getattr(hook, "_lightning_route_hook", False) for hook in hooks)

        # Uninstrumented, a crew inside a rollout goes where its LLM points and nothing is recorded.
        plain = LLM(model=f"openai/{h.model}", base_url=h.v1, api_key="k", max_retries=0)
        async with h.attempt(task_input=2) as unrouted:
            assert await kickoff(build_crew(2, plain)) == "FINAL for k2"
        assert await h.spans(unrouted) == []


async def test_a_failing_listener_never_breaks_the_crew(
    plugin: CrewAIInstrumentor, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("listener bug")

    monkeypatch.setattr("lightning_crewai._listener.record_role", broken)
    monkeypatch.setattr("lightning_crewai._listener.record_tool", broken)
    plugin.instrument()
    before = PluginFailures.count
    async with GatewayHarness(responder=reply) as h:
        async with h.attempt(task_input=1) as claim:
            raw = await kickoff(build_crew(1, user_llm()))
        assert raw == "FINAL for k1"  # the tool error and the listener's failures changed nothing
        assert PluginFailures.count >= before + 4  # three role spans and one tool span failed, all swallowed
        # routing is independent of the listener: the calls still reached the gateway with their roles
        assert [c.attributes.get(semconv.ROLE) for c in _calls(await h.spans(claim))] == [
            RESEARCHER,
            RESEARCHER,
            WRITER,
        ]
