"""The in-process ``Runner`` against real stores (memory and SQLite): agents that succeed, emit,
raise, hang, return garbage, outlive their attempt, or need a retry. The runner must end every
rollout in the right state and keep going."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from lightning_rl import semconv
from lightning_rl.agent import LLM
from lightning_rl.runner import Runner
from lightning_rl.semconv import SPAN_ROLLOUT
from lightning_rl.store import MemoryStore
from lightning_rl.store.base import LightningStore
from lightning_rl.store.sqlite import SQLiteStore
from lightning_rl.tracing import current_rollout, emit_reward
from lightning_rl.types import AttemptStatus, LLMResource, RolloutConfig, RolloutRequest, RolloutStatus, Task

GATEWAY = LLMResource(base_url="http://127.0.0.1:4748", model="tiny", sampling={"temperature": 0.7})


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[LightningStore]:
    """Memory and SQLite only, with resources published: these tests are about the runner's logic
    (test_runner_faults and test_runner_gateway run on every backend through the root fixture)."""
    s: LightningStore = MemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "store.db")
    await s.add_resources(llm=GATEWAY)
    yield s
    await s.close()


async def _enqueue(store: LightningStore, n: int, config: RolloutConfig | None = None) -> list[str]:
    requests = [
        RolloutRequest(id=f"ro-{i}", task=Task(input={"i": i}), config=config or RolloutConfig()) for i in range(n)
    ]
    return [r.id for r in await store.enqueue(requests)]


async def _statuses(store: LightningStore, ids: list[str]) -> dict[str, RolloutStatus]:
    return {r.id: r.status for r in await store.query_rollouts(ids=ids)}


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_sync_and_async_agents_run_in_their_rollout(store: LightningStore, kind: str) -> None:
    seen: dict[int, dict[str, Any]] = {}

    def record(task: dict[str, int], llm: LLM) -> float:
        ctx = current_rollout()
        assert ctx is not None
        seen[task["i"]] = {
            "llm": llm,
            "rollout": ctx.rollout_id,
            "attempt": ctx.attempt_id,
            "thread": threading.current_thread() is threading.main_thread(),
        }
        return task["i"] / 10

    def sync_agent(task: dict[str, int], llm: LLM) -> float:
        time.sleep(0.01)
        return record(task, llm)

    async def async_agent(task: dict[str, int], llm: LLM) -> float:
        await asyncio.sleep(0.01)
        return record(task, llm)

    ids = await _enqueue(store, 8)
    runner = Runner(store, sync_agent if kind == "sync" else async_agent, concurrency=4, poll_interval_s=0.05)
    stats = await runner.run(until_idle=True)

    assert (stats.claimed, stats.succeeded, stats.failed, stats.timed_out) == (8, 8, 0, 0)
    rollouts = {r.id: r for r in await store.query_rollouts(ids=ids)}
    for i, rid in enumerate(ids):
        assert rollouts[rid].status is RolloutStatus.SUCCEEDED and rollouts[rid].final_reward == i / 10
        (attempt,) = await store.query_attempts(rid)
        assert attempt.worker_id == runner.worker_id and attempt.reward == i / 10
        llm: LLM = seen[i]["llm"]
        assert (seen[i]["rollout"], seen[i]["attempt"]) == (rid, attempt.id)
        key = attempt.gateway_key
        assert key and llm.base_url == f"http://127.0.0.1:4748/rollouts/{rid}/attempts/{attempt.id}/key/{key}/v1"
        assert (llm.model, dict(llm.sampling), llm.resources_version) == ("tiny", {"temperature": 0.7}, 1)
        assert seen[i]["thread"] is (kind == "async")  # sync agents run off the event loop's thread
        spans = await store.query_spans(attempt_id=attempt.id)
        root = next(s for s in spans if s.name == SPAN_ROLLOUT)
        reward = next(s for s in spans if s.name == semconv.SPAN_REWARD)
        assert root.status.code == "ok" and root.attributes[semconv.ROLLOUT_ID] == rid
        assert reward.attributes[semconv.REWARD_VALUE] == i / 10 and reward.parent_id == root.span_id


async def test_emitted_reward_is_used_when_the_agent_returns_none(store: LightningStore) -> None:
    def agent(task: dict[str, int], llm: LLM) -> None:
        emit_reward(0.2)
        emit_reward(0.9)

    ids = await _enqueue(store, 2)
    await Runner(store, agent, concurrency=2).run(until_idle=True)
    for rollout in await store.query_rollouts(ids=ids):
        assert rollout.status is RolloutStatus.SUCCEEDED and rollout.final_reward == 0.9
        rewards = await store.query_spans(rollout_id=rollout.id, name=semconv.SPAN_REWARD)
        assert [s.attributes[semconv.REWARD_VALUE] for s in rewards] == [0.2, 0.9]  # none added for `return None`


@pytest.mark.parametrize(
    ("returned", "message"),
    [("1.0", "must be a real number"), (float("nan"), "must be finite"), (True, "must be a real number")],
)
async def test_a_bad_return_value_fails_the_attempt(store: LightningStore, returned: object, message: str) -> None:
    ids = await _enqueue(store, 1)
    stats = await Runner(store, lambda task, llm: returned).run(until_idle=True)  # pyright: ignore[reportUnknownLambdaType, reportUnknownArgumentType]
    rollout = await store.get_rollout(ids[0])
    assert stats.failed == 1 and rollout.status is RolloutStatus.FAILED
    assert rollout.error is not None and message in rollout.error and "Return a float reward or None" in rollout.error


async def test_missing_resources_fail_the_attempt_with_what_to_do(tmp_path: Path) -> None:
    for published in (False, True):
        store = MemoryStore()
        if published:
            await store.add_resources(prompts={"system": "be brief"})  # no llm
        ids = await _enqueue(store, 1)
        stats = await Runner(store, lambda task, llm: 1.0).run(until_idle=True)  # pyright: ignore[reportUnknownLambdaType]
        rollout = await store.get_rollout(ids[0])
        assert stats.failed == 1 and rollout.status is RolloutStatus.FAILED
        assert rollout.error is not None and "add_resources" in rollout.error


async def test_concurrency_is_the_number_of_rollouts_in_flight(store: LightningStore) -> None:
    in_flight = peak = 0

    async def agent(task: dict[str, int], llm: LLM) -> float:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.05)
        in_flight -= 1
        return 0.0

    await _enqueue(store, 12)
    stats = await Runner(store, agent, concurrency=3, poll_interval_s=0.05).run(until_idle=True)
    assert stats.succeeded == 12 and peak == 3


async def test_heartbeats_keep_a_long_rollout_alive(store: LightningStore) -> None:
    async def agent(task: dict[str, int], llm: LLM) -> float:
        await asyncio.sleep(0.6)  # four heartbeat timeouts
        return 1.0

    ids = await _enqueue(store, 1, RolloutConfig(heartbeat_timeout_s=0.15))
    # heartbeat_interval_s is shortened to a third of the rollout's heartbeat timeout
    stats = await Runner(store, agent, heartbeat_interval_s=5.0).run(until_idle=True)
    assert stats.succeeded == 1 and stats.rejected == 0
    assert [a.status for a in await store.query_attempts(ids[0])] == [AttemptStatus.SUCCEEDED]


async def test_an_attempt_ended_by_the_store_cancels_its_agent(store: LightningStore) -> None:
    cancelled = asyncio.Event()
    started = asyncio.Event()

    async def agent(task: dict[str, int], llm: LLM) -> float:
        if task["i"] == 0:
            started.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.set()
                raise
        return 1.0

    ids = await _enqueue(store, 2)
    stop = asyncio.Event()
    runner = Runner(store, agent, concurrency=1, heartbeat_interval_s=0.05, poll_interval_s=0.05)
    run = asyncio.create_task(runner.run(stop))
    await asyncio.wait_for(started.wait(), 5)
    await store.cancel([ids[0]])
    await asyncio.wait_for(cancelled.wait(), 5)
    ended = await store.wait_for_rollouts(ids, timeout_s=5)
    stop.set()
    stats = await asyncio.wait_for(run, 5)
    assert {r.id: r.status for r in ended} == {ids[0]: RolloutStatus.CANCELLED, ids[1]: RolloutStatus.SUCCEEDED}
    assert (stats.lost, stats.succeeded) == (1, 1)


async def test_a_failed_attempt_is_retried_when_the_config_says_so(store: LightningStore) -> None:
    def agent(task: dict[str, int], llm: LLM) -> float:
        ctx = current_rollout()
        assert ctx is not None
        if ctx.attempt_number == 1:
            raise ConnectionError("flaky tool")
        return 0.5

    ids = await _enqueue(store, 1, RolloutConfig(max_attempts=2, retry_on=["failed"]))
    stats = await Runner(store, agent, poll_interval_s=0.05).run(until_idle=True)
    rollout = await store.get_rollout(ids[0])
    assert (stats.failed, stats.succeeded) == (1, 1)
    assert rollout.status is RolloutStatus.SUCCEEDED and rollout.final_reward == 0.5
    attempts = await store.query_attempts(ids[0])
    assert [a.status for a in attempts] == [AttemptStatus.FAILED, AttemptStatus.SUCCEEDED]


async def test_stop_event_lets_running_rollouts_finish(store: LightningStore) -> None:
    started = asyncio.Event()

    async def agent(task: dict[str, int], llm: LLM) -> float:
        started.set()
        await asyncio.sleep(0.3)
        return 1.0

    ids = await _enqueue(store, 1)
    stop = asyncio.Event()
    run = asyncio.create_task(Runner(store, agent, poll_interval_s=0.05).run(stop))
    await asyncio.wait_for(started.wait(), 5)
    stop.set()
    stats = await asyncio.wait_for(run, 5)
    assert stats.succeeded == 1
    assert (await _statuses(store, ids)) == {ids[0]: RolloutStatus.SUCCEEDED}


def test_runner_rejects_bad_settings() -> None:
    store = MemoryStore()
    with pytest.raises(ValueError, match="concurrency"):
        Runner(store, lambda task, llm: 1.0, concurrency=0)  # pyright: ignore[reportUnknownLambdaType]
    with pytest.raises(TypeError, match="callable"):
        Runner(store, "module:fn")  # type: ignore[arg-type]


async def test_opentelemetry_spans_of_a_sync_agent_are_stored_before_the_attempt_ends(store: LightningStore) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    from lightning_rl.tracing import LightningSpanProcessor

    provider = TracerProvider()
    provider.add_span_processor(LightningSpanProcessor())
    tracer = provider.get_tracer("agent")

    def agent(task: dict[str, int], llm: LLM) -> float:
        with tracer.start_as_current_span("plan", attributes={"i": task["i"]}):
            with tracer.start_as_current_span("act"):
                pass
        return 1.0

    ids = await _enqueue(store, 4)
    stop = asyncio.Event()
    seen: dict[str, list[str]] = {}

    async def watch() -> None:
        # The trainer reads spans as soon as a rollout ends: they must already be there.
        for rid in ids:
            assert await store.wait_for_rollouts([rid], timeout_s=10)
            seen[rid] = sorted(s.name for s in await store.query_spans(rollout_id=rid))
        stop.set()

    await asyncio.gather(Runner(store, agent, concurrency=2, poll_interval_s=0.05).run(stop), watch())
    assert seen == {rid: ["act", semconv.SPAN_REWARD, SPAN_ROLLOUT, "plan"] for rid in ids}
