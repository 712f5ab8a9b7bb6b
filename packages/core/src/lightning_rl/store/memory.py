"""In-memory store: the reference implementation of the store protocol.

Used by unit tests and tiny runs in one process. It is not durable; ``SQLiteStore`` is the embedded
default. All state sits behind one ``asyncio`` lock, and a condition wakes ``wait_for_rollouts``.

Spans are kept as their JSON text (the form the SQL stores keep too) in dicts of strings, one per
attempt, in arrival order (which is ``seq`` order): a gateway records one span with hundreds of
token ids per call, and as live objects a long run's spans became a heap that every full garbage
collection of the serving process walked, so recording got dearer as spans piled up. A dict that
holds only strings is not tracked by the collector at all, the copy that isolates the store from
the caller is one serialisation instead of a deep copy, and reads pay the parse.
"""

from __future__ import annotations

import asyncio
import heapq
from collections import Counter
from collections.abc import Callable
from typing import TypeVar

from lightning_rl.store import _rules as rules
from lightning_rl.store._core import AttemptChange, RolloutChange, RolloutQuery, SpanQuery, StoreCore
from lightning_rl.store._spanjson import dump_span, span_key
from lightning_rl.store.base import now
from lightning_rl.types import Attempt, AttemptStatus, Claim, Resources, Rollout, RolloutRequest, Span, StoreStats

__all__ = ["MemoryStore"]

A = TypeVar("A", Attempt, Attempt | None)

_SPANS_PER_SLICE = 64
"""Spans serialised between two yields to the event loop: a gateway's writer hands over batches of
hundreds of spans, and serialising one in a single go stalled every request in flight for ~10 ms.
The lock stays held across the yields and nothing changes until the whole batch is serialised, so
readers see a batch all or nothing, and a cancelled call changes nothing."""


class MemoryStore(StoreCore):
    """A non-durable store for tests and single-process runs."""

    _poll_s = 0.5  # nothing changes behind its back: only deadlines passing need a poll

    def __init__(self) -> None:
        super().__init__()
        self._lock = asyncio.Lock()
        self._rollouts: dict[str, Rollout] = {}
        self._attempts: dict[str, Attempt] = {}
        self._attempts_of: dict[str, list[str]] = {}
        # attempt id -> {span key: span JSON} in seq order, and span key -> attempt id (idempotent
        # writes); only strings inside, so the collector never walks them (see the module docstring).
        self._spans: dict[str, dict[str, str]] = {}
        self._span_attempt: dict[str, str] = {}
        self._resources: list[Resources] = []
        self._seq = 0
        # claim and expiry must not scan every rollout: waiting rollouts sit in a heap by seq (stale
        # entries are skipped lazily), running attempts in a set.
        self._waiting: list[tuple[int, str]] = []
        self._running: set[str] = set()

    # --- primitives (each under the lock; models are copied on the way out) -----------------
    async def _insert_rollouts(self, requests: list[RolloutRequest]) -> list[Rollout]:
        async with self._lock:
            found = {r.id: self._rollouts[r.id] for r in requests if r.id in self._rollouts}
            for rollout in rules.plan_enqueue(requests, found, now()):
                self._seq += 1
                rollout.seq = self._seq
                self._rollouts[rollout.id] = rollout
                heapq.heappush(self._waiting, (rollout.seq, rollout.id))
            return [found[r.id].model_copy(deep=True) for r in requests]

    async def _claim(self, worker_id: str, n: int, timeout_s: float | None) -> list[Claim]:
        async with self._lock:
            self._expire_locked(now())
            claims: list[Claim] = []
            t = now()
            while self._waiting and len(claims) < n:
                _, rid = heapq.heappop(self._waiting)
                rollout = self._rollouts.get(rid)
                if rollout is None or rollout.status not in rules.WAITING:
                    continue  # a stale entry: the rollout was cancelled or pruned
                attempt = rules.open_attempt(rollout, worker_id, t, timeout_s)
                self._attempts[attempt.id] = attempt
                self._running.add(attempt.id)
                self._attempts_of.setdefault(rollout.id, []).append(attempt.id)
                claims.append(Claim(rollout=rollout.model_copy(deep=True), attempt=attempt.model_copy()))
            return claims

    async def _update_attempt(self, attempt_id: str, change: AttemptChange) -> tuple[Rollout, Attempt]:
        async with self._lock:
            if attempt_id not in self._attempts:
                raise rules.attempt_not_found(attempt_id)
            self._expire_locked(now())
            attempt = self._attempts[attempt_id]
            rollout = self._rollouts[attempt.rollout_id]
            self._change(rollout, attempt, change)
            return rollout.model_copy(deep=True), attempt.model_copy()

    async def _update_rollouts(self, ids: list[str], change: RolloutChange) -> list[Rollout]:
        async with self._lock:
            for rid in ids:  # all-or-nothing: unknown ids fail the batch before any change
                if rid not in self._rollouts:
                    raise rules.rollout_not_found(rid)
            out: list[Rollout] = []
            for rid in ids:
                rollout = self._rollouts[rid]
                running = next((self._attempts[a] for a in self._attempts_of.get(rid, []) if a in self._running), None)
                self._change(rollout, running, change)
                out.append(rollout.model_copy(deep=True))
            return out

    async def _expire(self, t: float) -> int:
        async with self._lock:
            return self._expire_locked(t)

    async def _select_rollouts(self, query: RolloutQuery) -> list[Rollout]:
        async with self._lock:
            self._expire_locked(now())
            if query.ids is not None:
                candidates = [self._rollouts[i] for i in query.ids if i in self._rollouts]
            else:
                candidates = list(self._rollouts.values())
            rows = [r for r in sorted(candidates, key=lambda r: r.seq) if query.matches(r)]
            return [r.model_copy(deep=True) for r in rows[query.offset : query.offset + query.limit]]

    async def _get_attempt(self, attempt_id: str) -> Attempt | None:
        async with self._lock:
            self._expire_locked(now())
            attempt = self._attempts.get(attempt_id)
            return None if attempt is None else attempt.model_copy()

    async def _select_attempts(self, rollout_id: str) -> list[Attempt] | None:
        async with self._lock:
            self._expire_locked(now())
            if rollout_id not in self._rollouts:
                return None
            return [self._attempts[a].model_copy() for a in self._attempts_of.get(rollout_id, [])]

    async def _insert_spans(self, spans: list[Span]) -> int:
        async with self._lock:
            rules.check_span_targets(spans, {s.attempt_id: self._rollout_of(s.attempt_id) for s in spans})
            # Serialise first (yielding between slices), then change state in one synchronous step:
            # a caller cancelled mid-batch leaves the store exactly as it was.
            rows: dict[str, dict[str, str]] = {}  # attempt id -> {key: JSON} of this batch
            seen: set[str] = set()
            for i, span in enumerate(spans):
                if i and i % _SPANS_PER_SLICE == 0:
                    await asyncio.sleep(0)  # let the serving loop answer requests between slices
                key = span_key(span)
                if key in self._span_attempt or key in seen:
                    continue  # writes are idempotent on (trace_id, span_id)
                seen.add(key)
                new = rows.setdefault(span.attempt_id, {})
                seq = len(self._spans.get(span.attempt_id, ())) + len(new) + 1
                new[key] = dump_span(span, seq)
            for aid, new in rows.items():
                self._spans.setdefault(aid, {}).update(new)
                self._span_attempt.update(dict.fromkeys(new, aid))
            return sum(len(new) for new in rows.values())

    async def _select_spans(self, query: SpanQuery) -> list[Span]:
        async with self._lock:
            if query.attempt_id is not None:
                inside = query.rollout_id is None or query.attempt_id in self._attempts_of.get(query.rollout_id, [])
                attempts = [query.attempt_id] if inside else []
            elif query.rollout_id is not None:
                attempts = self._attempts_of.get(query.rollout_id, [])
            else:
                attempts = list(self._attempts)  # creation order, as the SQL stores order them
            texts = [text for aid in attempts for text in self._spans.get(aid, {}).values()]
            page = slice(query.offset, query.offset + query.limit)
            if query.name is None:
                return [Span.model_validate_json(text) for text in texts[page]]
            return [span for span in map(Span.model_validate_json, texts) if span.name == query.name][page]

    async def _insert_resources(self, make: Callable[[int], Resources]) -> Resources:
        async with self._lock:
            res = make(len(self._resources) + 1)
            self._resources.append(res)
            return res.model_copy(deep=True)

    async def _select_resources(self, version: int | None) -> tuple[Resources | None, int]:
        async with self._lock:
            latest = len(self._resources)
            index = latest if version is None else version
            found = self._resources[index - 1].model_copy(deep=True) if 1 <= index <= latest else None
            return found, latest

    async def _delete_ended(self, older_than: float) -> int:
        async with self._lock:
            doomed = [r.id for r in self._rollouts.values() if r.ended_at is not None and r.ended_at < older_than]
            for rid in doomed:
                del self._rollouts[rid]
                for aid in self._attempts_of.pop(rid, []):
                    self._attempts.pop(aid, None)
                    for key in self._spans.pop(aid, {}):
                        del self._span_attempt[key]
            return len(doomed)

    async def _count(self) -> StoreStats:
        async with self._lock:
            self._expire_locked(now())
            return StoreStats(
                rollouts_by_status=dict(Counter(r.status.value for r in self._rollouts.values())),
                attempts_by_status=dict(Counter(a.status.value for a in self._attempts.values())),
                spans=len(self._span_attempt),
                resources_versions=len(self._resources),
            )

    async def close(self) -> None:
        return None

    # --- internals (lock held) --------------------------------------------------------------
    def _rollout_of(self, attempt_id: str) -> str:
        attempt = self._attempts.get(attempt_id)
        return "" if attempt is None else attempt.rollout_id

    def _change(self, rollout: Rollout, attempt: A, change: Callable[[Rollout, A], object]) -> None:
        """Apply a change and keep the queue and the running set in step with the statuses."""
        before = rollout.status
        change(rollout, attempt)
        if attempt is not None and attempt.status is not AttemptStatus.RUNNING:
            self._running.discard(attempt.id)
        if rollout.status is not before and rollout.status in rules.WAITING:  # requeued: back in the queue
            heapq.heappush(self._waiting, (rollout.seq, rollout.id))
        if rollout.status is not before and rollout.ended_at is not None:  # ended (only an end sets ended_at)
            self._rollouts_ended()

    def _expire_locked(self, t: float) -> int:
        expired = [
            a for a in (self._attempts[aid] for aid in self._running) if a.deadline is not None and a.deadline <= t
        ]
        for attempt in expired:
            rollout = self._rollouts[attempt.rollout_id]
            self._change(rollout, attempt, lambda r, a: rules.expire(r, a, t, now()))
        return len(expired)
