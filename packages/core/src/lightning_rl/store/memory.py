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
from collections.abc import Sequence

from lightning_rl.errors import ConflictError, InvalidRequestError, NotFoundError
from lightning_rl.store._spanjson import dump_span
from lightning_rl.store.base import (
    attempt_deadline,
    attempt_outcome,
    attempt_timeout,
    check_batch,
    check_page,
    check_reward,
    expiry_reason,
    same_request,
    set_rollout_status,
)
from lightning_rl.store.base import now as wall_clock
from lightning_rl.types import (
    TERMINAL_ROLLOUT,
    Attempt,
    AttemptStatus,
    Claim,
    LLMResource,
    Resources,
    RetryReason,
    Rollout,
    RolloutConfig,
    RolloutRequest,
    RolloutStatus,
    Span,
    StoreStats,
    check_attempt_transition,
    check_rollout_transition,
    new_id,
)

__all__ = ["MemoryStore"]

_SPANS_PER_SLICE = 64
"""Spans serialised between two yields to the event loop: a gateway's writer hands over batches of
hundreds of spans, and serialising one in a single go stalled every request in flight for ~10 ms.
The lock stays held across the yields and nothing changes until the whole batch is serialised, so
readers see a batch all or nothing, and a cancelled call changes nothing."""


def _span_key(span: Span) -> str:
    """``(trace_id, span_id)`` as one string (length-prefixed: no separator can be ambiguous)."""
    return f"{len(span.trace_id)}:{span.trace_id}{span.span_id}"


class MemoryStore:
    """A non-durable store for tests and single-process runs."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._changed = asyncio.Condition(self._lock)
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

    # --- rollouts ---------------------------------------------------------------------------
    async def enqueue(self, requests: Sequence[RolloutRequest]) -> list[Rollout]:
        check_batch("enqueue", len(requests))
        async with self._lock:
            for req in requests:  # all-or-nothing: reject the batch before changing anything
                stored = self._rollouts.get(req.id)
                if stored is not None and not same_request(stored, req):
                    raise ConflictError(
                        f"rollout id {req.id} already exists with a different task or config; "
                        "use a new id for a new rollout."
                    )
            out: list[Rollout] = []
            for req in requests:
                stored = self._rollouts.get(req.id)
                if stored is None:
                    self._seq += 1
                    t = wall_clock()
                    stored = Rollout(**req.model_dump(), seq=self._seq, created_at=t, updated_at=t)
                    self._rollouts[req.id] = stored
                    heapq.heappush(self._waiting, (stored.seq, stored.id))
                out.append(stored.model_copy(deep=True))
            self._changed.notify_all()
            return out

    async def claim(self, worker_id: str, n: int = 1, *, timeout_s: float | None = None) -> list[Claim]:
        if n < 1:
            raise InvalidRequestError(f"claim n must be >= 1, got {n}.")
        check_batch("claim", n)
        if not worker_id:
            raise InvalidRequestError("worker_id must be a non-empty string.")
        attempt_timeout(RolloutConfig(), timeout_s)  # refuse a bad timeout before claiming anything
        async with self._lock:
            self._expire_locked(wall_clock())
            waiting: list[Rollout] = []
            while self._waiting and len(waiting) < n:
                _, rid = heapq.heappop(self._waiting)
                rollout = self._rollouts.get(rid)
                if rollout is not None and rollout.status in (RolloutStatus.QUEUED, RolloutStatus.REQUEUED):
                    waiting.append(rollout)
            claims: list[Claim] = []
            t = wall_clock()
            for rollout in waiting:
                check_rollout_transition(rollout.id, rollout.status, RolloutStatus.RUNNING)
                rollout.status = RolloutStatus.RUNNING
                rollout.attempt_count += 1
                rollout.updated_at = t
                timeout = attempt_timeout(rollout.config, timeout_s)
                attempt = Attempt(
                    id=new_id("at-"),
                    rollout_id=rollout.id,
                    number=rollout.attempt_count,
                    worker_id=worker_id,
                    started_at=t,
                    heartbeat_at=t,
                    deadline=attempt_deadline(rollout.config, t, t, timeout),
                    timeout_s=timeout,
                )
                self._attempts[attempt.id] = attempt
                self._running.add(attempt.id)
                self._attempts_of.setdefault(rollout.id, []).append(attempt.id)
                claims.append(Claim(rollout=rollout.model_copy(deep=True), attempt=attempt.model_copy()))
            return claims

    async def heartbeat(self, attempt_id: str) -> Attempt:
        async with self._lock:
            attempt = self._get_attempt(attempt_id)
            self._expire_locked(wall_clock())
            if attempt.status is not AttemptStatus.RUNNING:
                check_attempt_transition(attempt.id, attempt.status, AttemptStatus.RUNNING)
            t = wall_clock()
            attempt.heartbeat_at = t
            config = self._rollouts[attempt.rollout_id].config
            attempt.deadline = attempt_deadline(config, attempt.started_at, t, attempt.timeout_s)
            return attempt.model_copy()

    async def finish_attempt(
        self,
        attempt_id: str,
        status: AttemptStatus,
        *,
        error: str | None = None,
        reward: float | None = None,
    ) -> Rollout:
        if status not in (AttemptStatus.SUCCEEDED, AttemptStatus.FAILED, AttemptStatus.TIMED_OUT):
            raise InvalidRequestError(f"finish_attempt status must be succeeded, failed or timed_out, not {status}.")
        check_reward(reward)
        async with self._lock:
            attempt = self._get_attempt(attempt_id)
            self._expire_locked(wall_clock())
            self._end_attempt(attempt, status, None, error, reward)
            self._changed.notify_all()
            return self._rollouts[attempt.rollout_id].model_copy(deep=True)

    async def cancel(self, rollout_ids: Sequence[str]) -> list[Rollout]:
        check_batch("cancel", len(rollout_ids))
        async with self._lock:
            for rid in rollout_ids:  # all-or-nothing: unknown ids fail the batch before any change
                self._get_rollout(rid)
            out: list[Rollout] = []
            for rid in rollout_ids:
                rollout = self._get_rollout(rid)
                if rollout.status not in TERMINAL_ROLLOUT:
                    running = self._running_attempt(rid)
                    if running is not None:
                        self._end_attempt(running, AttemptStatus.CANCELLED, None, "cancelled", None)
                    else:
                        set_rollout_status(rollout, RolloutStatus.CANCELLED, "cancelled", wall_clock())
                out.append(rollout.model_copy(deep=True))
            self._changed.notify_all()
            return out

    async def get_rollout(self, rollout_id: str) -> Rollout:
        async with self._lock:
            self._expire_locked(wall_clock())
            return self._get_rollout(rollout_id).model_copy(deep=True)

    async def query_rollouts(
        self,
        *,
        ids: Sequence[str] | None = None,
        status: Sequence[RolloutStatus] | None = None,
        group_id: str | None = None,
        mode: str | None = None,
        limit: int = 1000,
        offset: int = 0,
    ) -> list[Rollout]:
        check_page(limit, offset)
        async with self._lock:
            self._expire_locked(wall_clock())
            idset = set(ids) if ids is not None else None
            stset = set(status) if status is not None else None
            rows = [
                r
                for r in sorted(self._rollouts.values(), key=lambda r: r.seq)
                if (idset is None or r.id in idset)
                and (stset is None or r.status in stset)
                and (group_id is None or r.group_id == group_id)
                and (mode is None or r.mode == mode)
            ]
            return [r.model_copy(deep=True) for r in rows[offset : offset + limit]]

    async def wait_for_rollouts(self, ids: Sequence[str], timeout_s: float) -> list[Rollout]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout_s, 0.0)
        async with self._lock:
            while True:
                self._expire_locked(wall_clock())
                known = (self._rollouts[i] for i in ids if i in self._rollouts)
                ended = [r for r in known if r.status in TERMINAL_ROLLOUT]
                remaining = deadline - loop.time()
                if len(ended) == len(ids) or remaining <= 0:
                    return [r.model_copy(deep=True) for r in ended]
                # Wake at least every 0.5 s so store-enforced timeouts are noticed without traffic.
                try:
                    await asyncio.wait_for(self._changed.wait(), timeout=min(remaining, 0.5))
                except TimeoutError:
                    pass

    # --- attempts ---------------------------------------------------------------------------
    async def get_attempt(self, attempt_id: str) -> Attempt:
        async with self._lock:
            self._expire_locked(wall_clock())
            return self._get_attempt(attempt_id).model_copy()

    async def query_attempts(self, rollout_id: str) -> list[Attempt]:
        async with self._lock:
            self._expire_locked(wall_clock())
            self._get_rollout(rollout_id)
            return [self._attempts[a].model_copy() for a in self._attempts_of.get(rollout_id, [])]

    # --- spans ------------------------------------------------------------------------------
    async def add_spans(self, spans: Sequence[Span]) -> int:
        check_batch("add_spans", len(spans))
        async with self._lock:
            for span in spans:
                self._check_span_target(span)
            # Serialise first (yielding between slices), then change state in one synchronous step:
            # a caller cancelled mid-batch leaves the store exactly as it was.
            rows: dict[str, dict[str, str]] = {}  # attempt id -> {key: JSON} of this batch
            seen: set[str] = set()
            for i, span in enumerate(spans):
                if i and i % _SPANS_PER_SLICE == 0:
                    await asyncio.sleep(0)  # let the serving loop answer requests between slices
                key = _span_key(span)
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

    async def query_spans(
        self,
        *,
        rollout_id: str | None = None,
        attempt_id: str | None = None,
        name: str | None = None,
        limit: int = 10_000,
        offset: int = 0,
    ) -> list[Span]:
        check_page(limit, offset)
        async with self._lock:
            if attempt_id is not None:
                inside = rollout_id is None or attempt_id in self._attempts_of.get(rollout_id, [])
                attempts = [attempt_id] if inside else []
            elif rollout_id is not None:
                attempts = self._attempts_of.get(rollout_id, [])
            else:
                attempts = list(self._attempts)  # creation order, as the SQL stores order them
            texts = [text for aid in attempts for text in self._spans.get(aid, {}).values()]
            if name is None:
                return [Span.model_validate_json(text) for text in texts[offset : offset + limit]]
            named = [span for span in map(Span.model_validate_json, texts) if span.name == name]
            return named[offset : offset + limit]

    # --- resources --------------------------------------------------------------------------
    async def add_resources(
        self,
        *,
        llm: LLMResource | None = None,
        prompts: dict[str, str] | None = None,
        extra: dict[str, object] | None = None,
    ) -> Resources:
        async with self._lock:
            res = Resources(version=len(self._resources) + 1, llm=llm, prompts=prompts or {}, extra=extra or {})
            self._resources.append(res)
            return res.model_copy(deep=True)

    async def get_resources(self, version: int | None = None) -> Resources:
        async with self._lock:
            if not self._resources:
                raise NotFoundError("no resources published yet; call add_resources first.")
            if version is None:
                return self._resources[-1].model_copy(deep=True)
            if not 1 <= version <= len(self._resources):
                raise NotFoundError(f"resources version {version} does not exist (latest is {len(self._resources)}).")
            return self._resources[version - 1].model_copy(deep=True)

    # --- housekeeping -----------------------------------------------------------------------
    async def expire(self, now: float | None = None) -> int:
        async with self._lock:
            n = self._expire_locked(now if now is not None else wall_clock())
            if n:
                self._changed.notify_all()
            return n

    async def prune(self, older_than: float) -> int:
        async with self._lock:
            doomed = [
                r.id
                for r in self._rollouts.values()
                if r.status in TERMINAL_ROLLOUT and r.ended_at is not None and r.ended_at < older_than
            ]
            for rid in doomed:
                del self._rollouts[rid]
                for aid in self._attempts_of.pop(rid, []):
                    self._attempts.pop(aid, None)
                    for key in self._spans.pop(aid, {}):
                        del self._span_attempt[key]
            return len(doomed)

    async def stats(self) -> StoreStats:
        async with self._lock:
            self._expire_locked(wall_clock())
            rs: dict[str, int] = {}
            for r in self._rollouts.values():
                rs[r.status.value] = rs.get(r.status.value, 0) + 1
            ats: dict[str, int] = {}
            for a in self._attempts.values():
                ats[a.status.value] = ats.get(a.status.value, 0) + 1
            return StoreStats(
                rollouts_by_status=rs,
                attempts_by_status=ats,
                spans=len(self._span_attempt),
                resources_versions=len(self._resources),
            )

    async def close(self) -> None:
        return None

    # --- internals (lock held) --------------------------------------------------------------
    def _get_rollout(self, rollout_id: str) -> Rollout:
        try:
            return self._rollouts[rollout_id]
        except KeyError:
            raise NotFoundError(f"rollout {rollout_id} does not exist.") from None

    def _get_attempt(self, attempt_id: str) -> Attempt:
        try:
            return self._attempts[attempt_id]
        except KeyError:
            raise NotFoundError(f"attempt {attempt_id} does not exist.") from None

    def _running_attempt(self, rollout_id: str) -> Attempt | None:
        for aid in reversed(self._attempts_of.get(rollout_id, [])):
            if aid in self._running:
                return self._attempts[aid]
        return None

    def _check_span_target(self, span: Span) -> None:
        attempt = self._attempts.get(span.attempt_id)
        if attempt is None or attempt.rollout_id != span.rollout_id:
            raise NotFoundError(
                f"span {span.span_id} names attempt {span.attempt_id} of rollout {span.rollout_id}, "
                "which does not exist; spans must belong to a claimed attempt."
            )

    def _end_attempt(
        self,
        attempt: Attempt,
        status: AttemptStatus,
        reason: RetryReason | None,
        error: str | None,
        reward: float | None,
    ) -> None:
        check_attempt_transition(attempt.id, attempt.status, status)
        rollout = self._rollouts[attempt.rollout_id]
        outcome = attempt_outcome(rollout, status, reason, error)
        set_rollout_status(rollout, outcome.rollout_status, outcome.error, wall_clock())
        self._running.discard(attempt.id)
        if outcome.rollout_status is RolloutStatus.REQUEUED:
            heapq.heappush(self._waiting, (rollout.seq, rollout.id))
        attempt.status = status
        attempt.ended_at = wall_clock()
        attempt.error = error
        attempt.reward = reward
        attempt.deadline = None
        if status is AttemptStatus.SUCCEEDED:
            rollout.final_reward = reward

    def _expire_locked(self, t: float) -> int:
        expired = [
            a for a in (self._attempts[aid] for aid in self._running) if a.deadline is not None and a.deadline <= t
        ]
        for attempt in expired:
            reason, message = expiry_reason(self._rollouts[attempt.rollout_id].config, attempt, t)
            self._end_attempt(attempt, AttemptStatus.TIMED_OUT, reason, message, None)
        return len(expired)
