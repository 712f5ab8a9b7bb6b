"""A toy store backend: a few dicts behind one lock, implementing only ``StoreCore``'s primitives.

It exists to prove (in the contract suite, as the ``toy`` backend of the ``store`` fixture) that a
backend needs nothing but the primitives: every public method, check and rule comes from
``StoreCore`` and ``store._rules``. docs/stores.md ("Write a backend") walks through it. It keeps
no index, so it scans; that is fine for a toy.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from lightning_rl.store import _rules as rules
from lightning_rl.store._core import AttemptChange, RolloutChange, RolloutQuery, SpanQuery, StoreCore
from lightning_rl.store.base import now
from lightning_rl.types import Attempt, AttemptStatus, Claim, Resources, Rollout, RolloutRequest, Span, StoreStats

__all__ = ["ToyStore"]


class ToyStore(StoreCore):
    """Rows are pydantic models in dicts; every primitive runs under one lock and hands out copies."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = asyncio.Lock()
        self._rollouts: dict[str, Rollout] = {}  # insertion order is seq order
        self._attempts: dict[str, Attempt] = {}  # insertion order is creation order
        self._spans: dict[tuple[str, str], Span] = {}  # arrival order
        self._resources: list[Resources] = []
        self._seq = 0

    def _expire_now(self, t: float) -> int:
        running = [a for a in self._attempts.values() if a.status is AttemptStatus.RUNNING]
        overdue = [a for a in running if a.deadline is not None and a.deadline <= t]
        for attempt in overdue:
            rules.expire(self._rollouts[attempt.rollout_id], attempt, t, now())
        if overdue:
            self._rollouts_ended()
        return len(overdue)

    async def _insert_rollouts(self, requests: list[RolloutRequest]) -> list[Rollout]:
        async with self._lock:
            found = {r.id: self._rollouts[r.id] for r in requests if r.id in self._rollouts}
            for rollout in rules.plan_enqueue(requests, found, now()):
                self._seq += 1
                rollout.seq = self._seq
                self._rollouts[rollout.id] = rollout
            return [found[r.id].model_copy(deep=True) for r in requests]

    async def _claim(self, worker_id: str, n: int, timeout_s: float | None) -> list[Claim]:
        async with self._lock:
            self._expire_now(now())
            waiting = [r for r in self._rollouts.values() if r.status in rules.WAITING][:n]
            claims: list[Claim] = []
            for rollout in waiting:
                attempt = rules.open_attempt(rollout, worker_id, now(), timeout_s)
                self._attempts[attempt.id] = attempt
                claims.append(Claim(rollout=rollout.model_copy(deep=True), attempt=attempt.model_copy()))
            return claims

    async def _update_attempt(self, attempt_id: str, change: AttemptChange) -> tuple[Rollout, Attempt]:
        async with self._lock:
            self._expire_now(now())
            attempt = self._attempts.get(attempt_id)
            if attempt is None:
                raise rules.attempt_not_found(attempt_id)
            rollout = self._rollouts[attempt.rollout_id]
            # Change copies and store them only if the change succeeds: a refused change leaves no trace.
            r, a = rollout.model_copy(deep=True), attempt.model_copy()
            change(r, a)
            self._rollouts[r.id], self._attempts[a.id] = r, a
            if r.ended_at is not None and rollout.ended_at is None:
                self._rollouts_ended()
            return r.model_copy(deep=True), a.model_copy()

    async def _update_rollouts(self, ids: list[str], change: RolloutChange) -> list[Rollout]:
        async with self._lock:
            for rid in ids:
                if rid not in self._rollouts:
                    raise rules.rollout_not_found(rid)
            for rid in dict.fromkeys(ids):
                rollout = self._rollouts[rid]
                running = [
                    a for a in self._attempts.values() if a.rollout_id == rid and a.status is AttemptStatus.RUNNING
                ]
                if change(rollout, running[-1] if running else None) and rollout.ended_at is not None:
                    self._rollouts_ended()
            return [self._rollouts[rid].model_copy(deep=True) for rid in ids]

    async def _expire(self, t: float) -> int:
        async with self._lock:
            return self._expire_now(t)

    async def _select_rollouts(self, query: RolloutQuery) -> list[Rollout]:
        async with self._lock:
            self._expire_now(now())
            rows = [r for r in self._rollouts.values() if query.matches(r)]
            return [r.model_copy(deep=True) for r in rows[query.offset : query.offset + query.limit]]

    async def _get_attempt(self, attempt_id: str) -> Attempt | None:
        async with self._lock:
            self._expire_now(now())
            attempt = self._attempts.get(attempt_id)
            return None if attempt is None else attempt.model_copy()

    async def _select_attempts(self, rollout_id: str) -> list[Attempt] | None:
        async with self._lock:
            self._expire_now(now())
            if rollout_id not in self._rollouts:
                return None
            return [a.model_copy() for a in self._attempts.values() if a.rollout_id == rollout_id]

    async def _insert_spans(self, spans: list[Span]) -> int:
        async with self._lock:
            rules.check_span_targets(spans, {a.id: a.rollout_id for a in self._attempts.values()})
            added = 0
            for span in spans:
                key = (span.trace_id, span.span_id)
                if key not in self._spans:
                    seq = 1 + sum(1 for s in self._spans.values() if s.attempt_id == span.attempt_id)
                    self._spans[key] = span.model_copy(deep=True, update={"seq": seq})
                    added += 1
            return added

    async def _select_spans(self, query: SpanQuery) -> list[Span]:
        async with self._lock:
            order = {aid: i for i, aid in enumerate(self._attempts)}
            rows = [
                s
                for s in self._spans.values()
                if (query.rollout_id is None or s.rollout_id == query.rollout_id)
                and (query.attempt_id is None or s.attempt_id == query.attempt_id)
                and (query.name is None or s.name == query.name)
            ]
            rows.sort(key=lambda s: (order.get(s.attempt_id, 0), s.seq))
            return [s.model_copy(deep=True) for s in rows[query.offset : query.offset + query.limit]]

    async def _insert_resources(self, make: Callable[[int], Resources]) -> Resources:
        async with self._lock:
            self._resources.append(make(len(self._resources) + 1))
            return self._resources[-1].model_copy(deep=True)

    async def _select_resources(self, version: int | None) -> tuple[Resources | None, int]:
        async with self._lock:
            latest = len(self._resources)
            index = latest if version is None else version
            return (self._resources[index - 1].model_copy(deep=True) if 1 <= index <= latest else None), latest

    async def _delete_ended(self, older_than: float) -> int:
        async with self._lock:
            doomed = {r.id for r in self._rollouts.values() if r.ended_at is not None and r.ended_at < older_than}
            self._rollouts = {k: v for k, v in self._rollouts.items() if k not in doomed}
            self._attempts = {k: v for k, v in self._attempts.items() if v.rollout_id not in doomed}
            self._spans = {k: v for k, v in self._spans.items() if v.rollout_id not in doomed}
            return len(doomed)

    async def _count(self) -> StoreStats:
        async with self._lock:
            self._expire_now(now())
            rollouts: dict[str, int] = {}
            for r in self._rollouts.values():
                rollouts[r.status.value] = rollouts.get(r.status.value, 0) + 1
            attempts: dict[str, int] = {}
            for a in self._attempts.values():
                attempts[a.status.value] = attempts.get(a.status.value, 0) + 1
            return StoreStats(
                rollouts_by_status=rollouts,
                attempts_by_status=attempts,
                spans=len(self._spans),
                resources_versions=len(self._resources),
            )

    async def close(self) -> None:
        return None
