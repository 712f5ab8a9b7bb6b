"""A real 3-role LangGraph graph, instrumented, against the real gateway, many rollouts at once.

The graph is a writer (with a SQL tool run by LangGraph's ``ToolNode``), a checker and a rewriter,
sharing ONE ``ChatOpenAI`` built before any rollout and pointed at an unreachable URL: only the
plugin's routing can get its calls to the gateway. The three roles are found three different
ways (the graph node, an ``as_role`` label, a subgraph's namespace). Replies depend on the
conversation (the rollout's number is in it), so a call attributed to the wrong rollout or role
would show in the recorded tokens.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode

from lightning_langchain import as_role, instrument
from lightning_langchain.routing import hooked_clients
from lightning_rl import semconv
from lightning_rl.adapter import air_policy
from lightning_rl.testing import FakeReply, FakeToolCall, GatewayHarness

N_ROLLOUTS = 8
ModelFactory = Callable[..., Any]  # the make_model fixture (conftest.py)
POLICY = air_policy(tool_error=-0.5, tool_success=0.05)


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


@tool
def run_sql(query: str) -> str:
    """Run a SQL query against the database and return its rows."""
    if "bad" in query:
        raise ValueError(f"no such table: bad ({query})")
    return f"rows for {query}"


def reply_for(body: dict[str, Any]) -> FakeReply | str:
    """The fake model: its answer depends on who asks (system prompt) and on the rollout number."""
    messages: list[dict[str, Any]] = body["messages"]
    system = str(messages[0]["content"])
    number = re.findall(r"question (\d+)", json.dumps(messages))[0]
    if system.startswith("writer"):
        table = "bad" if int(number) % 2 else "users"
        return FakeReply(tool_calls=[FakeToolCall("run_sql", {"query": f"SELECT {number} FROM {table}"})])
    if system.startswith("checker"):
        return f"checked {number}"
    return f"rewritten {number}"


def build_graph(model: BaseChatModel, *, handle_tool_errors: bool = True) -> Any:
    """writer -> tools -> check (labelled 'checker') -> rewriter (a subgraph: role from its namespace)."""
    writer_model = model.bind_tools([run_sql])

    # writer and checker work with both APIs: graph.ainvoke runs the async version, graph.invoke the sync one
    def write(state: State) -> State:
        return {"messages": [writer_model.invoke([SystemMessage("writer: write SQL"), *state["messages"]])]}

    async def awrite(state: State) -> State:
        return {"messages": [await writer_model.ainvoke([SystemMessage("writer: write SQL"), *state["messages"]])]}

    def check(state: State) -> State:
        return {"messages": [model.invoke([SystemMessage("checker: check it"), *state["messages"]])]}

    async def acheck(state: State) -> State:
        return {"messages": [await model.ainvoke([SystemMessage("checker: check it"), *state["messages"]])]}

    def rewrite(state: State) -> State:  # a sync node: LangGraph runs it in a worker thread
        reply = model.invoke([SystemMessage("rewriter: fix it"), state["messages"][0]])
        return {"messages": [reply]}

    inner = StateGraph(State)
    inner.add_node("model", rewrite)
    inner.add_edge(START, "model")
    inner.add_edge("model", END)

    graph = StateGraph(State)
    graph.add_node("writer", RunnableLambda(write, afunc=awrite))
    graph.add_node("tools", ToolNode([run_sql], handle_tool_errors=handle_tool_errors))
    graph.add_node("check", as_role(RunnableLambda(check, afunc=acheck), "checker"))
    graph.add_node("rewriter", inner.compile())
    graph.add_edge(START, "writer")
    graph.add_edge("writer", "tools")
    graph.add_edge("tools", "check")
    graph.add_edge("check", "rewriter")
    graph.add_edge("rewriter", END)
    return graph.compile()


MODELS: dict[str, dict[str, Any]] = {
    "chat_completions": {},
    "streaming": {"streaming": True},  # streamed messages carry no response id
    "responses_api": {"use_responses_api": True},
    "init_chat_model": {"via_init": True},
}


@pytest.mark.parametrize("kind", list(MODELS))
async def test_concurrent_rollouts_get_exact_roles_trainable_filter_and_tool_air(
    kind: str, make_model: ModelFactory
) -> None:
    instrument(trainable=["writer", "rewriter"])
    graph = build_graph(make_model(**MODELS[kind]))  # built once, before any rollout, shared by all of them

    async with GatewayHarness(responder=reply_for) as h:

        async def one(i: int) -> Any:
            async with h.attempt(task_input=i) as claim:
                inputs: State = {"messages": [HumanMessage(f"question {i}")]}
                if i % 4 == 3:  # some rollouts use the sync API (from a worker thread)
                    out = await asyncio.to_thread(graph.invoke, inputs)
                else:
                    out = await graph.ainvoke(inputs)
            return claim, out

        done = await asyncio.gather(*(one(i) for i in range(N_ROLLOUTS)))

        for i, (claim, out) in enumerate(done):
            assert out["messages"][-1].text == f"rewritten {i}"
            adapted = await h.adapt(claim, air=POLICY)
            # only the trainable roles became transitions; the checker's call was declared untrainable
            assert [t.role for t in adapted.transitions] == ["writer", "rewriter"], f"rollout {i}"
            assert adapted.n_untrainable == 1
            writer_t, rewriter_t = adapted.transitions
            assert bytes(rewriter_t.response_ids).decode() == f"rewritten {i}"
            assert str(i) in bytes(writer_t.response_ids).decode()
            # the tool's AIR signal is on the writer call that requested the tool, by tool-call id
            assert writer_t.reward == pytest.approx(-0.5 if i % 2 else 0.05)
            assert rewriter_t.reward == 0.0
            spans = await h.spans(claim)
            [tool_span] = [s for s in spans if s.name == semconv.SPAN_TOOL]
            assert tool_span.attributes[semconv.GEN_AI_TOOL_CALL_ID] in writer_t.tool_call_ids
            assert tool_span.attributes[semconv.TOOL_STATUS] == ("error" if i % 2 else "ok")
            assert tool_span.attributes[semconv.ROLE] == "writer"
            # every call reached the gateway under its role (URL) and, where the framework gives
            # the response id, the role span joins on it and agrees
            calls = [s for s in spans if s.name == semconv.SPAN_LLM_CALL]
            assert [c.attributes[semconv.ROLE] for c in calls] == ["writer", "checker", "rewriter"]
            roles = [s for s in spans if s.name == semconv.SPAN_AGENT]
            assert [r.attributes[semconv.ROLE] for r in roles] == ["writer", "checker", "rewriter"]
            assert [r.attributes[semconv.TRAINABLE] for r in roles] == [True, False, True]
            assert [r.attributes["lightning.role.source"] for r in roles] == ["node", "explicit", "subgraph"]
            if kind != "streaming":
                assert [r.attributes[semconv.GEN_AI_RESPONSE_ID] for r in roles] == [
                    c.attributes[semconv.GEN_AI_RESPONSE_ID] for c in calls
                ]
            # a trainer-side selection overrides the declarations
            every = await h.adapt(claim, trainable="all")
            assert [t.role for t in every.transitions] == ["writer", "checker", "rewriter"]
        assert len(h.upstream.requests) == 3 * N_ROLLOUTS


async def test_a_tool_error_that_aborts_the_graph_is_recorded_before_it_propagates(make_model: ModelFactory) -> None:
    instrument()
    graph = build_graph(make_model(), handle_tool_errors=False)  # LangGraph's default: errors re-raise
    async with GatewayHarness(responder=reply_for) as h:
        async with h.attempt(task_input=1) as claim:
            with pytest.raises(ValueError, match="no such table: bad") as info:
                await graph.ainvoke({"messages": [HumanMessage("question 1")]})
        assert type(info.value) is ValueError  # the user's exception, not a wrapper
        adapted = await h.adapt(claim, air=POLICY)
        [writer_t] = adapted.transitions
        assert writer_t.role == "writer" and writer_t.reward == pytest.approx(-0.5)
        spans = await h.spans(claim)
        [tool_span] = [s for s in spans if s.name == semconv.SPAN_TOOL]
        assert "no such table" in tool_span.attributes[semconv.TOOL_ERROR]
        # recorded once, as the tool's error (not again as an error of the node that ran it)
        assert not [s for s in spans if s.name == "langchain.error"]


async def test_agent_name_beats_the_subgraph_and_a_labelled_model_beats_both(make_model: ModelFactory) -> None:
    from langchain.agents import create_agent

    instrument()
    model = make_model()

    def respond(body: dict[str, Any]) -> str:
        return "answer"

    researcher = create_agent(model=model, tools=[], name="researcher", system_prompt="research")
    labelled = model.with_config(metadata={"lightning_role": "critic"})

    async def critic(state: State) -> State:
        return {"messages": [await labelled.ainvoke(state["messages"])]}

    graph = StateGraph(State)
    graph.add_node("research_team", researcher)
    graph.add_node("review", critic)
    graph.add_edge(START, "research_team")
    graph.add_edge("research_team", "review")
    graph.add_edge("review", END)
    app = graph.compile()

    async with GatewayHarness(responder=respond) as h:
        async with h.attempt() as claim:
            await app.ainvoke({"messages": [HumanMessage("hi")]})
        adapted = await h.adapt(claim)
        assert [t.role for t in adapted.transitions] == ["researcher", "critic"]
        roles = [s for s in await h.spans(claim) if s.name == semconv.SPAN_AGENT]
        assert [r.attributes["lightning.role.source"] for r in roles] == ["agent_name", "explicit"]


async def test_outside_a_rollout_the_model_is_untouched_and_nothing_is_recorded(make_model: ModelFactory) -> None:
    instrument()
    async with GatewayHarness(script=["plain"]) as h:
        model = make_model(model=h.model, base_url=h.v1)
        reply = await model.ainvoke("hi")
        assert isinstance(reply, AIMessage) and reply.content == "plain"
        assert len(h.upstream.requests) == 1
        assert hooked_clients() == []  # the routing hook goes on a model's clients only inside a rollout
