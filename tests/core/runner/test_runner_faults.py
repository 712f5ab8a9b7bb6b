"""Faults on every store backend (memory, SQLite, PostgreSQL, HTTP): 20% of agents raise and 20%
hang past their timeout. Every rollout must end in the right state, counted, and the rest succeed."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from lightning_rl.agent import LLM
from lightning_rl.runner import Runner
from lightning_rl.semconv import SPAN_ROLLOUT
from lightning_rl.store.base import LightningStore
from lightning_rl.types import LLMResource, RolloutConfig, RolloutRequest, RolloutStatus, Task


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_raising_and_hanging_agents_are_counted_and_never_stop_the_runner(
    store: LightningStore, kind: str
) -> None:
    """20% of tasks raise, 20% hang past the 1 s timeout; the other 60% must still succeed.

    The timeout leaves a raising agent's finish time to reach the store on a loaded 2-core CI
    machine (with 0.5 s, a slow SQLite commit once let the store expire a failed attempt first)."""
    release = threading.Event()

    def outcome(task: dict[str, int]) -> str:
        return {0: "raise", 1: "hang"}.get(task["i"] % 5, "ok")

    def sync_agent(task: dict[str, int], llm: LLM) -> float:
        if outcome(task) == "raise":
            raise ValueError(f"bad task {task['i']}")
        if outcome(task) == "hang":
            release.wait(30)  # a hung sync agent: only abandoning its thread gets past it
        return 1.0

    async def async_agent(task: dict[str, int], llm: LLM) -> float:
        if outcome(task) == "raise":
            raise ValueError(f"bad task {task['i']}")
        if outcome(task) == "hang":
            await asyncio.sleep(30)
        return 1.0

    await store.add_resources(llm=LLMResource(base_url="http://127.0.0.1:4748", model="tiny"))
    requests = [
        RolloutRequest(id=f"ro-{i}", task=Task(input={"i": i}), config=RolloutConfig(timeout_s=1.0)) for i in range(20)
    ]
    ids = [r.id for r in await store.enqueue(requests)]
    # Heartbeats more frequent than the timeout: whether the runner's timer or the store's deadline
    # notices a hang first, it is counted as timed out.
    agent = sync_agent if kind == "sync" else async_agent
    runner = Runner(store, agent, concurrency=5, poll_interval_s=0.05, heartbeat_interval_s=0.1)
    try:
        started = time.monotonic()
        stats = await runner.run(until_idle=True)
        elapsed = time.monotonic() - started
    finally:
        release.set()

    assert (stats.claimed, stats.succeeded, stats.failed, stats.timed_out) == (20, 12, 4, 4)
    assert stats.abandoned_threads == (4 if kind == "sync" else 0)
    assert elapsed < 9.0  # four waves of five, each bounded by the timeout
    rollouts = {r.id: r for r in await store.query_rollouts(ids=ids)}
    for i, rid in enumerate(ids):
        rollout = rollouts[rid]
        expected = {0: RolloutStatus.FAILED, 1: RolloutStatus.TIMED_OUT}.get(i % 5, RolloutStatus.SUCCEEDED)
        assert rollout.status is expected, (rid, rollout)
        if expected is RolloutStatus.FAILED:
            assert rollout.error is not None and f"ValueError: bad task {i}" in rollout.error
            assert "raise ValueError" in rollout.error  # the traceback's last lines
            root = (await store.query_spans(rollout_id=rid, name=SPAN_ROLLOUT))[0]
            assert root.status.code == "error" and root.events[0].attributes["exception.type"] == "ValueError"
        if expected is RolloutStatus.TIMED_OUT:
            assert rollout.error is not None and "timeout of 1 s" in rollout.error
            assert rollout.final_reward is None
