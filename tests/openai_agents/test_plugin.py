"""The OpenAI Agents SDK plugin against the real gateway: roles (handoffs included), tools, routing.

Every test runs real SDK agents (``Runner.run`` / ``Runner.run_streamed``) whose OpenAI client points
somewhere unreachable, with the SDK's placeholder model name: the plugin alone routes each call to
its rollout's gateway (the fake upstream answers only its served model name, so a call that was not
routed or not mapped fails). The fake upstream's replies depend on the conversation: the planner
hands off, the answerer searches, then answers with what the tool returned.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any, Literal

import httpx
import openai
import pytest
from agents import Agent, RunConfig, Runner, function_tool
from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
from agents.models.openai_provider import OpenAIProvider
from agents.models.openai_responses import OpenAIResponsesModel
from agents.tracing import TracingProcessor, add_trace_processor, get_trace_provider

from lightning_openai_agents import OpenAIAgentsInstrumentor, instrument, uninstrument
from lightning_rl import semconv
from lightning_rl.plugins import PluginFailures
from lightning_rl.testing import FakeReply, FakeToolCall, GatewayHarness

Api = Literal["chat_completions", "responses"]
APIS: list[Api] = ["chat_completions", "responses"]
UNREACHABLE = "http://127.0.0.1:9/v1"  # the app's own endpoint: nothing listens there


@function_tool
def search(query: str) -> str:
    """Search the notes for a query."""
    return f"note about {query}"


@function_tool
def explode(query: str) -> str:
    """A tool that always fails."""
    raise RuntimeError(f"index for {query} is corrupt")


def _text(body: dict[str, Any]) -> tuple[str, str, str]:
    """(system prompt, first user message, role of the last message) of an upstream request."""
    messages: list[dict[str, Any]] = body["messages"]
    system = " ".join(str(m.get("content")) for m in messages if m["role"] == "system")
    user = next((str(m.get("content")) for m in messages if m["role"] == "user"), "")
    return system, user, messages[-1]["role"]


def responder(body: dict[str, Any]) -> FakeReply | str:
    """Planner hands off; answerer calls its tool once, then answers with the tool's result."""
    system, user, last = _text(body)
    tool = "explode" if "explode" in [t["function"]["name"] for t in body.get("tools", [])] else "search"
    if "PLANNER" in system:
        return FakeReply(tool_calls=[FakeToolCall("transfer_to_answerer", {})])
    called = [c["function"]["name"] for m in body["messages"] for c in (m.get("tool_calls") or [])]
    if last == "tool" and tool in called:
        return f"answer: {body['messages'][-1].get('content')}"
    return FakeReply(tool_calls=[FakeToolCall(tool, {"query": user})])


def agents_for(api: Api, client: openai.AsyncOpenAI, *, tool: Any = search) -> Agent[Any]:
    """planner -> answerer, each with its own model object (as a user builds them)."""
    cls = OpenAIChatCompletionsModel if api == "chat_completions" else OpenAIResponsesModel
    answerer = Agent[Any](
        name="answerer",
        instructions="ANSWERER: search, then answer.",
        tools=[tool],
        model=cls(model="gpt-placeholder", openai_client=client),
    )
    return Agent[Any](
        name="planner",
        instructions="PLANNER: hand the question to the answerer.",
        handoffs=[answerer],
        model=cls(model="gpt-placeholder", openai_client=client),
    )


@pytest.fixture
async def client() -> AsyncIterator[openai.AsyncOpenAI]:
    c = openai.AsyncOpenAI(base_url=UNREACHABLE, api_key="sk-app", max_retries=0, http_client=httpx.AsyncClient())
    yield c
    await c.close()


async def _run(agent: Agent[Any], question: str, *, streamed: bool) -> str:
    if not streamed:
        return str((await Runner.run(agent, question)).final_output)
    result = Runner.run_streamed(agent, question)
    async for _event in result.stream_events():
        pass
    return str(result.final_output)


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
@pytest.mark.parametrize("api", APIS)
async def test_concurrent_runs_attribute_every_call_to_its_agent_across_handoffs(
    api: Api, streamed: bool, client: openai.AsyncOpenAI
) -> None:
    instrumentor = OpenAIAgentsInstrumentor()
    instrumentor.instrument(trainable=["answerer"])
    try:
        async with GatewayHarness(responder=responder) as h:
            agent = agents_for(api, client)

            async def one(i: int) -> tuple[Any, str]:
                async with h.attempt(task_input=i) as claim:
                    await asyncio.sleep(0.002 * (i % 3))  # interleave the rollouts
                    answer = await _run(agent, f"question {i}", streamed=streamed)
                return claim, answer

            done = await asyncio.gather(*(one(i) for i in range(8)))
            for i, (claim, answer) in enumerate(done):
                assert answer == f"answer: note about question {i}"
                every = await h.adapt(claim, trainable="all")
                assert [t.role for t in every.transitions] == ["planner", "answerer", "answerer"]
                assert all(t.rollout_id == claim.rollout.id and t.response_ids for t in every.transitions)
                # the plugin's declaration: only the answerer trains
                declared = await h.adapt(claim, air={"tool_success": 0.25})
                assert [t.role for t in declared.transitions] == ["answerer", "answerer"]
                assert declared.n_untrainable == 1
                assert [t.reward for t in declared.transitions] == [pytest.approx(0.25), 0.0]
                tools = [s for s in await h.spans(claim) if s.name == semconv.SPAN_TOOL]
                assert [s.attributes[semconv.GEN_AI_TOOL_NAME] for s in tools] == ["search"]
                assert tools[0].attributes["lightning.tool.joined_by"] == "tool_call_id"
                assert tools[0].attributes[semconv.ROLE] == "answerer"
            # every upstream call was mapped to the served model (the SDK sent its placeholder)
            assert len(h.upstream.requests) == 24 and {r["model"] for r in h.upstream.requests} == {h.model}
            assert all(bool(r.get("stream")) is streamed for r in h.upstream.requests)
    finally:
        instrumentor.uninstrument()


@pytest.mark.parametrize("api", APIS)
async def test_failing_tool_is_an_air_signal_on_the_call_that_requested_it(
    api: Api, client: openai.AsyncOpenAI, plugin: OpenAIAgentsInstrumentor
) -> None:
    async with GatewayHarness(responder=responder) as h:
        agent = agents_for(api, client, tool=explode)
        async with h.attempt(task_input="x") as claim:
            result = await Runner.run(agent, "which index?")
        # the SDK's default failure handler told the model; the run itself went on
        assert str(result.final_output).startswith("answer: An error occurred while running the tool")
        adapted = await h.adapt(claim, air={"tool_error": -1.0, "tool_success": 0.5})
        assert [t.role for t in adapted.transitions] == ["planner", "answerer", "answerer"]
        assert [t.reward for t in adapted.transitions] == [0.0, pytest.approx(-1.0), 0.0]
        [signal] = adapted.signals
        assert signal.name == "tool_error" and signal.tool == "explode" and signal.role == "answerer"
        assert signal.tool_call_id in adapted.transitions[1].tool_call_ids
        [tool] = [s for s in await h.spans(claim) if s.name == semconv.SPAN_TOOL]
        assert tool.status.code == "error" and "Error running tool" in tool.attributes[semconv.TOOL_ERROR]
        assert json.loads(tool.attributes["gen_ai.tool.call.arguments"]) == {"query": "which index?"}


async def test_instrument_and_uninstrument_are_idempotent_and_restore_the_sdk(client: openai.AsyncOpenAI) -> None:
    class UserProcessor(TracingProcessor):
        def on_trace_start(self, trace: Any) -> None: ...
        def on_trace_end(self, trace: Any) -> None: ...
        def on_span_start(self, span: Any) -> None: ...
        def on_span_end(self, span: Any) -> None: ...
        def shutdown(self) -> None: ...
        def force_flush(self) -> None: ...

    uninstrument()
    multi: Any = get_trace_provider()._multi_processor  # pyright: ignore[reportAttributeAccessIssue]
    user = UserProcessor()
    add_trace_processor(user)
    before = list(multi._processors)
    originals = {
        (cls, m): cls.__dict__[m]
        for cls in (OpenAIChatCompletionsModel, OpenAIResponsesModel)
        for m in ("get_response", "stream_response")
    }
    try:
        first = instrument(trainable=["answerer"])
        assert instrument(trainable=["nobody"]) is first and first.is_trainable("answerer")  # second call ignored
        processors = list(multi._processors)
        assert processors == [user, first.processor]  # the default exporter is out, the user's stays
        assert all(cls.__dict__[m] is not original for (cls, m), original in originals.items())
        async with GatewayHarness(responder=responder) as h:
            agent = agents_for("chat_completions", client)
            async with h.attempt(task_input=1) as claim:
                await Runner.run(agent, "question 1")
            assert len((await h.adapt(claim)).transitions) == 2
            routing = first.routing
            assert routing is not None and routing.hooked_clients == 1
            hooks_while_on = list(client._client.event_hooks["request"])  # pyright: ignore[reportPrivateUsage]
            uninstrument()
            uninstrument()
            assert list(multi._processors) == before
            assert all(cls.__dict__[m] is original for (cls, m), original in originals.items())
            assert len(client._client.event_hooks["request"]) == len(hooks_while_on) - 1  # pyright: ignore[reportPrivateUsage]
            # not instrumented: the app's calls go where the app points, rollout or not
            async with h.attempt(task_input=2):
                with pytest.raises(openai.APIConnectionError):  # (tracing off: the SDK's exporter is back)
                    await Runner.run(agent, "question 2", run_config=RunConfig(tracing_disabled=True))
    finally:
        uninstrument()
        multi.set_processors([p for p in multi._processors if p is not user])


async def test_calls_outside_a_rollout_are_left_alone(plugin: OpenAIAgentsInstrumentor) -> None:
    async with GatewayHarness(responder=responder) as h:
        direct = openai.AsyncOpenAI(base_url=h.v1, api_key="k", http_client=httpx.AsyncClient())
        agent = Agent[Any](
            name="solo",
            instructions="ANSWERER",
            tools=[search],
            model=OpenAIChatCompletionsModel(model=h.model, openai_client=direct),
        )
        result = await Runner.run(agent, "plain question")
        assert result.final_output == "answer: note about plain question"
        assert plugin.routing is not None and plugin.routing.hooked_clients == 0
        assert not [s for s in await h.store.query_spans() if s.rollout_id]
        await direct.close()


async def test_a_plugin_failure_never_breaks_the_run(
    plugin: OpenAIAgentsInstrumentor, client: openai.AsyncOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    processor = plugin.processor
    assert processor is not None

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("plugin bug")

    monkeypatch.setattr(processor, "_tool_ended", broken)
    before = PluginFailures.count
    async with GatewayHarness(responder=responder) as h:
        async with h.attempt(task_input=3):
            result = await Runner.run(agents_for("responses", client), "question 3")
    assert result.final_output == "answer: note about question 3"
    assert PluginFailures.count == before + 1


async def test_per_run_provider_and_default_placeholder_model_are_routed(plugin: OpenAIAgentsInstrumentor) -> None:
    """The SDK's own provider path: an agent with no model, the provider from the run config."""
    async with GatewayHarness(responder=responder) as h:
        http = httpx.AsyncClient()
        provider = OpenAIProvider(
            openai_client=openai.AsyncOpenAI(base_url=UNREACHABLE, api_key="sk-app", http_client=http),
            use_responses=False,
        )
        agent = Agent[Any](name="answerer", instructions="ANSWERER", tools=[search])
        async with h.attempt(task_input=4) as claim:
            result = await Runner.run(agent, "q4", run_config=RunConfig(model_provider=provider))
        assert result.final_output == "answer: note about q4"
        assert [t.role for t in (await h.adapt(claim)).transitions] == ["answerer", "answerer"]
        await http.aclose()


async def test_one_long_trace_keeps_no_span_state_and_a_hooked_client_is_untouched_after_the_rollout(
    client: openai.AsyncOpenAI, plugin: OpenAIAgentsInstrumentor
) -> None:
    """A user may wrap a whole training loop in one ``trace()``: the processor must not grow with it.
    And the client hooked during a rollout goes back to its own endpoint once the rollout is over."""
    from agents import trace

    processor = plugin.processor
    assert processor is not None
    async with GatewayHarness(responder=responder) as h:
        agent = agents_for("chat_completions", client)
        with trace("training loop"):
            for i in range(3):
                async with h.attempt(task_input=i) as claim:
                    await Runner.run(agent, f"question {i}")
                assert len((await h.adapt(claim, trainable="all")).transitions) == 3
                assert processor.tracked_spans <= 2  # the open trace's own agent span at most, never growing
        routing = plugin.routing
        assert routing is not None and routing.hooked_clients >= 1
        upstream_calls = len(h.upstream.requests)
        with pytest.raises(openai.APIConnectionError):  # its own (unreachable) endpoint, not the gateway
            await Runner.run(agent, "after training")
        assert len(h.upstream.requests) == upstream_calls
