"""instrument()/uninstrument(), the handler never breaking a graph, user errors passing through, role rules."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AnyMessage, HumanMessage
from langchain_core.tracers import context as lc_context
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

import lightning_langchain
from lightning_langchain import (
    LangChainInstrumentor,
    as_role,
    current_handler,
    instrument,
    resolve_role,
    role_metadata,
    uninstrument,
)
from lightning_langchain.routing import hooked_clients
from lightning_rl import semconv
from lightning_rl.plugins import PluginFailures, load_plugin
from lightning_rl.testing import GatewayHarness

ModelFactory = Callable[..., Any]  # the make_model fixture (conftest.py)


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def two_node_graph(model: BaseChatModel, fail: Exception | None = None) -> Any:
    async def draft(state: State) -> State:
        return {"messages": [await model.ainvoke(state["messages"])]}

    async def review(state: State) -> State:
        if fail is not None:
            raise fail
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(State)
    graph.add_node("draft", draft)
    graph.add_node("review", review)
    graph.add_edge(START, "draft")
    graph.add_edge("draft", "review")
    graph.add_edge("review", END)
    return graph.compile()


def _methods() -> dict[str, Any]:
    from langchain_openai.chat_models.base import BaseChatOpenAI

    return {name: BaseChatOpenAI.__dict__[name] for name in ("_generate", "_agenerate", "_stream", "_astream")}


async def test_instrument_twice_is_harmless_and_uninstrument_restores_everything(make_model: ModelFactory) -> None:
    hooks_before = list(lc_context._configure_hooks)  # pyright: ignore[reportPrivateUsage]
    methods_before = _methods()
    plugin = instrument(trainable=["draft"])
    handler = current_handler()
    assert instrument(trainable=["other"]) is plugin and current_handler() is handler  # second call: no-op
    assert len(lc_context._configure_hooks) == len(hooks_before) + 1  # pyright: ignore[reportPrivateUsage]
    assert plugin.is_trainable("draft") and not plugin.is_trainable("other")

    async with GatewayHarness(responder=lambda body: "ok") as h:
        model = make_model(model=h.model, base_url=h.v1)  # pointed at the plain gateway URL
        graph = two_node_graph(model)
        async with h.attempt() as claim:
            await graph.ainvoke({"messages": [HumanMessage("hi")]})
        spans = await h.spans(claim)
        # routed into the attempt, each call recorded once (not once per instrument() call)
        assert [s.attributes[semconv.ROLE] for s in spans if s.name == semconv.SPAN_LLM_CALL] == ["draft", "review"]
        assert [s.attributes[semconv.ROLE] for s in spans if s.name == semconv.SPAN_AGENT] == ["draft", "review"]
        assert [t.role for t in (await h.adapt(claim)).transitions] == ["draft"]
        hooked = hooked_clients()
        assert hooked and model.root_async_client._client in hooked

        uninstrument()
        uninstrument()  # idempotent
        assert lc_context._configure_hooks == hooks_before  # pyright: ignore[reportPrivateUsage]
        assert _methods() == methods_before and all(not hasattr(m, "__wrapped__") for m in _methods().values())
        assert hooked_clients() == []
        for client in hooked:
            assert not any(getattr(hook, "_lightning_route_hook", False) for hook in client.event_hooks["request"])
        assert current_handler() is None and handler is not None and not handler.enabled

        # the original behaviour: inside a rollout the model now calls its own base URL, unrecorded
        async with h.attempt() as claim2:
            await graph.ainvoke({"messages": [HumanMessage("hi")]})
        assert await h.spans(claim2) == []
        assert len(h.upstream.requests) == 4


async def test_a_failing_handler_does_not_stop_the_graph(
    make_model: ModelFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("plugin bug")

    monkeypatch.setattr("lightning_langchain.handler.record_role", broken)
    monkeypatch.setattr("lightning_langchain.handler.resolve_role", broken)
    instrument()
    before = PluginFailures.count
    caplog.set_level(logging.DEBUG)
    async with GatewayHarness(responder=lambda body: "fine") as h:
        graph = two_node_graph(make_model())
        async with h.attempt() as claim:
            out = await graph.ainvoke({"messages": [HumanMessage("hi")]})
        assert out["messages"][-1].content == "fine"
        assert PluginFailures.count >= before + 2 and isinstance(PluginFailures.last, RuntimeError)
        calls = [s for s in await h.spans(claim) if s.name == semconv.SPAN_LLM_CALL]
        assert len(calls) == 2  # still routed to the attempt, with no (stale or guessed) role
        assert all(semconv.ROLE not in c.attributes for c in calls)
    # logged at debug level by the plugin, nothing at warning level (LangChain logs handler errors as warnings)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "plugin bug" in r.getMessage()]
    assert any(r.levelno == logging.DEBUG and r.name == "lightning_rl.plugins" for r in caplog.records)


class ReviewRejected(Exception):
    """The user's own exception type."""


async def test_an_exception_in_the_users_node_is_recorded_and_reraised_unchanged(make_model: ModelFactory) -> None:
    instrument()
    error = ReviewRejected("the draft is wrong")
    async with GatewayHarness(responder=lambda body: "draft") as h:
        graph = two_node_graph(make_model(), fail=error)
        async with h.attempt() as claim:
            with pytest.raises(ReviewRejected) as info:
                await graph.ainvoke({"messages": [HumanMessage("hi")]})
        assert info.value is error and info.value.args == ("the draft is wrong",)
        spans = await h.spans(claim)
        [recorded] = [s for s in spans if s.name == lightning_langchain.SPAN_ERROR]  # once, not per enclosing run
        assert recorded.status.code == "error"
        assert recorded.attributes["error.type"] == "ReviewRejected"
        assert recorded.attributes[semconv.ROLE] == "review"
        assert "the draft is wrong" in recorded.attributes["exception.message"]


def test_the_plugin_is_found_by_its_entry_point_and_rejects_unknown_options() -> None:
    assert load_plugin("langchain") is LangChainInstrumentor()
    assert LangChainInstrumentor.framework == "langchain-core" and LangChainInstrumentor.supported == ">=1.0,<2"
    with pytest.raises(TypeError, match="route="):
        instrument(routing=False)
    assert not LangChainInstrumentor().is_instrumented


@pytest.mark.parametrize(
    ("metadata", "tags", "role", "source"),
    [
        ({"langgraph_node": "writer", "checkpoint_ns": "writer:1"}, [], "writer", "node"),
        ({"langgraph_node": "model", "checkpoint_ns": "team:1|model:2"}, [], "team", "subgraph"),
        (
            {"langgraph_node": "model", "checkpoint_ns": "team:1", "lc_agent_name": "researcher"},
            [],
            "researcher",
            "agent_name",
        ),
        (
            {"langgraph_node": "model", "lc_agent_name": "researcher", "lightning_role": "critic"},
            [],
            "critic",
            "explicit",
        ),
        ({"langgraph_node": "model"}, ["lightning_role:judge"], "judge", "explicit"),
        ({}, [], None, "none"),
    ],
)
def test_role_precedence(metadata: dict[str, Any], tags: list[str], role: str | None, source: str) -> None:
    info = resolve_role(metadata, tags)
    assert (info.role, info.source) == (role, source)


def test_role_labels() -> None:
    assert role_metadata("writer", trainable=True) == {"lightning_role": "writer", "lightning_trainable": True}
    assert resolve_role(role_metadata("writer", trainable=False)).trainable is False
    labelled = as_role(lambda x: x, "writer", trainable=True)
    assert labelled.invoke(3) == 3
    assert labelled.config["metadata"] == {"lightning_role": "writer", "lightning_trainable": True}  # pyright: ignore[reportAttributeAccessIssue]
    with pytest.raises(ValueError, match="non-empty role"):
        role_metadata("")
