"""The explicit path: no ``instrument()``; the agent passes ``LightningCallbackHandler``, its model on ``llm.base_url``.

This is the design's "add a callback handler" usage, for users who would rather not patch
anything process-wide: the agent builds its ``ChatOpenAI`` on the rollout's gateway URL (so every
call is recorded under the rollout) and passes the handler in the run's config (so roles and tools
are recorded). Roles are joined to the gateway's calls by response id, exactly, with rollouts
running concurrently; the handler's ``is_trainable`` declares the trainable roles.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AnyMessage, HumanMessage, SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode

from lightning_langchain import LangChainInstrumentor, LightningCallbackHandler
from lightning_rl import LLM, RoleSelector, semconv
from lightning_rl.testing import FakeReply, FakeToolCall, GatewayHarness

N_ROLLOUTS = 4


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    if key.startswith("odd"):
        raise ValueError(f"no entry {key}")
    return f"value of {key}"


def reply_for(body: dict[str, Any]) -> FakeReply | str:
    messages: list[dict[str, Any]] = body["messages"]
    question = next(str(m["content"]) for m in messages if m["role"] == "user")
    number = int(question.split()[-1])
    if str(messages[0]["content"]).startswith("writer"):
        return FakeReply(tool_calls=[FakeToolCall("lookup", {"key": f"{'odd' if number % 2 else 'even'}-{number}"})])
    return f"checked {number}"


async def agent(task: int, llm: LLM, handler: LightningCallbackHandler) -> str:
    """What a user writes: the model on the rollout's URL, the handler in the run's config."""
    model = ChatOpenAI(model=llm.model, base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    writer_model = model.bind_tools([lookup])

    async def write(state: State) -> State:
        return {"messages": [await writer_model.ainvoke([SystemMessage("writer"), *state["messages"]])]}

    async def check(state: State) -> State:
        return {"messages": [await model.ainvoke([SystemMessage("checker"), *state["messages"]])]}

    graph = StateGraph(State)
    graph.add_node("writer", write)
    graph.add_node("tools", ToolNode([lookup], handle_tool_errors=True))
    graph.add_node("checker", check)
    graph.add_edge(START, "writer")
    graph.add_edge("writer", "tools")
    graph.add_edge("tools", "checker")
    graph.add_edge("checker", END)
    try:
        out = await graph.compile().ainvoke(
            {"messages": [HumanMessage(f"question {task}")]}, config={"callbacks": [handler]}
        )
    finally:
        await model.root_async_client.close()
    return out["messages"][-1].text


async def test_explicit_handler_records_roles_tools_and_trainable_flags_without_instrument() -> None:
    assert not LangChainInstrumentor().is_instrumented  # nothing patched, nothing registered globally
    handler = LightningCallbackHandler(is_trainable=RoleSelector.of(["writer"]))  # one handler, shared
    async with GatewayHarness(responder=reply_for) as h:

        async def one(i: int) -> Any:
            async with h.attempt(task_input=i) as claim:
                answer = await agent(i, h.llm(claim), handler)
            return claim, answer

        done = await asyncio.gather(*(one(i) for i in range(N_ROLLOUTS)))
        for i, (claim, answer) in enumerate(done):
            assert answer == f"checked {i}"
            adapted = await h.adapt(claim, air={"tool_error": -0.5, "tool_success": 0.1})
            assert [t.role for t in adapted.transitions] == ["writer"]  # the checker was declared untrainable
            assert adapted.n_untrainable == 1
            assert adapted.transitions[0].reward == pytest.approx(-0.5 if i % 2 else 0.1)  # AIR by tool-call id
            spans = await h.spans(claim)
            calls = [s for s in spans if s.name == semconv.SPAN_LLM_CALL]
            roles = [s for s in spans if s.name == semconv.SPAN_AGENT]
            assert [r.attributes[semconv.ROLE] for r in roles] == ["writer", "checker"]
            # joined exactly: each role span carries the id of the gateway call it made
            assert [r.attributes[semconv.GEN_AI_RESPONSE_ID] for r in roles] == [
                c.attributes[semconv.GEN_AI_RESPONSE_ID] for c in calls
            ]
            [tool_span] = [s for s in spans if s.name == semconv.SPAN_TOOL]
            assert tool_span.attributes[semconv.TOOL_STATUS] == ("error" if i % 2 else "ok")


async def test_explicit_handler_outside_a_rollout_records_nothing() -> None:
    handler = LightningCallbackHandler()
    async with GatewayHarness(responder=lambda body: "plain") as h:
        model = ChatOpenAI(model=h.model, base_url=h.v1, api_key="k", max_retries=0)
        try:
            reply = await model.ainvoke("hi", config={"callbacks": [handler]})
        finally:
            await model.root_async_client.close()
        assert reply.text == "plain"
        assert await h.store.query_spans() == []
