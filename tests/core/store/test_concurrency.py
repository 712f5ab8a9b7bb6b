"""Fault tests for the durable stores: many claimers at once, and workers that die.

* 8 claimer **processes** (and, separately, 8 asyncio claimers with their own connections) race
  over 1,000 queued rollouts on one SQLite file / one PostgreSQL schema / one Redis key prefix: every rollout attempt is
  claimed exactly once, including the second attempts of rollouts whose first attempt failed.
* A worker process that is ``kill -9``-ed mid-rollout stops heartbeating: the store times its
  attempt out, requeues the rollout, and fails it once ``max_attempts`` is used up.
* A store closed and opened again (a restarted server) has everything it acknowledged.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import queue
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from lightning_rl.store.base import LightningStore
from lightning_rl.types import AttemptStatus, RolloutConfig, RolloutRequest, RolloutStatus, Span, Task

N_ROLLOUTS = 1000
N_CLAIMERS = 8
RETRIED_EVERY = 5
"""Rollouts whose number is a multiple of this fail their first attempt and are retried once."""

Backend = tuple[str, str, str | None]
"""(kind, sqlite path / postgres dsn / redis url, postgres schema / redis key prefix): picklable, so a child
process can open it."""

_SPAWN = multiprocessing.get_context("spawn")  # no fork: the parent runs threads (event loop, SQLite worker)


@pytest.fixture(autouse=True)
def _children_can_import_this_module(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    # pytest imports test files with --import-mode=importlib as ``tests.core.store.…`` without putting
    # the repository root on sys.path; spawned children unpickle their target by that name.
    monkeypatch.syspath_prepend(str(request.config.rootpath))


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("redis", marks=pytest.mark.redis),
    ]
)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "sqlite":
        return ("sqlite", str(tmp_path / "store.db"), None)
    if request.param == "redis":
        return ("redis", request.getfixturevalue("redis_url"), request.getfixturevalue("redis_prefix"))
    dsn: str = request.getfixturevalue("postgres_dsn")
    schema: str = request.getfixturevalue("postgres_schema")
    return ("postgres", dsn, schema)


async def open_backend(backend: Backend) -> LightningStore:
    kind, where, schema = backend
    if kind == "sqlite":
        from lightning_rl.store.sqlite import SQLiteStore

        return SQLiteStore(where)
    if kind == "redis":
        from lightning_rl.store.redis import RedisStore

        return await RedisStore.open(where, prefix=schema, max_connections=4)
    from lightning_rl.store.postgres import PostgresStore

    return await PostgresStore.open(where, schema=schema, pool_size=2)


def _requests() -> list[RolloutRequest]:
    config = RolloutConfig(max_attempts=2, retry_on=["failed"])
    return [RolloutRequest(id=f"r{i}", task=Task(input=i), config=config) for i in range(N_ROLLOUTS)]


async def _claim_until_empty(store: LightningStore, worker_id: str) -> list[tuple[str, int, str]]:
    """Claim small random batches until the queue is empty; fail each first attempt of every
    ``RETRIED_EVERY``-th rollout (so it is requeued), finish the rest. Returns what was claimed."""
    rng = random.Random(worker_id)
    claimed: list[tuple[str, int, str]] = []
    while claims := await store.claim(worker_id, n=rng.randint(1, 4)):
        for c in claims:
            claimed.append((c.rollout.id, c.attempt.number, c.attempt.id))
            retry = c.attempt.number == 1 and int(c.rollout.id[1:]) % RETRIED_EVERY == 0
            if retry:
                await store.finish_attempt(c.attempt.id, AttemptStatus.FAILED, error="first try fails")
            else:
                await store.finish_attempt(c.attempt.id, AttemptStatus.SUCCEEDED, reward=1.0)
    return claimed


def _claimer_process(backend: Backend, worker_id: str, start: Any, results: Any) -> None:
    async def run() -> list[tuple[str, int, str]]:
        store = await open_backend(backend)
        try:
            start.wait(timeout=120)  # every process is connected before anyone claims
            return await _claim_until_empty(store, worker_id)
        finally:
            await store.close()

    results.put((worker_id, asyncio.run(run())))


async def _check_each_attempt_claimed_once(store: LightningStore, claims: dict[str, list[tuple[str, int, str]]]):
    every = [c for got in claims.values() for c in got]
    retried = {f"r{i}" for i in range(N_ROLLOUTS) if i % RETRIED_EVERY == 0}
    expected = {(f"r{i}", 1) for i in range(N_ROLLOUTS)} | {(rid, 2) for rid in retried}
    assert len(every) == len(expected), "some rollout attempt was claimed twice or never"
    assert {(rid, number) for rid, number, _ in every} == expected
    assert len({aid for _, _, aid in every}) == len(every)
    rollouts = await store.query_rollouts(limit=N_ROLLOUTS)
    assert len(rollouts) == N_ROLLOUTS
    assert all(r.status is RolloutStatus.SUCCEEDED for r in rollouts)
    assert all(r.attempt_count == (2 if r.id in retried else 1) for r in rollouts)
    stats = await store.stats()
    assert stats.attempts_by_status == {"succeeded": N_ROLLOUTS, "failed": len(retried)}
    busy = [w for w, got in claims.items() if got]
    assert len(busy) >= 2, f"only {busy} claimed anything; the claimers never raced"


@pytest.mark.slow
async def test_claimer_processes_claim_each_attempt_once(backend: Backend) -> None:
    store = await open_backend(backend)
    try:
        await store.enqueue(_requests())
        start = _SPAWN.Barrier(N_CLAIMERS)
        results = _SPAWN.Queue()
        procs = [
            _SPAWN.Process(target=_claimer_process, args=(backend, f"proc-{i}", start, results), daemon=True)
            for i in range(N_CLAIMERS)
        ]
        for p in procs:
            p.start()
        claims: dict[str, list[tuple[str, int, str]]] = {}
        try:
            while len(claims) < len(procs):
                try:
                    worker_id, got = await asyncio.to_thread(results.get, timeout=0.5)
                except queue.Empty:
                    crashed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                    assert not crashed, f"claimer processes crashed with exit codes {crashed}"
                    continue
                claims[worker_id] = got
        finally:
            for p in procs:
                await asyncio.to_thread(p.join, 30)
                if p.is_alive():
                    p.kill()
        assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
        await _check_each_attempt_claimed_once(store, claims)
    finally:
        await store.close()


async def test_asyncio_claimers_with_own_connections_claim_each_attempt_once(backend: Backend) -> None:
    stores = [await open_backend(backend) for _ in range(N_CLAIMERS)]
    try:
        await stores[0].enqueue(_requests())
        results = await asyncio.gather(*(_claim_until_empty(s, f"task-{i}") for i, s in enumerate(stores)))
        await _check_each_attempt_claimed_once(stores[0], {f"task-{i}": got for i, got in enumerate(results)})
    finally:
        for s in stores:
            await s.close()


def _heartbeating_worker(backend: Backend, claimed: Any) -> None:
    """Claim one rollout, report it, then heartbeat every 50 ms until killed."""

    async def run() -> None:
        store = await open_backend(backend)
        (claim,) = await store.claim("doomed-worker")
        claimed.put(claim.attempt.id)
        while True:
            await store.heartbeat(claim.attempt.id)
            await asyncio.sleep(0.05)

    asyncio.run(run())


async def _attempt_status(store: LightningStore, attempt_id: str, until: AttemptStatus, within_s: float):
    deadline = time.monotonic() + within_s
    while (attempt := await store.get_attempt(attempt_id)).status is not until and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return attempt


async def test_killed_worker_is_timed_out_requeued_then_failed(backend: Backend) -> None:
    store = await open_backend(backend)
    try:
        config = RolloutConfig(heartbeat_timeout_s=0.4, max_attempts=2)
        await store.enqueue([RolloutRequest(id="fragile", task=Task(input="x"), config=config)])
        claimed = _SPAWN.Queue()
        proc = _SPAWN.Process(target=_heartbeating_worker, args=(backend, claimed), daemon=True)
        proc.start()
        try:
            attempt_id: str = await asyncio.to_thread(claimed.get, timeout=60)
            assert proc.exitcode is None
            await asyncio.sleep(0.8)  # twice the heartbeat timeout: alive only because it heartbeats
            assert (await store.get_attempt(attempt_id)).status is AttemptStatus.RUNNING
            assert proc.pid is not None
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            await asyncio.to_thread(proc.join, 30)
        lost = await _attempt_status(store, attempt_id, AttemptStatus.TIMED_OUT, within_s=3)
        assert lost.status is AttemptStatus.TIMED_OUT
        assert lost.error is not None and "doomed-worker" in lost.error
        assert (await store.get_rollout("fragile")).status is RolloutStatus.REQUEUED

        (second,) = await store.claim("also-dies")  # the retry; this worker never heartbeats either
        assert second.attempt.number == 2
        (ended,) = await store.wait_for_rollouts(["fragile"], timeout_s=5)
        assert ended.status is RolloutStatus.FAILED
        assert ended.error is not None and ended.error.startswith("gave up after 2 attempts")
        attempts = await store.query_attempts("fragile")
        assert [(a.worker_id, a.status) for a in attempts] == [
            ("doomed-worker", AttemptStatus.TIMED_OUT),
            ("also-dies", AttemptStatus.TIMED_OUT),
        ]
    finally:
        await store.close()


async def test_reopened_store_has_everything_it_acknowledged(backend: Backend) -> None:
    store = await open_backend(backend)
    try:
        await store.enqueue(_requests()[:20])
        claims = await store.claim("w", n=5)
        await store.add_spans([Span(name="s", rollout_id=c.rollout.id, attempt_id=c.attempt.id) for c in claims])
        await store.finish_attempt(claims[0].attempt.id, AttemptStatus.SUCCEEDED, reward=0.5)
        await store.add_resources(prompts={"system": "v1"})
        before = (await store.query_rollouts(), await store.query_spans(), await store.stats())
    finally:
        await store.close()
    again = await open_backend(backend)
    try:
        assert (await again.query_rollouts(), await again.query_spans(), await again.stats()) == before
        assert (await again.get_resources()).prompts == {"system": "v1"}
        (fresh,) = await again.enqueue([RolloutRequest(id="after-restart", task=Task(input=0))])
        assert fresh.seq > max(r.seq for r in before[0])
        (claim,) = await again.claim("w2")
        assert claim.rollout.id == "r5"  # the queue picks up where it was
    finally:
        await again.close()
