"""A LangGraph graph and an OpenAI Agents SDK agent, captured with the real instrumentations.

Each agent runs twice on the same scripted conversation: through the gateway with its Lightning
plugin (exact tokens, roles from the plugin), and against the hosted endpoint with ``capture`` on.
The captured transitions must have the same text and the same roles (OpenInference instruments the
frameworks and names the roles; OpenLLMetry's installed instrumentation covers the client only, so
its roles stay empty), and the tool's failure must reach AIR the same way.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Annotated, Any, TypedDict

import httpx
import openai
import pytest

from lightning_rl.adapter import air_policy
from lightning_rl.gateway import running_gateway
from lightning_rl.testing import FakeReply, FakeToolCall, FakeUpstream, GatewayHarness

from .conftest import FAMILIES, Family, captured, text_view

pytest.importorskip("openinference.instrumentation.langchain")
pytest.importorskip("openinference.instrumentation.openai_agents")

from agents import Agent, Runner, function_tool  # noqa: E402
from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel  # noqa: E402
from agents.tracing import set_trace_processors  # noqa: E402
from langchain_core.messages import AnyMessage, HumanMessage, SystemMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402
from langgraph.graph.message import add_messages  # noqa: E402
from langgraph.prebuilt import ToolNode  # noqa: E402

from lightning_langchain import LangChainInstrumentor, instrument  # noqa: E402
from lightning_openai_agents import OpenAIAgentsInstrumentor  # noqa: E402

POLICY = air_policy(tool_error=-0.5, tool_success=0.05)
UNREACHABLE = "http://127.0.0.1:9/v1"  # nothing listens there: only a plugin's routing reaches the gateway


@pytest.fixture
async def hosted_url() -> AsyncIterator[str]:
    async with running_gateway(FakeUpstream(responder=reply_for).app) as url:
        yield f"{url}/v1"


def reply_for(body: dict[str, Any]) -> FakeReply | str:
    """Writer / answerer ask for their tool, then the checker / answerer answer; planner hands off."""
    messages: list[dict[str, Any]] = body["messages"]
    system = " ".join(str(m.get("content")) for m in messages if m["role"] == "system")
    number = (re.findall(r"question (\d+)", json.dumps(messages)) or ["0"])[0]
    if system.startswith("writer"):
        table = "bad" if int(number) % 2 else "users"
        return FakeReply(tool_calls=[FakeToolCall("run_sql", {"query": f"SELECT {number} FROM {table}"})])
    if system.startswith("checker"):
        return f"checked {number}"
    if "PLANNER" in system:
        return FakeReply(tool_calls=[FakeToolCall("transfer_to_answerer", {})])
    called = [c["function"]["name"] for m in messages for c in (m.get("tool_calls") or [])]
    if messages[-1]["role"] == "tool" and "search" in called:
        return f"answer: {messages[-1].get('content')}"
    return FakeReply(tool_calls=[FakeToolCall("search", {"query": f"question {number}"})])


# --------------------------------------------------------------------------------------------
# LangGraph
# --------------------------------------------------------------------------------------------


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def build_graph(base_url: str) -> tuple[Any, Any]:
    """writer (with a SQL tool run by LangGraph's ToolNode) -> tools -> checker; returns (graph, model)."""

    @tool
    def run_sql(query: str) -> str:
        """Run a SQL query against the database and return its rows."""
        if "bad" in query:
            raise ValueError(f"no such table: bad ({query})")
        return f"rows for {query}"

    # its own HTTP client: langchain-openai caches a default one per base URL, which must not
    # outlive the test's event loop
    model = ChatOpenAI(
        model="fake-model", base_url=base_url, api_key="sk-user", max_retries=0, http_async_client=httpx.AsyncClient()
    )
    writer_model = model.bind_tools([run_sql])

    async def write(state: State) -> State:
        return {"messages": [await writer_model.ainvoke([SystemMessage("writer: write SQL"), *state["messages"]])]}

    async def check(state: State) -> State:
        return {"messages": [await model.ainvoke([SystemMessage("checker: check it"), *state["messages"]])]}

    graph = StateGraph(State)
    graph.add_node("writer", write)
    graph.add_node("tools", ToolNode([run_sql], handle_tool_errors=True))
    graph.add_node("checker", check)
    graph.add_edge(START, "writer")
    graph.add_edge("writer", "tools")
    graph.add_edge("tools", "checker")
    graph.add_edge("checker", END)
    return graph.compile(), model


async def run_graph(base_url: str, number: int) -> str:
    graph, model = build_graph(base_url)
    try:
        out = await graph.ainvoke({"messages": [HumanMessage(f"question {number}")]})
        return str(out["messages"][-1].content)
    finally:
        await model.http_async_client.aclose()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("number", [1, 2], ids=["tool_error", "tool_ok"])
async def test_langgraph_captured_equals_the_gateway_path(family: Family, number: int, hosted_url: str) -> None:
    instrument()
    try:
        async with GatewayHarness(responder=reply_for) as h:
            async with h.attempt(task_input=number) as claim:
                assert await run_graph(UNREACHABLE, number) == f"checked {number}"
            reference = await h.adapt(claim, trainable="all", air=POLICY)
    finally:
        LangChainInstrumentor().uninstrument()
    assert [t.role for t in reference.transitions] == ["writer", "checker"]

    frameworks = ["openai", "langchain"] if family == "openinference" else ["openai"]
    async with captured(family, frameworks) as c:
        claim, out = await c.run(lambda: run_graph(hosted_url, number), number)
        assert out == f"checked {number}"
        adapted = await c.adapt(claim, air=POLICY)
        spans = await c.spans(claim)
        exported = c.exported()

    got = text_view(adapted.transitions)
    want = text_view(reference.transitions)
    if family == "openllmetry":  # no framework instrumentation installed for it: text equal, roles unknown
        assert [t.role for t in adapted.transitions] == [None, None]
        for view in (got, want):
            for row in view:
                row["role"] = None
    assert got == want
    assert all(not t.exact_tokens for t in adapted.transitions)
    if family == "openinference":
        # the tool span of the instrumentation feeds AIR like the plugin's: on the writer's call
        assert [t.reward for t in adapted.transitions] == [t.reward for t in reference.transitions]
        assert adapted.transitions[0].reward == pytest.approx(-0.5 if number % 2 else 0.05)
        assert [s.name for s in adapted.signals] == ["tool_error" if number % 2 else "tool_success"]
    # the user's exporter got every span of the rollout
    assert len(exported) == len(spans) >= 2


# --------------------------------------------------------------------------------------------
# OpenAI Agents SDK
# --------------------------------------------------------------------------------------------


def agents_for(client: openai.AsyncOpenAI, *, failing: bool) -> Any:
    """planner hands off to answerer, which searches (a tool that fails when ``failing``), then answers."""

    @function_tool
    def search(query: str) -> str:
        """Search the notes for a query."""
        if failing:
            raise RuntimeError(f"index for {query} is corrupt")
        return f"note about {query}"

    answerer = Agent[Any](
        name="answerer",
        instructions="ANSWERER: search, then answer.",
        tools=[search],
        model=OpenAIChatCompletionsModel(model="fake-model", openai_client=client),
    )
    return Agent[Any](
        name="planner",
        instructions="PLANNER: hand the question to the answerer.",
        handoffs=[answerer],
        model=OpenAIChatCompletionsModel(model="fake-model", openai_client=client),
    )


async def run_agents(base_url: str, *, failing: bool) -> str:
    client = openai.AsyncOpenAI(base_url=base_url, api_key="sk-app", max_retries=0, http_client=httpx.AsyncClient())
    try:
        return str((await Runner.run(agents_for(client, failing=failing), "question 3")).final_output)
    finally:
        await client.close()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("failing", [True, False], ids=["tool_error", "tool_ok"])
async def test_openai_agents_captured_equals_the_gateway_path(family: Family, failing: bool, hosted_url: str) -> None:
    plugin = OpenAIAgentsInstrumentor()
    plugin.instrument()
    try:
        async with GatewayHarness(responder=reply_for) as h:
            async with h.attempt() as claim:
                answer = await run_agents(UNREACHABLE, failing=failing)
            reference = await h.adapt(claim, trainable="all", air=POLICY)
    finally:
        plugin.uninstrument()
    assert answer.startswith("answer: ")
    assert [t.role for t in reference.transitions] == ["planner", "answerer", "answerer"]

    set_trace_processors([])  # the SDK's own exporter would upload to the vendor (unreachable here)
    frameworks = ["openai", "openai_agents"] if family == "openinference" else ["openai"]
    async with captured(family, frameworks) as c:
        claim, out = await c.run(lambda: run_agents(hosted_url, failing=failing))
        assert out == answer
        adapted = await c.adapt(claim, air=POLICY)
    set_trace_processors([])

    got, want = text_view(adapted.transitions), text_view(reference.transitions)
    if family == "openllmetry":
        for view in (got, want):
            for row in view:
                row["role"] = None
    assert got == want
    if family == "openinference":
        assert [t.role for t in adapted.transitions] == ["planner", "answerer", "answerer"]
        assert [t.reward for t in adapted.transitions] == [t.reward for t in reference.transitions]
        assert adapted.transitions[1].reward == pytest.approx(-0.5 if failing else 0.05)
