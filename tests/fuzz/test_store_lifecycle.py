"""A Hypothesis state machine over the store's lifecycle, run against every backend.

Random sequences of enqueue (new and re-sent ids), claim, heartbeat, finish (every status, on live
and on dead attempts), cancel, expire (the clock moved past every deadline) and add_spans (new and
re-sent) are applied both to the store and to a model of the rules in ``lightning_rl.store._rules``.
After every step the store must agree with the model, and hold the invariants no sequence may break:
a rollout has at most one running attempt and it has one exactly when it is running; an ended
rollout has no running attempt; no rollout has two succeeded attempts; claims never hand out a
rollout that is not waiting; and every acknowledged span is there once.

The backends are the shared ``store`` fixture's (memory, SQLite, PostgreSQL, Redis, the HTTP
server, the toy backend), so they are checked by the same machine. Each Hypothesis example uses
its own id prefix and cancels its rollouts when it ends, so examples sharing one store never meet.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest

hypothesis = pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import (  # noqa: E402
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from lightning_rl.errors import IllegalTransitionError  # noqa: E402
from lightning_rl.store.base import LightningStore  # noqa: E402
from lightning_rl.types import AttemptStatus, RolloutConfig, RolloutRequest, RolloutStatus, Span, Task  # noqa: E402

pytestmark = pytest.mark.fuzz

T = TypeVar("T")

EXAMPLES = {"memory": 40, "toy": 40, "sqlite": 40}
"""Examples per backend; 20 for those behind a network round trip (PostgreSQL, Redis, HTTP)."""
STEPS = 20
WAITING = (RolloutStatus.QUEUED, RolloutStatus.REQUEUED)
ENDED = (RolloutStatus.SUCCEEDED, RolloutStatus.FAILED, RolloutStatus.TIMED_OUT, RolloutStatus.CANCELLED)


@dataclass
class ModelRollout:
    id: str
    max_attempts: int
    status: RolloutStatus = RolloutStatus.QUEUED
    attempts: list[str] = field(default_factory=list[str])
    running: str | None = None
    spans: set[str] = field(default_factory=set[str])


def lifecycle_machine(store: LightningStore, loop: asyncio.AbstractEventLoop) -> type[RuleBasedStateMachine]:
    """The machine class, bound to a store living on ``loop`` (the test's event loop)."""

    def call(coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(60)

    class Lifecycle(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.prefix = f"lc{uuid.uuid4().hex[:10]}"
            self.rollouts: dict[str, ModelRollout] = {}
            self.attempt_owner: dict[str, str] = {}
            self.sent_spans: list[Span] = []

        def _config(self, max_attempts: int) -> RolloutConfig:
            return RolloutConfig(max_attempts=max_attempts, heartbeat_timeout_s=3600.0)

        def _request(self, rollout: ModelRollout) -> RolloutRequest:
            return RolloutRequest(
                id=rollout.id, task=Task(input={"id": rollout.id}), config=self._config(rollout.max_attempts)
            )

        @initialize(k=st.integers(2, 4), max_attempts=st.integers(1, 3))
        def start(self, k: int, max_attempts: int) -> None:
            """Every example starts with rollouts waiting, so its steps go to the lifecycle itself."""
            self.enqueue(k, max_attempts)

        @rule(k=st.integers(1, 3), max_attempts=st.integers(1, 3))
        def enqueue(self, k: int, max_attempts: int) -> None:
            new = [ModelRollout(f"{self.prefix}-{len(self.rollouts) + i}", max_attempts) for i in range(k)]
            stored = call(store.enqueue([self._request(r) for r in new]))
            assert [r.id for r in stored] == [r.id for r in new]
            assert all(r.status is RolloutStatus.QUEUED for r in stored)
            self.rollouts.update({r.id: r for r in new})

        @precondition(lambda self: bool(self.rollouts))
        @rule(data=st.data())
        def enqueue_again(self, data: st.DataObject) -> None:
            """Re-sending an id is idempotent: the stored rollout comes back, unchanged."""
            rollout = data.draw(st.sampled_from(list(self.rollouts.values())))
            [stored] = call(store.enqueue([self._request(rollout)]))
            assert stored.id == rollout.id and stored.status is rollout.status

        @precondition(lambda self: any(r.status in WAITING for r in self.rollouts.values()))
        @rule(n=st.integers(1, 4))
        def claim(self, n: int) -> None:
            waiting = {r.id for r in self.rollouts.values() if r.status in WAITING}
            claims = call(store.claim(f"{self.prefix}-worker", n))
            assert len(claims) == min(n, len(waiting)), (len(claims), n, waiting)
            for c in claims:
                assert c.rollout.id in waiting, f"claimed {c.rollout.id}, which was not waiting"
                rollout = self.rollouts[c.rollout.id]
                rollout.status = RolloutStatus.RUNNING
                rollout.attempts.append(c.attempt.id)
                rollout.running = c.attempt.id
                self.attempt_owner[c.attempt.id] = rollout.id
                assert c.attempt.number == len(rollout.attempts)
                assert c.attempt.status is AttemptStatus.RUNNING
            assert len({c.rollout.id for c in claims}) == len(claims)

        def _attempts(self) -> st.SearchStrategy[str]:
            return st.sampled_from(list(self.attempt_owner))  # creation order: replays draw the same

        @precondition(lambda self: bool(self.attempt_owner))
        @rule(data=st.data())
        def heartbeat(self, data: st.DataObject) -> None:
            attempt_id = data.draw(self._attempts())
            rollout = self.rollouts[self.attempt_owner[attempt_id]]
            if rollout.running == attempt_id:
                assert call(store.heartbeat(attempt_id)).status is AttemptStatus.RUNNING
            else:
                with pytest.raises(IllegalTransitionError):
                    call(store.heartbeat(attempt_id))

        @precondition(lambda self: bool(self.attempt_owner))
        @rule(
            data=st.data(),
            status=st.sampled_from([AttemptStatus.SUCCEEDED, AttemptStatus.FAILED, AttemptStatus.TIMED_OUT]),
            reward=st.none() | st.floats(-1e6, 1e6, allow_nan=False),
        )
        def finish(self, data: st.DataObject, status: AttemptStatus, reward: float | None) -> None:
            attempt_id = data.draw(self._attempts())
            rollout = self.rollouts[self.attempt_owner[attempt_id]]
            if rollout.running != attempt_id:
                with pytest.raises(IllegalTransitionError):
                    call(store.finish_attempt(attempt_id, status, reward=reward))
                return
            after = call(store.finish_attempt(attempt_id, status, reward=reward))
            rollout.running = None
            if status is AttemptStatus.SUCCEEDED:
                rollout.status = RolloutStatus.SUCCEEDED
            elif status is AttemptStatus.FAILED:
                rollout.status = RolloutStatus.FAILED  # "failed" is not in the default retry_on
            else:
                left = len(rollout.attempts) < rollout.max_attempts
                rollout.status = RolloutStatus.REQUEUED if left else RolloutStatus.TIMED_OUT
            assert after.status is rollout.status, (after.status, rollout.status)

        @precondition(lambda self: bool(self.rollouts))
        @rule(data=st.data())
        def cancel(self, data: st.DataObject) -> None:
            ids = data.draw(st.lists(st.sampled_from(list(self.rollouts)), min_size=1, max_size=3, unique=True))
            after = {r.id: r.status for r in call(store.cancel(ids))}
            for rid in ids:
                rollout = self.rollouts[rid]
                if rollout.status not in ENDED:
                    rollout.status = RolloutStatus.CANCELLED
                    rollout.running = None
                assert after[rid] is rollout.status, (rid, after[rid], rollout.status)

        @precondition(lambda self: any(r.running for r in self.rollouts.values()))
        @rule()
        def expire(self) -> None:
            """The clock passes every deadline: every running attempt is declared lost (heartbeat)."""
            running = [r for r in self.rollouts.values() if r.running is not None]
            count = call(store.expire(time.time() + 10 * 3600))
            assert count == len(running), (count, [r.id for r in running])
            for rollout in running:
                rollout.running = None
                left = len(rollout.attempts) < rollout.max_attempts
                rollout.status = RolloutStatus.REQUEUED if left else RolloutStatus.FAILED

        @precondition(lambda self: any(r.running for r in self.rollouts.values()))
        @rule(data=st.data(), k=st.integers(1, 3), again=st.booleans())
        def add_spans(self, data: st.DataObject, k: int, again: bool) -> None:
            live = [r.id for r in self.rollouts.values() if r.running]
            rollout = self.rollouts[data.draw(st.sampled_from(live))]
            assert rollout.running is not None
            spans = [Span(name=f"s{i}", rollout_id=rollout.id, attempt_id=rollout.running) for i in range(k)]
            if again and self.sent_spans:
                spans.append(self.sent_spans[-1])  # a re-sent span is stored once
            new = call(store.add_spans(spans))
            fresh = [s for s in spans if s.span_id not in self.rollouts[s.rollout_id].spans]
            assert new == len(fresh), (new, len(fresh))
            for s in spans:
                self.rollouts[s.rollout_id].spans.add(s.span_id)
            self.sent_spans.extend(spans)

        @invariant()
        def store_agrees(self) -> None:
            if not self.rollouts:
                return
            stored = {r.id: r for r in call(store.query_rollouts(ids=list(self.rollouts)))}
            assert set(stored) == set(self.rollouts)
            for rid, model in self.rollouts.items():
                row = stored[rid]
                assert row.status is model.status, (rid, row.status, model.status)
                assert row.attempt_count == len(model.attempts), (rid, row.attempt_count, model.attempts)
                attempts = call(store.query_attempts(rid))
                assert [a.id for a in attempts] == model.attempts
                running = [a.id for a in attempts if a.status is AttemptStatus.RUNNING]
                assert running == ([model.running] if model.running else []), (rid, running, model.running)
                assert sum(a.status is AttemptStatus.SUCCEEDED for a in attempts) <= 1
                if model.status in ENDED:
                    assert row.ended_at is not None and not running
                if model.spans:
                    got = [s.span_id for s in call(store.query_spans(rollout_id=rid))]
                    assert sorted(got) == sorted(model.spans), rid

        def teardown(self) -> None:
            if self.rollouts:  # leave nothing waiting or running for the next example's claims
                call(store.cancel(list(self.rollouts)))

    return Lifecycle


async def test_lifecycle_matches_the_rules(store: LightningStore, request: pytest.FixtureRequest) -> None:
    machine = lifecycle_machine(store, asyncio.get_running_loop())
    config = settings(
        max_examples=EXAMPLES.get(request.node.callspec.params["store"], 20),
        stateful_step_count=STEPS,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    await asyncio.to_thread(run_state_machine_as_test, machine, settings=config)
