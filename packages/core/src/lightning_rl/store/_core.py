"""The public store API, written once over a small set of storage primitives.

Every backend (memory, SQLite, PostgreSQL, Redis) subclasses ``StoreCore``. The public methods of
``LightningStore`` live here and only here: argument checks, paging, the translation of filters into
a backend-neutral ``RolloutQuery`` / ``SpanQuery``, the order and de-duplication of results, and
``wait_for_rollouts``. A backend implements the primitives below: how it loads and saves rows under
its lock or transaction, selects with a query description, and claims atomically. *What* a claim,
finish, cancel or expiry does is decided by the pure functions in ``store._rules``, which the
primitives call, so no backend can decide differently.

Why primitives and not a full API per backend: a change to an argument check or to paging used to
mean four edits, and a reader could not tell which differences between backends were deliberate.
Now the only code in a backend is code about its storage.
"""

from __future__ import annotations

import asyncio
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lightning_rl.store import _rules as rules
from lightning_rl.store.base import now
from lightning_rl.types import (
    TERMINAL_ROLLOUT,
    Attempt,
    AttemptStatus,
    Claim,
    LLMResource,
    Resources,
    Rollout,
    RolloutRequest,
    RolloutStatus,
    Span,
    StoreStats,
)

__all__ = ["StoreCore", "RolloutQuery", "SpanQuery", "AttemptChange", "RolloutChange"]

AttemptChange = Callable[[Rollout, Attempt], None]
"""Changes a rollout and its attempt in place (loaded and locked by the backend, which saves both)."""

RolloutChange = Callable[[Rollout, "Attempt | None"], bool]
"""Changes a rollout and its running attempt (if any) in place; returns whether anything changed."""


@dataclass(frozen=True)
class RolloutQuery:
    """Which rollouts to select: every field that is not None must match. Results are in ``seq``
    (enqueue) order, ``offset`` rows skipped, at most ``limit`` returned."""

    ids: tuple[str, ...] | None = None
    statuses: tuple[RolloutStatus, ...] | None = None
    group_id: str | None = None
    mode: str | None = None
    limit: int = 1000
    offset: int = 0

    def matches(self, r: Rollout) -> bool:
        """Whether ``r`` passes the filters (for backends that filter in Python)."""
        return (
            (self.ids is None or r.id in self.ids)
            and (self.statuses is None or r.status in self.statuses)
            and (self.group_id is None or r.group_id == self.group_id)
            and (self.mode is None or r.mode == self.mode)
        )


@dataclass(frozen=True)
class SpanQuery:
    """Which spans to select: every field that is not None must match. Results are in attempt
    creation order, then ``seq`` within each attempt; ``offset`` skipped, at most ``limit``."""

    rollout_id: str | None = None
    attempt_id: str | None = None
    name: str | None = None
    limit: int = 10_000
    offset: int = 0


class StoreCore(ABC):
    """``LightningStore`` written once (its methods are documented there); subclasses implement the
    storage primitives (``_``-prefixed, abstract). Every primitive runs atomically (under the
    backend's lock or in one transaction), and every one that reads rollouts or attempts (claim,
    update, select, count) first times out overdue attempts (``rules.expire``), as the protocol
    promises. Primitives get checked arguments and may return shared models: the public methods
    copy where one model could be returned twice. ``wait_for_rollouts`` wakes at once when
    ``_rollouts_ended`` is called and otherwise re-reads every ``_poll_s``."""

    _poll_s: float = 0.05
    """How often ``wait_for_rollouts`` re-reads for changes made by other processes."""

    def __init__(self) -> None:
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        self._waiters_lock = threading.Lock()

    # --- primitives -------------------------------------------------------------------------
    @abstractmethod
    async def _insert_rollouts(self, requests: list[RolloutRequest]) -> list[Rollout]:
        """Insert new rollouts (``rules.plan_enqueue`` decides), one per request, in request order;
        a re-sent id returns the stored rollout. All or nothing: a ``ConflictError`` changes nothing."""

    @abstractmethod
    async def _claim(self, worker_id: str, n: int, timeout_s: float | None) -> list[Claim]:
        """Atomically take up to ``n`` waiting rollouts, oldest first, and open an attempt on each
        (``rules.open_attempt``); two callers never take the same rollout."""

    @abstractmethod
    async def _update_attempt(self, attempt_id: str, change: AttemptChange) -> tuple[Rollout, Attempt]:
        """Load an attempt and its rollout (``NotFoundError`` if absent), apply ``change``, save both."""

    @abstractmethod
    async def _update_rollouts(self, ids: list[str], change: RolloutChange) -> list[Rollout]:
        """Load rollouts (``NotFoundError`` for the first unknown id, changing nothing) with their
        running attempt, apply ``change`` to each, save the changed ones; return them in ``ids`` order."""

    @abstractmethod
    async def _expire(self, t: float) -> int:
        """End every running attempt whose deadline is ``<= t`` with ``rules.expire``; how many."""

    @abstractmethod
    async def _select_rollouts(self, query: RolloutQuery) -> list[Rollout]:
        """Rollouts matching ``query`` (see ``RolloutQuery``)."""

    @abstractmethod
    async def _get_attempt(self, attempt_id: str) -> Attempt | None:
        """One attempt, or None."""

    @abstractmethod
    async def _select_attempts(self, rollout_id: str) -> list[Attempt] | None:
        """A rollout's attempts, first first; None if the rollout does not exist."""

    @abstractmethod
    async def _insert_spans(self, spans: list[Span]) -> int:
        """Store new spans (idempotent on ``(trace_id, span_id)``, ``seq`` per attempt in arrival order)
        after ``rules.check_span_targets``; all or nothing. Returns how many were new."""

    @abstractmethod
    async def _select_spans(self, query: SpanQuery) -> list[Span]:
        """Spans matching ``query`` (see ``SpanQuery``)."""

    @abstractmethod
    async def _insert_resources(self, make: Callable[[int], Resources]) -> Resources:
        """Store ``make(latest version + 1)`` atomically (two publishers never get one version)."""

    @abstractmethod
    async def _select_resources(self, version: int | None) -> tuple[Resources | None, int]:
        """A version (the latest when None), or None if absent; with the latest version number."""

    @abstractmethod
    async def _delete_ended(self, older_than: float) -> int:
        """Delete rollouts (and their attempts and spans) that ended before ``older_than``."""

    @abstractmethod
    async def _count(self) -> StoreStats:
        """Counts by status, spans and resources versions."""

    @abstractmethod
    async def close(self) -> None:
        """Release connections and threads; calling it twice is fine."""

    def _rollouts_ended(self) -> None:
        """Backends call this after committing a change that ended a rollout: it wakes
        ``wait_for_rollouts`` at once (safe from any thread)."""
        with self._waiters_lock:
            waiters = list(self._waiters)
        for loop, event in waiters:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # that loop is closed; its waiter is gone
                pass

    # --- rollouts ---------------------------------------------------------------------------
    async def enqueue(self, requests: Sequence[RolloutRequest]) -> list[Rollout]:
        rules.check_batch("enqueue", len(requests))
        if not requests:
            return []
        return rules.unshared(await self._insert_rollouts([rules.normalised(r) for r in requests]))

    async def claim(self, worker_id: str, n: int = 1, *, timeout_s: float | None = None) -> list[Claim]:
        rules.check_claim_args(worker_id, n, timeout_s)
        return await self._claim(worker_id, n, timeout_s)

    async def heartbeat(self, attempt_id: str) -> Attempt:
        _, attempt = await self._update_attempt(attempt_id, lambda r, a: rules.beat(r, a, now()))
        return attempt

    async def finish_attempt(
        self,
        attempt_id: str,
        status: AttemptStatus,
        *,
        error: str | None = None,
        reward: float | None = None,
    ) -> Rollout:
        rules.check_finish(status, reward)

        def change(r: Rollout, a: Attempt) -> None:
            rules.end_attempt(r, a, status, None, error, reward, now())

        rollout, _ = await self._update_attempt(attempt_id, change)
        return rollout

    async def cancel(self, rollout_ids: Sequence[str]) -> list[Rollout]:
        rules.check_batch("cancel", len(rollout_ids))
        if not rollout_ids:
            return []
        t = now()
        return rules.unshared(await self._update_rollouts(list(rollout_ids), lambda r, a: rules.cancel(r, a, t)))

    async def get_rollout(self, rollout_id: str) -> Rollout:
        found = await self._select_rollouts(RolloutQuery(ids=(rollout_id,), limit=1))
        if not found:
            raise rules.rollout_not_found(rollout_id)
        return found[0]

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
        rules.check_page(limit, offset)
        query = RolloutQuery(
            ids=None if ids is None else tuple(dict.fromkeys(ids)),
            statuses=None if status is None else tuple(dict.fromkeys(status)),
            group_id=group_id,
            mode=mode,
            limit=limit,
            offset=offset,
        )
        if query.ids == () or query.statuses == ():
            return []
        return await self._select_rollouts(query)

    async def wait_for_rollouts(self, ids: Sequence[str], timeout_s: float) -> list[Rollout]:
        wanted = list(ids)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout_s, 0.0)
        changed = asyncio.Event()
        waiter = (loop, changed)
        with self._waiters_lock:
            self._waiters.add(waiter)
        try:
            while True:
                changed.clear()
                ended = await self._ended(wanted)
                remaining = deadline - loop.time()
                if len(ended) == len(wanted) or remaining <= 0:
                    return ended
                try:
                    await asyncio.wait_for(changed.wait(), timeout=min(remaining, self._poll_s))
                except TimeoutError:
                    pass
        finally:
            with self._waiters_lock:
                self._waiters.discard(waiter)

    async def _ended(self, ids: list[str]) -> list[Rollout]:
        unique = tuple(dict.fromkeys(ids))
        if not unique:
            return []
        query = RolloutQuery(ids=unique, statuses=tuple(TERMINAL_ROLLOUT), limit=len(unique))
        by_id = {r.id: r for r in await self._select_rollouts(query)}
        return rules.unshared([by_id[i] for i in ids if i in by_id])

    # --- attempts ---------------------------------------------------------------------------
    async def get_attempt(self, attempt_id: str) -> Attempt:
        attempt = await self._get_attempt(attempt_id)
        if attempt is None:
            raise rules.attempt_not_found(attempt_id)
        return attempt

    async def query_attempts(self, rollout_id: str) -> list[Attempt]:
        attempts = await self._select_attempts(rollout_id)
        if attempts is None:
            raise rules.rollout_not_found(rollout_id)
        return attempts

    # --- spans ------------------------------------------------------------------------------
    async def add_spans(self, spans: Sequence[Span]) -> int:
        rules.check_batch("add_spans", len(spans))
        if not spans:
            return 0
        return await self._insert_spans(list(spans))

    async def query_spans(
        self,
        *,
        rollout_id: str | None = None,
        attempt_id: str | None = None,
        name: str | None = None,
        limit: int = 10_000,
        offset: int = 0,
    ) -> list[Span]:
        rules.check_page(limit, offset)
        return await self._select_spans(SpanQuery(rollout_id, attempt_id, name, limit, offset))

    # --- resources --------------------------------------------------------------------------
    async def add_resources(
        self,
        *,
        llm: LLMResource | None = None,
        prompts: dict[str, str] | None = None,
        extra: dict[str, object] | None = None,
    ) -> Resources:

        def make(version: int) -> Resources:
            return Resources(version=version, llm=llm, prompts=prompts or {}, extra=extra or {})

        return await self._insert_resources(make)

    async def get_resources(self, version: int | None = None) -> Resources:
        found, latest = await self._select_resources(version)
        if found is None:
            raise rules.resources_not_found(version, latest)
        return found

    # --- housekeeping -----------------------------------------------------------------------
    async def expire(self, now: float | None = None) -> int:
        return await self._expire(time.time() if now is None else now)

    async def prune(self, older_than: float) -> int:
        return await self._delete_ended(older_than)

    async def stats(self) -> StoreStats:
        return await self._count()
