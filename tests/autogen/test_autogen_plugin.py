"""The AutoGen plugin against the real gateway: routing, per-agent roles, trainable flags, tool AIR, unwrap."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.base import TaskResult
from autogen_agentchat.conditions import MaxMessageTermination, TextMentionTermination
from autogen_agentchat.messages import ToolCallExecutionEvent, ToolCallRequestEvent
from autogen_agentchat.teams import RoundRobinGroupChat, SelectorGroupChat
from autogen_core.models import ModelFamily, ModelInfo
from autogen_ext.models.openai import OpenAIChatCompletionClient

from lightning_autogen import AutoGenInstrumentor, is_wrapped, unwrap, wrap
from lightning_rl import semconv
from lightning_rl.adapter import air_policy
from lightning_rl.plugins import PluginFailures
from lightning_rl.testing import FakeReply, FakeToolCall, GatewayHarness

NOWHERE = "http://127.0.0.1:9/v1"  # nothing listens here: only routing can make these calls succeed
MODEL_INFO = ModelInfo(
    vision=False, function_calling=True, json_output=False, family=ModelFamily.UNKNOWN, structured_output=False
)
MakeClient = Callable[..., OpenAIChatCompletionClient]


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def divide(a: int, b: int) -> float:
    """Divide a by b."""
    return a / b


def reply(body: dict[str, Any]) -> FakeReply | str:
    """The fake model: the solver calls its tool then reports; the reviewer approves; the selector picks."""
    messages: list[dict[str, Any]] = body["messages"]
    system = str(messages[0].get("content") or "")
    everything = json.dumps(messages)
    if "select the next role" in everything:
        return "reviewer" if "The answer is" in everything else "solver"
    if system.startswith("You are reviewer"):
        return "APPROVED"
    last = messages[-1]
    if last["role"] == "tool":
        return f"The answer is {last['content']}."
    match = re.search(r"(add|divide) (-?\d+) and (-?\d+)", everything)
    assert match is not None, everything
    return FakeReply(tool_calls=[FakeToolCall(match.group(1), {"a": int(match.group(2)), "b": int(match.group(3))})])


@pytest.fixture
async def client() -> AsyncIterator[MakeClient]:
    """Builds OpenAI model clients the way a user would (any URL, key and model name); closes them after."""
    made: list[OpenAIChatCompletionClient] = []

    def make(base_url: str = NOWHERE, model: str = "some-model") -> OpenAIChatCompletionClient:
        made.append(
            OpenAIChatCompletionClient(
                model=model, base_url=base_url, api_key="user-key", model_info=MODEL_INFO, max_retries=0
            )
        )
        return made[-1]

    yield make
    for c in made:
        await c.close()


def solver(model_client: OpenAIChatCompletionClient) -> AssistantAgent:
    return AssistantAgent(
        "solver",
        model_client=model_client,
        tools=[add, divide],
        system_message="You are solver. Use your tools.",
        reflect_on_tool_use=True,
    )


def reviewer(model_client: OpenAIChatCompletionClient) -> AssistantAgent:
    return AssistantAgent("reviewer", model_client=model_client, system_message="You are reviewer. Say APPROVED.")


def round_robin(solver_client: OpenAIChatCompletionClient, reviewer_client: OpenAIChatCompletionClient) -> Any:
    stop = TextMentionTermination("APPROVED") | MaxMessageTermination(8)
    return RoundRobinGroupChat([solver(solver_client), reviewer(reviewer_client)], termination_condition=stop)


def contents(result: TaskResult) -> list[str]:
    return [str(getattr(m, "content", "")) for m in result.messages]


@pytest.mark.parametrize("shared", [True, False], ids=["one-shared-client", "client-per-agent"])
async def test_team_of_two_attributes_each_call_and_trains_only_the_chosen_agent(
    shared: bool, client: MakeClient
) -> None:
    failures = PluginFailures.count
    shared_client = client()  # one client for every agent of every rollout: roles come from the agent's turn
    async with GatewayHarness(responder=reply) as h:

        async def one(i: int) -> Any:
            team = round_robin(shared_client, shared_client) if shared else round_robin(client(), client())
            wrap(team, trainable=["solver"])
            async with h.attempt(task_input=i) as claim:
                await asyncio.sleep(0.002 * (8 - i))  # interleave the rollouts
                result = await team.run(task=f"Task {i}: add {i} and {10 * i}")
            unwrap(team)
            return claim, result

        done = await asyncio.gather(*(one(i) for i in range(8)))
        for i, (claim, result) in enumerate(done):
            assert f"The answer is {11 * i}." in contents(result) and contents(result)[-1] == "APPROVED"
            calls = [s for s in await h.spans(claim) if s.name == semconv.SPAN_LLM_CALL]
            # the gateway recorded each call's role from the role URL: two solver calls, then the reviewer's
            assert [c.attributes[semconv.ROLE] for c in calls] == ["solver", "solver", "reviewer"]
            adapted = await h.adapt(claim)  # the trainer's default: honour the plugin's declarations
            assert [t.role for t in adapted.transitions] == ["solver", "solver"]
            assert adapted.n_untrainable == 1  # the reviewer's call: recorded, not trained
            assert {t.rollout_id for t in adapted.transitions} == {claim.rollout.id}
            assert all(t.response_ids and t.prompt_ids for t in adapted.transitions)
    assert PluginFailures.count == failures


async def test_a_failing_tool_is_an_air_signal_on_the_call_that_requested_it(client: MakeClient) -> None:
    policy = air_policy(tool_error=-1.0, tool_success=0.25)
    async with GatewayHarness(responder=reply) as h:
        team = wrap(round_robin(client(), client()), trainable=["solver"])
        async with h.attempt() as claim:
            result = await team.run(task="Task: divide 7 and 0")
        [execution] = [m for m in result.messages if isinstance(m, ToolCallExecutionEvent)]
        [failed] = execution.content
        assert failed.is_error and "division by zero" in failed.content
        adapted = await h.adapt(claim, air=policy)
        assert [t.role for t in adapted.transitions] == ["solver", "solver"]
        first, second = adapted.transitions
        # joined by the tool-call id the gateway parsed from the first call's response
        assert first.tool_call_ids == [failed.call_id]
        assert first.reward == pytest.approx(-1.0) and second.reward == 0.0
        [tool] = [s for s in await h.spans(claim) if s.name == semconv.SPAN_TOOL]
        assert tool.attributes[semconv.GEN_AI_TOOL_CALL_ID] == failed.call_id
        assert tool.attributes[semconv.ROLE] == "solver" and tool.status.code == "error"
        assert "division by zero" in tool.attributes[semconv.TOOL_ERROR]
        assert json.loads(tool.attributes["gen_ai.tool.call.arguments"]) == {"a": 7, "b": 0}

        working = wrap(round_robin(client(), client()), trainable=["solver"])
        async with h.attempt() as ok:
            await working.run(task="Task: add 2 and 3")
        assert [t.reward for t in (await h.adapt(ok, air=policy)).transitions] == [pytest.approx(0.25), 0.0]


async def test_outside_a_rollout_the_wrapped_team_calls_where_it_did_before_and_unwrap_restores(
    client: MakeClient,
) -> None:
    async with GatewayHarness(responder=reply) as h:
        team = round_robin(client(h.v1, h.model), client(h.v1, h.model))
        agent = team._participants[0]
        http = agent._model_client._client._client
        hooks_before = list(http.event_hooks["request"])
        assert wrap(team, trainable=["solver"]) is team and is_wrapped(team)
        assert wrap(team, trainable=["reviewer"]) is team  # a second wrap is a no-op
        assert len(http.event_hooks["request"]) == len(hooks_before) + 1
        result = await team.run(task="Task: add 1 and 2")
        assert "The answer is 3." in contents(result) and contents(result)[-1] == "APPROVED"
        # the calls went to the plain gateway URL the clients point at, with the user's key: no rollout
        assert len(h.upstream.requests) == 3
        assert not [s for s in await h.store.query_spans() if s.name == semconv.SPAN_LLM_CALL]
        unwrap(team)
        unwrap(team)  # idempotent
        assert not is_wrapped(team) and "on_messages_stream" not in vars(agent)
        assert list(http.event_hooks["request"]) == hooks_before
        # unwrapped, inside a rollout: nothing is routed or recorded any more
        async with h.attempt() as claim:
            await team.reset()
            await team.run(task="Task: add 2 and 2")
        assert len(h.upstream.requests) == 6
        assert not [s for s in await h.spans(claim) if s.name == semconv.SPAN_LLM_CALL]


async def test_a_standalone_agent_with_run_stream(client: MakeClient) -> None:
    async with GatewayHarness(responder=reply) as h:
        agent = wrap(solver(client()), trainable="solver")
        async with h.attempt() as claim:
            events = [ev async for ev in agent.run_stream(task="Task: add 20 and 22")]
        [request] = [e for e in events if isinstance(e, ToolCallRequestEvent)]
        assert isinstance(events[-1], TaskResult) and "The answer is 42." in contents(events[-1])
        adapted = await h.adapt(claim, air=air_policy(tool_success=0.5))
        assert [t.role for t in adapted.transitions] == ["solver", "solver"]
        assert adapted.transitions[0].tool_call_ids == [request.content[0].id]
        assert [t.reward for t in adapted.transitions] == [pytest.approx(0.5), 0.0]
        unwrap(agent)


async def test_selector_group_chat_names_the_selector_and_respects_the_selection(client: MakeClient) -> None:
    async with GatewayHarness(responder=reply) as h:
        shared = client()
        stop = TextMentionTermination("APPROVED") | MaxMessageTermination(8)
        team = SelectorGroupChat([solver(shared), reviewer(shared)], model_client=shared, termination_condition=stop)
        wrap(team, trainable=["solver"])
        async with h.attempt() as claim:
            result: TaskResult | None = None
            async for item in team.run_stream(task="Task: add 5 and 6"):
                result = item if isinstance(item, TaskResult) else result
        assert result is not None and "The answer is 11." in contents(result)
        calls = [s for s in await h.spans(claim) if s.name == semconv.SPAN_LLM_CALL]
        roles = [c.attributes[semconv.ROLE] for c in calls]
        # the selector chooses the first speaker; then only the reviewer may follow (no repeated speaker)
        assert roles == ["selector", "solver", "solver", "reviewer"]
        adapted = await h.adapt(claim)
        assert [t.role for t in adapted.transitions] == ["solver", "solver"] and adapted.n_untrainable == 2
        every = await h.adapt(claim, trainable="all")  # the trainer's own selection overrides the declarations
        assert [t.role for t in every.transitions] == roles
        unwrap(team)


async def test_the_process_wide_instrumentor_routes_agents_it_never_saw(client: MakeClient) -> None:
    plugin = AutoGenInstrumentor()
    original = AssistantAgent.__dict__["on_messages_stream"]
    plugin.instrument(trainable=["solver"])
    try:
        async with GatewayHarness(responder=reply) as h:
            team = round_robin(client(), client())  # built after instrument(), never wrapped
            async with h.attempt() as claim:
                await team.run(task="Task: divide 9 and 3")
            adapted = await h.adapt(claim, air=air_policy(tool_success=1.0))
            assert [t.role for t in adapted.transitions] == ["solver", "solver"] and adapted.n_untrainable == 1
            assert [t.reward for t in adapted.transitions] == [pytest.approx(1.0), 0.0]
            # wrap() on top of instrument() does not observe the turns twice
            both = wrap(round_robin(client(), client()), trainable=["solver"])
            async with h.attempt() as claim2:
                await both.run(task="Task: add 1 and 1")
            tools = [s for s in await h.spans(claim2) if s.name == semconv.SPAN_TOOL]
            assert len(tools) == 1
            unwrap(both)
    finally:
        plugin.uninstrument()
    assert AssistantAgent.__dict__["on_messages_stream"] is original
    http = team._participants[0]._model_client._client._client
    assert not any(getattr(hook, "_lightning_route_hook", False) for hook in http.event_hooks["request"])


async def test_a_failing_plugin_never_breaks_the_team_and_user_errors_pass_through(
    client: MakeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lightning_autogen._turns as turns

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("plugin bug")

    monkeypatch.setattr(turns, "record_tool", broken)
    monkeypatch.setattr(turns, "record_role", broken)
    before = PluginFailures.count
    async with GatewayHarness(responder=reply) as h:
        team = wrap(round_robin(client(), client()), trainable=["solver"])
        async with h.attempt() as claim:
            result = await team.run(task="Task: add 4 and 4")
        assert "The answer is 8." in contents(result) and contents(result)[-1] == "APPROVED"
        assert PluginFailures.count >= before + 2 and isinstance(PluginFailures.last, RuntimeError)
        calls = [s for s in await h.spans(claim) if s.name == semconv.SPAN_LLM_CALL]
        assert [c.attributes[semconv.ROLE] for c in calls] == ["solver", "solver", "reviewer"]  # routing unaffected

        class UserBug(Exception):
            pass

        agent = wrap(solver(client()))
        original = agent._model_client.create

        async def failing_create(*args: Any, **kwargs: Any) -> Any:
            raise UserBug("model client bug")

        agent._model_client.create = failing_create  # the user's own failure, below the plugin
        async with h.attempt():
            with pytest.raises(UserBug, match="model client bug"):
                await agent.run(task="Task: add 1 and 1")
        agent._model_client.create = original


def test_the_plugin_is_registered_under_its_entry_point() -> None:
    from lightning_rl.plugins import load_plugin

    plugin = load_plugin("autogen")
    assert isinstance(plugin, AutoGenInstrumentor) and plugin is AutoGenInstrumentor()
    assert (plugin.name, plugin.framework, plugin.supported) == ("autogen", "autogen-agentchat", ">=0.7.5,<0.8")
    assert plugin.check_framework().startswith("0.7.")
