"""The store contract: every backend (memory, SQLite, PostgreSQL, HTTP client) must pass all of it.

``MemoryStore`` is the reference; a test here describes behaviour a runner or trainer relies on, so
a backend that fails one would break training somewhere else. Timeouts are short (0.2-0.3 s) real
waits, because the point is that the *store* enforces them with nobody calling ``expire`` for it.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from lightning_rl.errors import ConflictError, IllegalTransitionError, InvalidRequestError, NotFoundError
from lightning_rl.store.base import DEFAULT_HEARTBEAT_TIMEOUT_S, MAX_BATCH, MAX_PAGE, LightningStore
from lightning_rl.types import (
    AttemptStatus,
    Claim,
    LLMResource,
    RolloutConfig,
    RolloutRequest,
    RolloutStatus,
    Span,
    SpanEvent,
    SpanStatus,
    Task,
)


def req(i: int | str, **kw: object) -> RolloutRequest:
    return RolloutRequest(id=f"r{i}", task=Task(input={"question": f"q{i}", "n": i}), **kw)  # type: ignore[arg-type]


def span(claim: Claim, name: str = "step", **kw: object) -> Span:
    return Span(name=name, rollout_id=claim.rollout.id, attempt_id=claim.attempt.id, **kw)  # type: ignore[arg-type]


async def claim_one(store: LightningStore, worker: str = "w1") -> Claim:
    claims = await store.claim(worker)
    assert len(claims) == 1, f"expected one claim, got {claims}"
    return claims[0]


# --------------------------------------------------------------------------------------------
# enqueue
# --------------------------------------------------------------------------------------------


async def test_enqueue_stores_queued_rollouts_in_order(store: LightningStore) -> None:
    before = time.time()
    out = await store.enqueue([req(1, group_id="g", mode="val", metadata={"k": [1, 2]}), req(2), req(3)])
    assert [r.id for r in out] == ["r1", "r2", "r3"]
    assert all(r.status is RolloutStatus.QUEUED and r.attempt_count == 0 for r in out)
    assert out[0].seq < out[1].seq < out[2].seq
    assert before - 1 <= out[0].created_at <= time.time() + 1
    got = await store.get_rollout("r1")
    assert got == out[0]
    assert got.task == Task(input={"question": "q1", "n": 1})
    assert (got.group_id, got.mode, got.metadata) == ("g", "val", {"k": [1, 2]})
    assert await store.enqueue([]) == []


async def test_enqueue_round_trips_every_field(store: LightningStore) -> None:
    request = RolloutRequest(
        id="rich",
        task=Task(input={"nested": {"a": [1, 2.5, None, True]}, "text": "héllo ✓"}, id="t-1", metadata={"ref": "x"}),
        group_id="grp",
        mode="test",
        resources_version=3,
        config=RolloutConfig(timeout_s=12.5, heartbeat_timeout_s=3, max_attempts=4, retry_on=["failed"]),
        metadata={"source": "unit", "weights": [0.1, 0.2]},
    )
    (stored,) = await store.enqueue([request])
    assert RolloutRequest.model_validate(stored.model_dump(include=set(RolloutRequest.model_fields))) == request
    assert await store.get_rollout("rich") == stored


async def test_enqueue_is_idempotent_on_id(store: LightningStore) -> None:
    (first,) = await store.enqueue([req(1)])
    again = await store.enqueue([req(1), req(2), req(2)])
    assert again[0] == first
    assert again[1] == again[2]
    assert [r.id for r in await store.query_rollouts()] == ["r1", "r2"]
    claim = await claim_one(store)
    (resent,) = await store.enqueue([req(1)])
    assert resent.status is RolloutStatus.RUNNING and resent.attempt_count == 1
    assert claim.rollout.id == "r1"
    stats = await store.stats()
    assert sum(stats.rollouts_by_status.values()) == 2


async def test_enqueue_changed_resend_conflicts(store: LightningStore) -> None:
    await store.enqueue([req(1)])
    changed_task = RolloutRequest(id="r1", task=Task(input="something else"))
    with pytest.raises(ConflictError, match="r1"):
        await store.enqueue([changed_task])
    with pytest.raises(ConflictError):
        await store.enqueue([req(1, config=RolloutConfig(max_attempts=2))])
    assert (await store.get_rollout("r1")).task.input == {"question": "q1", "n": 1}


# --------------------------------------------------------------------------------------------
# claim
# --------------------------------------------------------------------------------------------


async def test_claim_is_fifo_and_opens_an_attempt(store: LightningStore) -> None:
    await store.enqueue([req(i) for i in range(5)])
    claims = await store.claim("worker-a", n=2)
    assert [c.rollout.id for c in claims] == ["r0", "r1"]
    for c in claims:
        assert c.rollout.status is RolloutStatus.RUNNING and c.rollout.attempt_count == 1
        a = c.attempt
        assert (a.rollout_id, a.number, a.worker_id, a.status) == (c.rollout.id, 1, "worker-a", AttemptStatus.RUNNING)
        assert a.started_at == a.heartbeat_at and a.ended_at is None
        assert a.deadline == pytest.approx(a.heartbeat_at + DEFAULT_HEARTBEAT_TIMEOUT_S)  # every attempt has one
        assert await store.get_attempt(a.id) == a
        assert await store.get_rollout(c.rollout.id) == c.rollout
    assert claims[0].attempt.id != claims[1].attempt.id
    rest = await store.claim("worker-b", n=10)
    assert [c.rollout.id for c in rest] == ["r2", "r3", "r4"]
    assert await store.claim("worker-c", n=3) == []


async def test_claim_is_atomic_under_concurrent_claimers(store: LightningStore) -> None:
    await store.enqueue([req(i) for i in range(60)])

    async def worker(name: str) -> list[str]:
        got: list[str] = []
        while claims := await store.claim(name, n=3):
            got += [c.rollout.id for c in claims]
        return got

    results = await asyncio.gather(*(worker(f"w{i}") for i in range(6)))
    claimed = [rid for got in results for rid in got]
    assert sorted(claimed) == sorted(f"r{i}" for i in range(60))
    assert len(set(claimed)) == len(claimed)


async def test_attempt_deadline_follows_the_config(store: LightningStore) -> None:
    await store.enqueue(
        [
            req(1, config=RolloutConfig(timeout_s=100)),
            req(2, config=RolloutConfig(heartbeat_timeout_s=30)),
            req(3, config=RolloutConfig(timeout_s=100, heartbeat_timeout_s=30)),
        ]
    )
    c1, c2, c3 = await store.claim("w", n=3)
    assert c1.attempt.deadline == pytest.approx(c1.attempt.started_at + 100)
    assert c2.attempt.deadline == pytest.approx(c2.attempt.heartbeat_at + 30)
    assert c3.attempt.deadline == pytest.approx(c3.attempt.started_at + 30)


async def test_worker_timeout_is_the_deadline_when_the_config_sets_none(store: LightningStore) -> None:
    await store.enqueue([req(1), req(2, config=RolloutConfig(timeout_s=100))])
    mine, theirs = await store.claim("w", n=2, timeout_s=0.2)
    assert (mine.attempt.timeout_s, theirs.attempt.timeout_s) == (0.2, 100)  # the rollout's own limit wins
    assert mine.attempt.deadline == pytest.approx(mine.attempt.started_at + 0.2)
    await asyncio.sleep(0.1)
    beat = await store.heartbeat(mine.attempt.id)
    assert beat.deadline == pytest.approx(mine.attempt.started_at + 0.2)  # a heartbeat does not extend a timeout
    await asyncio.sleep(0.2)  # the worker died: nobody reports, the store ends the attempt by itself
    lost = await store.get_attempt(mine.attempt.id)
    assert lost.status is AttemptStatus.TIMED_OUT
    assert lost.error is not None and "--timeout" in lost.error and "0.2 s" in lost.error
    assert (await store.get_rollout("r1")).status is RolloutStatus.TIMED_OUT
    assert (await store.get_attempt(theirs.attempt.id)).status is AttemptStatus.RUNNING


async def test_worker_timeout_requeues_per_config(store: LightningStore) -> None:
    await store.enqueue([req(1, config=RolloutConfig(max_attempts=2))])
    first = (await store.claim("dies", timeout_s=0.1))[0]
    await asyncio.sleep(0.2)
    again = (await store.claim("w2"))[0]  # the expired attempt was requeued, then claimed without a timeout
    assert again.rollout.id == "r1" and again.attempt.number == 2 and again.attempt.timeout_s is None
    assert (await store.get_attempt(first.attempt.id)).status is AttemptStatus.TIMED_OUT


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
async def test_claim_refuses_a_bad_worker_timeout(store: LightningStore, bad: float) -> None:
    await store.enqueue([req(1)])
    with pytest.raises(InvalidRequestError, match="timeout_s"):
        await store.claim("w", timeout_s=bad)
    assert (await store.get_rollout("r1")).status is RolloutStatus.QUEUED  # nothing claimed


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf"), float("1e400")])
async def test_finish_refuses_a_reward_that_is_not_finite(store: LightningStore, bad: float) -> None:
    await store.enqueue([req(1)])
    claim = await claim_one(store)
    with pytest.raises(InvalidRequestError, match="reward must be a finite number"):
        await store.finish_attempt(claim.attempt.id, AttemptStatus.SUCCEEDED, reward=bad)
    assert (await store.get_attempt(claim.attempt.id)).status is AttemptStatus.RUNNING  # nothing recorded
    rollout = await store.finish_attempt(claim.attempt.id, AttemptStatus.SUCCEEDED, reward=0.5)
    assert rollout.final_reward == 0.5


# --------------------------------------------------------------------------------------------
# heartbeat, finish, retries
# --------------------------------------------------------------------------------------------


async def test_heartbeat_extends_the_deadline(store: LightningStore) -> None:
    # Seconds, not tenths: on a loaded 2-core CI machine (PostgreSQL beside the tests) a call can
    # return a few hundred milliseconds late, and a 0.1 s margin failed there (2026-11-27). Only the
    # "still alive" check has a deadline to meet (0.8 s of slack); "lost" only gets truer with delay.
    await store.enqueue([req(1, config=RolloutConfig(heartbeat_timeout_s=2.0))])
    claim = await claim_one(store)
    await asyncio.sleep(1.0)
    beat = await store.heartbeat(claim.attempt.id)
    assert beat.heartbeat_at > claim.attempt.heartbeat_at
    assert beat.deadline == pytest.approx(beat.heartbeat_at + 2.0)
    await asyncio.sleep(1.2)  # >= 2.2 s after the claim (its own deadline passed), 1.2 s after the beat
    assert (await store.get_attempt(claim.attempt.id)).status is AttemptStatus.RUNNING
    await asyncio.sleep(1.2)  # >= 2.4 s without a heartbeat: lost
    lost = await store.get_attempt(claim.attempt.id)
    assert lost.status is AttemptStatus.TIMED_OUT
    assert lost.error is not None and "heartbeat" in lost.error
    with pytest.raises(IllegalTransitionError):
        await store.heartbeat(claim.attempt.id)


async def test_heartbeat_of_unknown_or_ended_attempt(store: LightningStore) -> None:
    with pytest.raises(NotFoundError):
        await store.heartbeat("at-nope")
    await store.enqueue([req(1)])
    claim = await claim_one(store)
    await store.finish_attempt(claim.attempt.id, AttemptStatus.SUCCEEDED, reward=1.0)
    with pytest.raises(IllegalTransitionError, match="succeeded"):
        await store.heartbeat(claim.attempt.id)


async def test_finish_succeeded_records_reward(store: LightningStore) -> None:
    await store.enqueue([req(1)])
    claim = await claim_one(store)
    rollout = await store.finish_attempt(claim.attempt.id, AttemptStatus.SUCCEEDED, reward=0.75)
    assert rollout.status is RolloutStatus.SUCCEEDED
    assert rollout.final_reward == 0.75 and rollout.error is None
    assert rollout.ended_at is not None and rollout.ended_at >= claim.attempt.started_at
    assert await store.get_rollout("r1") == rollout
    attempt = await store.get_attempt(claim.attempt.id)
    assert attempt.status is AttemptStatus.SUCCEEDED
    assert (attempt.reward, attempt.deadline, attempt.error) == (0.75, None, None)
    assert attempt.ended_at is not None


async def test_failure_is_not_retried_by_default(store: LightningStore) -> None:
    await store.enqueue([req(1, config=RolloutConfig(max_attempts=3))])
    claim = await claim_one(store)
    rollout = await store.finish_attempt(claim.attempt.id, AttemptStatus.FAILED, error="ValueError: boom")
    assert rollout.status is RolloutStatus.FAILED
    assert rollout.error == "ValueError: boom" and rollout.final_reward is None
    assert (await store.get_attempt(claim.attempt.id)).error == "ValueError: boom"
    assert await store.claim("w") == []


async def test_failure_retried_with_retry_on_until_max_attempts(store: LightningStore) -> None:
    await store.enqueue([req(1, config=RolloutConfig(max_attempts=3, retry_on=["failed"]))])
    attempt_ids: list[str] = []
    for number in (1, 2, 3):
        claim = await claim_one(store, worker=f"w{number}")
        assert claim.attempt.number == number and claim.rollout.attempt_count == number
        attempt_ids.append(claim.attempt.id)
        rollout = await store.finish_attempt(claim.attempt.id, AttemptStatus.FAILED, error=f"boom {number}")
        expected = RolloutStatus.REQUEUED if number < 3 else RolloutStatus.FAILED
        assert rollout.status is expected
    assert rollout.error == "gave up after 3 attempts; last: boom 3"
    attempts = await store.query_attempts("r1")
    assert [a.id for a in attempts] == attempt_ids
    assert [a.number for a in attempts] == [1, 2, 3]
    assert all(a.status is AttemptStatus.FAILED for a in attempts)
    assert await store.claim("w") == []


async def test_requeued_rollout_keeps_its_place_in_the_queue(store: LightningStore) -> None:
    await store.enqueue([req(1, config=RolloutConfig(max_attempts=2, retry_on=["failed"])), req(2)])
    first = await claim_one(store)
    assert first.rollout.id == "r1"
    await store.enqueue([req(3)])
    requeued = await store.finish_attempt(first.attempt.id, AttemptStatus.FAILED, error="flaky")
    assert requeued.status is RolloutStatus.REQUEUED and requeued.error == "flaky"
    assert [c.rollout.id for c in await store.claim("w", n=3)] == ["r1", "r2", "r3"]


async def test_worker_reported_timeout(store: LightningStore) -> None:
    await store.enqueue([req(1), req(2, config=RolloutConfig(max_attempts=2))])
    c1, c2 = await store.claim("w", n=2)
    r1 = await store.finish_attempt(c1.attempt.id, AttemptStatus.TIMED_OUT, error="agent too slow")
    assert (r1.status, r1.error) == (RolloutStatus.TIMED_OUT, "agent too slow")
    r2 = await store.finish_attempt(c2.attempt.id, AttemptStatus.TIMED_OUT, error="agent too slow")
    assert r2.status is RolloutStatus.REQUEUED


async def test_finish_errors(store: LightningStore) -> None:
    await store.enqueue([req(1)])
    claim = await claim_one(store)
    for bad in (AttemptStatus.RUNNING, AttemptStatus.CANCELLED):
        with pytest.raises(InvalidRequestError):
            await store.finish_attempt(claim.attempt.id, bad)
    with pytest.raises(NotFoundError):
        await store.finish_attempt("at-missing", AttemptStatus.SUCCEEDED)
    await store.finish_attempt(claim.attempt.id, AttemptStatus.FAILED, error="x")
    with pytest.raises(IllegalTransitionError):
        await store.finish_attempt(claim.attempt.id, AttemptStatus.SUCCEEDED, reward=1.0)
    rollout = await store.get_rollout("r1")
    assert rollout.status is RolloutStatus.FAILED and rollout.final_reward is None


# --------------------------------------------------------------------------------------------
# timeouts enforced by the store
# --------------------------------------------------------------------------------------------


async def test_store_times_out_a_slow_attempt(store: LightningStore) -> None:
    await store.enqueue([req(1, config=RolloutConfig(timeout_s=0.2))])
    claim = await claim_one(store)
    await asyncio.sleep(0.3)
    # The worker comes back too late: the store already ended its attempt, and says so.
    with pytest.raises(IllegalTransitionError, match="timed_out"):
        await store.finish_attempt(claim.attempt.id, AttemptStatus.SUCCEEDED, reward=1.0)
    attempt = await store.get_attempt(claim.attempt.id)
    assert attempt.status is AttemptStatus.TIMED_OUT and attempt.deadline is None
    assert attempt.error is not None and "timeout" in attempt.error
    rollout = await store.get_rollout("r1")
    assert rollout.status is RolloutStatus.TIMED_OUT and rollout.final_reward is None
    assert rollout.ended_at is not None


async def test_lost_worker_is_requeued_then_failed(store: LightningStore) -> None:
    await store.enqueue([req(1, config=RolloutConfig(heartbeat_timeout_s=0.2, max_attempts=2))])
    first = await claim_one(store, worker="dies-1")
    await asyncio.sleep(0.3)
    assert await store.expire() == 1
    assert await store.expire() == 0
    assert (await store.get_attempt(first.attempt.id)).status is AttemptStatus.TIMED_OUT
    rollout = await store.get_rollout("r1")
    assert rollout.status is RolloutStatus.REQUEUED
    assert rollout.error is not None and "dies-1" in rollout.error
    second = await claim_one(store, worker="dies-2")
    assert second.attempt.number == 2 and second.rollout.id == "r1"
    await asyncio.sleep(0.3)
    rollout = await store.get_rollout("r1")
    assert rollout.status is RolloutStatus.FAILED
    assert rollout.error is not None and rollout.error.startswith("gave up after 2 attempts")
    attempts = await store.query_attempts("r1")
    assert [(a.worker_id, a.status) for a in attempts] == [
        ("dies-1", AttemptStatus.TIMED_OUT),
        ("dies-2", AttemptStatus.TIMED_OUT),
    ]


async def test_lost_worker_not_retried_without_heartbeat_in_retry_on(store: LightningStore) -> None:
    config = RolloutConfig(heartbeat_timeout_s=50, max_attempts=3, retry_on=["failed"])
    await store.enqueue([req(1, config=config)])
    claim = await claim_one(store)
    assert await store.expire(claim.attempt.started_at + 49) == 0
    assert await store.expire(claim.attempt.started_at + 51) == 1
    rollout = await store.get_rollout("r1")
    assert rollout.status is RolloutStatus.FAILED


async def test_expire_at_an_explicit_time(store: LightningStore) -> None:
    limits = RolloutConfig(timeout_s=100, heartbeat_timeout_s=1000, max_attempts=2)
    await store.enqueue([req(1, config=limits), req(2, config=RolloutConfig(heartbeat_timeout_s=1000))])
    c1, c2 = await store.claim("w", n=2)
    assert await store.expire(c1.attempt.started_at + 99) == 0
    assert await store.expire(now=c1.attempt.started_at + 101) == 1  # the protocol names it `now`
    assert (await store.get_attempt(c1.attempt.id)).status is AttemptStatus.TIMED_OUT
    assert (await store.get_rollout("r1")).status is RolloutStatus.REQUEUED
    assert (await store.get_attempt(c2.attempt.id)).status is AttemptStatus.RUNNING  # no timeout, heartbeat not due
    assert await store.expire(c1.attempt.started_at + 500) == 0


async def test_an_attempt_without_limits_still_has_a_deadline(store: LightningStore) -> None:
    """A worker killed while its rollout has no timeout in its config must not leave it running forever."""
    await store.enqueue([req(1, config=RolloutConfig(max_attempts=2))])
    claim = await claim_one(store, "killed")
    assert claim.attempt.deadline == pytest.approx(claim.attempt.started_at + DEFAULT_HEARTBEAT_TIMEOUT_S)
    assert await store.expire(claim.attempt.heartbeat_at + DEFAULT_HEARTBEAT_TIMEOUT_S - 1) == 0
    assert await store.expire(claim.attempt.heartbeat_at + DEFAULT_HEARTBEAT_TIMEOUT_S + 1) == 1
    lost = await store.get_attempt(claim.attempt.id)
    assert lost.status is AttemptStatus.TIMED_OUT and lost.error is not None and "no heartbeat for 60 s" in lost.error
    assert (await store.get_rollout("r1")).status is RolloutStatus.REQUEUED  # retried per the config


# --------------------------------------------------------------------------------------------
# cancel
# --------------------------------------------------------------------------------------------


async def test_cancel(store: LightningStore) -> None:
    await store.enqueue([req(1), req(2), req(3)])
    running = await claim_one(store)  # r1
    done = await claim_one(store)  # r2
    await store.finish_attempt(done.attempt.id, AttemptStatus.SUCCEEDED, reward=1.0)
    out = await store.cancel(["r1", "r2", "r3"])
    assert [(r.id, r.status) for r in out] == [
        ("r1", RolloutStatus.CANCELLED),
        ("r2", RolloutStatus.SUCCEEDED),
        ("r3", RolloutStatus.CANCELLED),
    ]
    assert out[0].ended_at is not None and out[0].error == "cancelled"
    attempt = await store.get_attempt(running.attempt.id)
    assert attempt.status is AttemptStatus.CANCELLED
    with pytest.raises(IllegalTransitionError):
        await store.finish_attempt(running.attempt.id, AttemptStatus.SUCCEEDED)
    assert await store.claim("w") == []
    assert await store.cancel(["r1"]) == [await store.get_rollout("r1")]
    with pytest.raises(NotFoundError):
        await store.cancel(["nope"])


# --------------------------------------------------------------------------------------------
# queries
# --------------------------------------------------------------------------------------------


async def test_query_rollouts_filters_and_pages(store: LightningStore) -> None:
    await store.enqueue([req(i, group_id=f"g{i % 3}", mode="val" if i % 2 else "train") for i in range(12)])
    await store.claim("w", n=4)  # r0..r3 running
    every = await store.query_rollouts()
    assert [r.id for r in every] == [f"r{i}" for i in range(12)]
    assert [r.seq for r in every] == sorted(r.seq for r in every)
    running = await store.query_rollouts(status=[RolloutStatus.RUNNING])
    assert [r.id for r in running] == ["r0", "r1", "r2", "r3"]
    both = await store.query_rollouts(status=[RolloutStatus.RUNNING, RolloutStatus.QUEUED])
    assert len(both) == 12
    g1 = await store.query_rollouts(group_id="g1")
    assert [r.id for r in g1] == ["r1", "r4", "r7", "r10"]
    val_g1 = await store.query_rollouts(group_id="g1", mode="val")
    assert [r.id for r in val_g1] == ["r1", "r7"]
    picked = await store.query_rollouts(ids=["r9", "r2", "nope"], status=[RolloutStatus.QUEUED])
    assert [r.id for r in picked] == ["r9"]
    assert await store.query_rollouts(ids=[]) == []
    assert await store.query_rollouts(status=[]) == []
    pages = [await store.query_rollouts(limit=5, offset=o) for o in (0, 5, 10, 15)]
    assert [len(p) for p in pages] == [5, 5, 2, 0]
    assert [r.id for p in pages for r in p] == [r.id for r in every]


async def test_query_attempts_and_lookups(store: LightningStore) -> None:
    with pytest.raises(NotFoundError):
        await store.get_rollout("nope")
    with pytest.raises(NotFoundError):
        await store.get_attempt("nope")
    with pytest.raises(NotFoundError):
        await store.query_attempts("nope")
    await store.enqueue([req(1)])
    assert await store.query_attempts("r1") == []
    claim = await claim_one(store)
    assert await store.query_attempts("r1") == [claim.attempt]


# --------------------------------------------------------------------------------------------
# spans
# --------------------------------------------------------------------------------------------


async def test_spans_are_idempotent_and_ordered(store: LightningStore) -> None:
    await store.enqueue([req(1)])
    claim = await claim_one(store)
    rich = span(
        claim,
        "llm.call",
        trace_id="t" * 32,
        span_id="s1",
        parent_id="p0",
        kind="client",
        start_ns=10,
        end_ns=20,
        attributes={"gen_ai.request.model": "tiny", "lightning.prompt_token_ids": [1, 2, 3], "ok": True},
        events=[SpanEvent(name="token", time_ns=15, attributes={"i": 1})],
        status=SpanStatus(code="error", message="bad"),
        seq=99,  # ignored: the store assigns seq
    )
    batch = [rich, span(claim, "tool", span_id="s2"), span(claim, "reward", span_id="s3")]
    assert await store.add_spans(batch) == 3
    assert await store.add_spans([*batch, span(claim, "tool", span_id="s4")]) == 1
    assert await store.add_spans([]) == 0
    spans = await store.query_spans(attempt_id=claim.attempt.id)
    assert [(s.span_id, s.seq) for s in spans] == [("s1", 1), ("s2", 2), ("s3", 3), ("s4", 4)]
    assert spans[0] == rich.model_copy(update={"seq": 1})
    assert [s.span_id for s in await store.query_spans(name="tool")] == ["s2", "s4"]
    assert [s.span_id for s in await store.query_spans(rollout_id="r1", limit=2, offset=1)] == ["s2", "s3"]
    assert (await store.stats()).spans == 4


async def test_span_identity_is_trace_and_span_id(store: LightningStore) -> None:
    await store.enqueue([req(1)])
    claim = await claim_one(store)
    same_span_other_trace = [span(claim, trace_id="a", span_id="x"), span(claim, trace_id="b", span_id="x")]
    assert await store.add_spans(same_span_other_trace) == 2
    duplicate_in_batch = [span(claim, trace_id="c", span_id="y"), span(claim, trace_id="c", span_id="y")]
    assert await store.add_spans(duplicate_in_batch) == 1
    assert [s.seq for s in await store.query_spans(attempt_id=claim.attempt.id)] == [1, 2, 3]


async def test_spans_follow_attempt_order_across_attempts(store: LightningStore) -> None:
    await store.enqueue([req(1, config=RolloutConfig(max_attempts=2, retry_on=["failed"])), req(2)])
    first = await claim_one(store)
    other = await claim_one(store)  # r2
    await store.add_spans([span(other, span_id="o1")])
    await store.add_spans([span(first, span_id="a1"), span(first, span_id="a2")])
    await store.finish_attempt(first.attempt.id, AttemptStatus.FAILED, error="retry me")
    second = await claim_one(store)
    assert second.rollout.id == "r1"
    await store.add_spans([span(second, span_id="b1")])
    await store.add_spans([span(first, span_id="a3")])  # a late flush from the ended attempt is kept
    ordered = await store.query_spans(rollout_id="r1")
    assert [(s.span_id, s.attempt_id, s.seq) for s in ordered] == [
        ("a1", first.attempt.id, 1),
        ("a2", first.attempt.id, 2),
        ("a3", first.attempt.id, 3),
        ("b1", second.attempt.id, 1),
    ]
    assert [s.span_id for s in await store.query_spans()] == ["a1", "a2", "a3", "o1", "b1"]


async def test_spans_for_unknown_attempt_are_rejected_whole(store: LightningStore) -> None:
    await store.enqueue([req(1), req(2)])
    claim = await claim_one(store)
    other = await claim_one(store)
    good = span(claim, span_id="good")
    orphan = Span(name="x", rollout_id="r1", attempt_id="at-unknown")
    with pytest.raises(NotFoundError, match="at-unknown"):
        await store.add_spans([good, orphan])
    wrong_rollout = Span(name="x", rollout_id=other.rollout.id, attempt_id=claim.attempt.id)
    with pytest.raises(NotFoundError):
        await store.add_spans([good, wrong_rollout])
    assert await store.query_spans() == []


async def test_a_failing_call_does_not_undo_concurrent_ones(store: LightningStore) -> None:
    await store.enqueue([req(1)])
    claim = await claim_one(store)
    orphan = Span(name="x", rollout_id="r1", attempt_id="at-unknown")
    calls = [store.add_spans([orphan] if i % 3 == 0 else [span(claim, span_id=f"s{i}")]) for i in range(30)]
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(r, NotFoundError) for r in results[::3])
    assert sum(r == 1 for r in results) == 20
    stored = await store.query_spans(attempt_id=claim.attempt.id)
    assert sorted(s.span_id for s in stored) == sorted(f"s{i}" for i in range(30) if i % 3)
    assert [s.seq for s in stored] == list(range(1, 21))


# --------------------------------------------------------------------------------------------
# resources
# --------------------------------------------------------------------------------------------


async def test_resources_are_versioned(store: LightningStore) -> None:
    with pytest.raises(NotFoundError, match="add_resources"):
        await store.get_resources()
    llm = LLMResource(base_url="http://127.0.0.1:1/v1", model="tiny", sampling={"temperature": 0.7})
    v1 = await store.add_resources(llm=llm, prompts={"system": "be brief"}, extra={"k": [1, "two"]})
    v2 = await store.add_resources(prompts={"system": "be verbose"})
    assert (v1.version, v2.version) == (1, 2)
    assert await store.get_resources(1) == v1
    assert await store.get_resources() == v2
    assert await store.get_resources(None) == v2
    assert (v1.llm, v1.prompts, v1.extra) == (llm, {"system": "be brief"}, {"k": [1, "two"]})
    with pytest.raises(NotFoundError, match="latest is 2"):
        await store.get_resources(3)
    assert (await store.stats()).resources_versions == 2


# --------------------------------------------------------------------------------------------
# waiting
# --------------------------------------------------------------------------------------------


async def test_wait_for_rollouts_returns_once_all_ended(store: LightningStore) -> None:
    await store.enqueue([req(1), req(2)])
    waiter = asyncio.create_task(store.wait_for_rollouts(["r2", "r1"], timeout_s=10))
    c1, c2 = await store.claim("w", n=2)
    await asyncio.sleep(0.05)
    assert not waiter.done()
    await store.finish_attempt(c1.attempt.id, AttemptStatus.SUCCEEDED, reward=1.0)
    await store.finish_attempt(c2.attempt.id, AttemptStatus.FAILED, error="x")
    started = time.monotonic()
    ended = await asyncio.wait_for(waiter, timeout=5)
    assert time.monotonic() - started < 1.0
    assert [(r.id, r.status) for r in ended] == [("r2", RolloutStatus.FAILED), ("r1", RolloutStatus.SUCCEEDED)]


async def test_wait_for_rollouts_times_out_with_the_ended_ones(store: LightningStore) -> None:
    await store.enqueue([req(1), req(2)])
    claim = await claim_one(store)
    await store.finish_attempt(claim.attempt.id, AttemptStatus.SUCCEEDED, reward=1.0)
    started = time.monotonic()
    ended = await store.wait_for_rollouts(["r1", "r2"], timeout_s=0.2)
    assert 0.15 <= time.monotonic() - started < 2.0
    assert [r.id for r in ended] == ["r1"]
    assert await store.wait_for_rollouts([], timeout_s=5) == []


async def test_wait_for_rollouts_sees_store_enforced_timeouts(store: LightningStore) -> None:
    await store.enqueue([req(1, config=RolloutConfig(timeout_s=0.2))])
    await claim_one(store)
    started = time.monotonic()
    ended = await store.wait_for_rollouts(["r1"], timeout_s=5)
    assert time.monotonic() - started < 2.0
    assert [(r.id, r.status) for r in ended] == [("r1", RolloutStatus.TIMED_OUT)]


# --------------------------------------------------------------------------------------------
# housekeeping
# --------------------------------------------------------------------------------------------


async def test_prune_deletes_old_ended_rollouts_with_their_data(store: LightningStore) -> None:
    await store.enqueue([req(1), req(2), req(3)])
    c1, c2 = await store.claim("w", n=2)
    await store.add_spans([span(c1, span_id="x1"), span(c2, span_id="x2")])
    await store.finish_attempt(c1.attempt.id, AttemptStatus.SUCCEEDED, reward=1.0)
    ended_before = time.time() + 1
    assert await store.prune(older_than=time.time() - 3600) == 0
    assert await store.prune(older_than=ended_before) == 1
    with pytest.raises(NotFoundError):
        await store.get_rollout("r1")
    with pytest.raises(NotFoundError):
        await store.get_attempt(c1.attempt.id)
    assert [s.span_id for s in await store.query_spans()] == ["x2"]
    assert [r.id for r in await store.query_rollouts()] == ["r2", "r3"]
    (fresh,) = await store.enqueue([req(4)])
    assert fresh.seq > max(r.seq for r in await store.query_rollouts(ids=["r2", "r3"]))
    stats = await store.stats()
    assert stats.spans == 1 and stats.attempts_by_status == {"running": 1}


async def test_stats_count_by_status(store: LightningStore) -> None:
    empty = await store.stats()
    assert (empty.rollouts_by_status, empty.attempts_by_status, empty.spans, empty.resources_versions) == ({}, {}, 0, 0)
    await store.enqueue([req(i) for i in range(5)])
    c1, c2, c3 = await store.claim("w", n=3)
    await store.finish_attempt(c1.attempt.id, AttemptStatus.SUCCEEDED, reward=1.0)
    await store.finish_attempt(c2.attempt.id, AttemptStatus.FAILED, error="x")
    await store.cancel(["r4"])
    await store.add_spans([span(c3), span(c3)])
    stats = await store.stats()
    assert stats.rollouts_by_status == {"succeeded": 1, "failed": 1, "running": 1, "queued": 1, "cancelled": 1}
    assert stats.attempts_by_status == {"succeeded": 1, "failed": 1, "running": 1}
    assert stats.spans == 2


# --------------------------------------------------------------------------------------------
# bad arguments
# --------------------------------------------------------------------------------------------


async def test_bad_arguments_are_invalid_requests(store: LightningStore) -> None:
    with pytest.raises(InvalidRequestError):
        await store.claim("w", n=0)
    with pytest.raises(InvalidRequestError):
        await store.claim("", n=1)
    with pytest.raises(InvalidRequestError):
        await store.claim("w", n=MAX_BATCH + 1)
    for limit, offset in ((0, 0), (MAX_PAGE + 1, 0), (10, -1)):
        with pytest.raises(InvalidRequestError):
            await store.query_rollouts(limit=limit, offset=offset)
        with pytest.raises(InvalidRequestError):
            await store.query_spans(limit=limit, offset=offset)
    with pytest.raises(InvalidRequestError):
        await store.cancel([f"r{i}" for i in range(MAX_BATCH + 1)])


async def test_oversized_batches_are_invalid_requests(store: LightningStore) -> None:
    too_many = [RolloutRequest(id=f"r{i}", task=Task(input=i)) for i in range(MAX_BATCH + 1)]
    with pytest.raises(InvalidRequestError):
        await store.enqueue(too_many)
    spans = [Span(name="s", rollout_id="r", attempt_id="a") for _ in range(MAX_BATCH + 1)]
    with pytest.raises(InvalidRequestError):
        await store.add_spans(spans)
    assert await store.query_rollouts() == []
