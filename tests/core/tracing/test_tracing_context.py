"""Rollout context, rewards, signals and the built-in tracer.

The isolation tests run many rollouts at once in one process (asyncio tasks, sub-tasks, threads)
and check through a real ``MemoryStore`` + ``SpanWriter`` that every span lands on its own attempt.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading

import pytest

from lightning_rl import semconv
from lightning_rl.spans import SpanWriter
from lightning_rl.store import MemoryStore
from lightning_rl.tracing import (
    bind_context,
    current_rollout,
    current_span_id,
    emit_reward,
    emit_signal,
    emit_span,
    rollout_context,
    span,
    start_span,
)
from lightning_rl.types import Claim, RolloutRequest, Span, Task


async def _claimed(store: MemoryStore, n: int) -> list[Claim]:
    await store.enqueue([RolloutRequest(id=f"ro-{i}", task=Task(input=i)) for i in range(n)])
    claims = await store.claim("test-worker", n=n)
    assert len(claims) == n
    return claims


def test_emits_outside_a_rollout_are_noops_with_a_debug_log(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="lightning_rl.tracing")
    assert current_rollout() is None
    assert emit_reward(1.0) is None
    assert emit_reward(float("nan")) is None  # not even validated: production code must never break
    assert emit_signal("tool_error", tool_call_id="call-1") is None
    assert emit_span("custom") is None
    with span("outer", x=1) as handle:
        assert not handle.recording
        handle.set_attribute("y", 2)
        handle.record_exception(RuntimeError("ignored"))
        assert current_span_id.get() is None
    assert handle.end() is None
    assert start_span("manual").end() is None
    messages = [r.getMessage() for r in caplog.records]
    assert sum("outside a rollout" in m for m in messages) == 6


def test_reward_and_signal_spans_use_the_semantic_conventions() -> None:
    spans: list[Span] = []
    with rollout_context("ro-1", "at-1", sink=spans.append) as ctx:
        assert current_rollout() is ctx
        emit_reward(0.25)
        emit_reward(1)  # the last one is final
        emit_signal("tool_error", -1.0, tool_call_id="call-7", role="planner", tool_name="search", extra="x")
        emit_signal("tool_success")
        assert ctx.last_reward == 1.0
        assert ctx.spans_recorded == 4
    assert current_rollout() is None
    r1, r2, s1, s2 = spans
    assert (r1.name, r1.attributes[semconv.REWARD_VALUE]) == (semconv.SPAN_REWARD, 0.25)
    assert r2.attributes[semconv.REWARD_VALUE] == 1.0
    assert s1.name == semconv.SPAN_SIGNAL
    assert s1.attributes == {
        semconv.SIGNAL_NAME: "tool_error",
        semconv.SIGNAL_VALUE: -1.0,
        semconv.GEN_AI_TOOL_CALL_ID: "call-7",
        semconv.ROLE: "planner",
        semconv.GEN_AI_TOOL_NAME: "search",
        "extra": "x",
    }
    assert s2.attributes[semconv.SIGNAL_VALUE] == 1.0
    assert all((s.rollout_id, s.attempt_id) == ("ro-1", "at-1") for s in spans)
    assert len({s.trace_id for s in spans}) == 1 and len({s.span_id for s in spans}) == 4


@pytest.mark.parametrize(
    ("value", "error"),
    [(float("nan"), ValueError), (float("inf"), ValueError), ("1.0", TypeError), (True, TypeError), (None, TypeError)],
)
def test_invalid_rewards_are_refused_inside_a_rollout(value: object, error: type[Exception]) -> None:
    spans: list[Span] = []
    with rollout_context("ro-1", "at-1", sink=spans.append) as ctx:
        with pytest.raises(error, match="emit_reward value"):
            emit_reward(value)  # type: ignore[arg-type]
        assert ctx.last_reward is None
    assert spans == []


def test_a_failing_sink_never_reaches_the_agent(caplog: pytest.LogCaptureFixture) -> None:
    def broken(span: Span) -> None:
        raise ConnectionError("store down")

    with rollout_context("ro-1", "at-1", sink=broken) as ctx:
        emit_reward(0.5)
        assert ctx.last_reward == 0.5
    assert "could not export span" in caplog.text


def test_builtin_tracer_nests_and_records_exceptions() -> None:
    spans: list[Span] = []
    with rollout_context("ro-1", "at-1", sink=spans.append):
        with span("outer", kind="client", query="q") as outer:
            assert current_span_id.get() == outer.span_id
            with pytest.raises(KeyError):
                with span("inner") as inner:
                    inner.add_event("looked up", {"key": "k"})
                    raise KeyError("k")
            emit_signal("tool_error")
            outer.set_attributes({"n_docs": 3, "obj": object(), "bad": float("nan")})
        assert current_span_id.get() is None
        manual = start_span("tool", attributes={semconv.GEN_AI_TOOL_NAME: "calc"})
    # ended after the rollout context closed: still attributed to the attempt it started in
    manual.set_status("ok")
    assert manual.end() is not None
    assert manual.end() is None  # idempotent
    by_name = {s.name: s for s in spans}
    outer_s, inner_s, signal_s = by_name["outer"], by_name["inner"], by_name[semconv.SPAN_SIGNAL]
    assert [s.name for s in spans] == ["inner", semconv.SPAN_SIGNAL, "outer", "tool"]
    assert inner_s.parent_id == outer_s.span_id and signal_s.parent_id == outer_s.span_id
    assert outer_s.parent_id is None and outer_s.kind == "client"
    assert inner_s.status.code == "error" and inner_s.status.message == "KeyError: 'k'"
    assert [e.name for e in inner_s.events] == ["looked up", "exception"]
    assert inner_s.events[1].attributes["exception.type"] == "KeyError"
    assert "raise KeyError" in inner_s.events[1].attributes["exception.stacktrace"]
    assert outer_s.status.code == "unset"
    assert outer_s.attributes["n_docs"] == 3 and outer_s.attributes["bad"] == "nan"
    assert outer_s.attributes["obj"].startswith("<object object")
    assert outer_s.end_ns is not None and outer_s.start_ns <= inner_s.start_ns <= outer_s.end_ns
    assert by_name["tool"].status.code == "ok" and by_name["tool"].rollout_id == "ro-1"


async def test_fifty_concurrent_rollouts_never_mix(store: MemoryStore) -> None:
    claims = await _claimed(store, 50)
    writer = SpanWriter(store)
    rng = random.Random(7)

    async def subtask(i: int, k: int) -> None:
        await asyncio.sleep(rng.random() / 100)
        emit_signal("step", float(k), index=i)

    def in_thread(i: int) -> str | None:
        emit_signal("thread", float(i), index=i)
        ctx = current_rollout()
        return ctx.rollout_id if ctx else None

    async def rollout(claim: Claim, i: int) -> tuple[float | None, str | None]:
        with rollout_context(claim.rollout.id, claim.attempt.id, sink=writer.submit) as ctx:
            with span("agent", index=i):
                await asyncio.sleep(rng.random() / 50)
                await asyncio.gather(*(subtask(i, k) for k in range(3)))
                await asyncio.create_task(subtask(i, 3))
                seen_in_thread = await asyncio.to_thread(in_thread, i)
                emit_reward(i / 100)
            return ctx.last_reward, seen_in_thread

    results = await asyncio.gather(*(rollout(c, i) for i, c in enumerate(claims)))
    assert await writer.close(5.0)
    for i, (claim, (reward, thread_rollout)) in enumerate(zip(claims, results, strict=True)):
        assert reward == i / 100
        assert thread_rollout == claim.rollout.id
        spans = await store.query_spans(attempt_id=claim.attempt.id)
        assert len(spans) == 7  # agent, 4 step signals, 1 thread signal, 1 reward
        assert {s.rollout_id for s in spans} == {claim.rollout.id}
        assert {s.attributes.get("index") for s in spans if s.name == semconv.SPAN_SIGNAL} == {i}
        agent = next(s for s in spans if s.name == "agent")
        assert all(s.parent_id == agent.span_id for s in spans if s is not agent)
    assert (await store.stats()).spans == 350


def test_threads_see_the_rollout_only_when_the_context_is_bound() -> None:
    spans: list[Span] = []
    seen: dict[str, str | None] = {}

    def work(label: str) -> None:
        ctx = current_rollout()
        seen[label] = ctx.rollout_id if ctx else None
        emit_signal(label)  # a no-op in the unbound thread

    def rollout(n: int) -> None:
        with rollout_context(f"ro-{n}", f"at-{n}", sink=spans.append):
            bound = threading.Thread(target=bind_context(work), args=(f"bound-{n}",))
            plain = threading.Thread(target=work, args=(f"plain-{n}",))
            bound.start()
            plain.start()
            bound.join()
            plain.join()

    outer = [threading.Thread(target=rollout, args=(n,)) for n in range(8)]
    for t in outer:
        t.start()
    for t in outer:
        t.join()
    assert seen == {**{f"bound-{n}": f"ro-{n}" for n in range(8)}, **{f"plain-{n}": None for n in range(8)}}
    assert sorted((s.rollout_id, s.attributes[semconv.SIGNAL_NAME]) for s in spans) == sorted(
        (f"ro-{n}", f"bound-{n}") for n in range(8)
    )


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()
