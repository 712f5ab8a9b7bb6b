"""Write spans to a store in the background, in batches, without ever blocking the caller.

The gateway records one span per LLM call and tracing records many more; neither may slow down or
fail the agent because the store is slow, restarting or unreachable. ``SpanWriter.submit`` only
appends to an in-memory queue; a background task drains it in batches (one ``add_spans`` call per
batch) and retries a failed batch with exponential backoff until the store acknowledges it.

Memory is bounded: when the queue is full the *oldest* queued spans are dropped and counted
(``dropped``), so a store that stays down for hours costs a fixed amount of memory and an
operator can see the loss at ``/metrics``. Spans the store rejects for good (an attempt it does not
know, a malformed span: ``NotFoundError`` and other 4xx errors) are isolated from the rest of their
batch, dropped and counted separately (``rejected``): retrying them would never succeed.

``submit`` may be called from any thread (an OpenTelemetry span processor runs in the exporting
thread); the writer itself runs on the event loop it was started on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from lightning_rl.errors import StoreUnavailableError, UnauthorizedError
from lightning_rl.store.base import MAX_BATCH, LightningStore
from lightning_rl.types import Span

__all__ = ["SpanWriter", "WriterStats"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WriterStats:
    """A snapshot of a writer's counters."""

    written: int
    """Spans the store acknowledged (including ones it already had: writes are idempotent)."""
    pending: int
    """Spans queued or in flight, not yet acknowledged."""
    dropped: int
    """Spans discarded because the queue was full (the store was too slow or down for too long)."""
    rejected: int
    """Spans the store refused for good (unknown attempt, invalid span); never retried."""
    retries: int
    """Failed batch writes that were retried."""
    batches: int
    """Successful ``add_spans`` calls."""


def _is_permanent(exc: BaseException) -> bool:
    """Whether the store refused the spans themselves (retrying cannot help)."""
    if isinstance(exc, StoreUnavailableError | UnauthorizedError):
        return False  # the store is down or misconfigured: retry until an operator fixes it
    # NotFoundError is a LookupError; InvalidRequestError / ConflictError / pydantic errors are ValueErrors.
    return isinstance(exc, LookupError | ValueError | TypeError)


class SpanWriter:
    """Batches spans to a ``LightningStore`` off the request path.

    Args:
        store: Any store backend (memory, SQLite, PostgreSQL, HTTP client).
        max_batch: Most spans sent in one ``add_spans`` call.
        flush_interval_s: How long a partial batch waits for company before it is sent (zero: one
            event-loop step, for the spans of the other calls completing in the same step).
        max_queue: Most spans held in memory; beyond it the oldest are dropped and counted.
        initial_backoff_s: First retry delay after a failed write; doubles up to ``max_backoff_s``.
        max_backoff_s: Longest delay between retries of a failing store.
    """

    def __init__(
        self,
        store: LightningStore,
        *,
        max_batch: int = 512,
        flush_interval_s: float = 0.05,
        max_queue: int = 100_000,
        initial_backoff_s: float = 0.05,
        max_backoff_s: float = 5.0,
    ) -> None:
        if not 1 <= max_batch <= MAX_BATCH:
            raise ValueError(f"max_batch must be between 1 and {MAX_BATCH}, got {max_batch}.")
        if max_queue < 1:
            raise ValueError(f"max_queue must be at least 1, got {max_queue}.")
        if flush_interval_s < 0 or initial_backoff_s <= 0 or max_backoff_s < initial_backoff_s:
            raise ValueError("flush_interval_s must be >= 0 and 0 < initial_backoff_s <= max_backoff_s.")
        self.store = store
        self.max_batch = max_batch
        self.flush_interval_s = flush_interval_s
        self.max_queue = max_queue
        self.initial_backoff_s = initial_backoff_s
        self.max_backoff_s = max_backoff_s
        self._queue: deque[Span] = deque()
        self._lock = threading.Lock()  # guards the queue and counters against submitters in other threads
        self._in_flight = 0
        self._written = 0
        self._dropped = 0
        self._rejected = 0
        self._retries = 0
        self._batches = 0
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._closed = False
        self._flush_now = False

    # --- counters ---------------------------------------------------------------------------
    @property
    def written(self) -> int:
        return self._written

    @property
    def dropped(self) -> int:
        return self._dropped

    @property
    def rejected(self) -> int:
        return self._rejected

    @property
    def retries(self) -> int:
        return self._retries

    @property
    def pending(self) -> int:
        return len(self._queue) + self._in_flight

    def stats(self) -> WriterStats:
        return WriterStats(
            written=self._written,
            pending=self.pending,
            dropped=self._dropped,
            rejected=self._rejected,
            retries=self._retries,
            batches=self._batches,
        )

    # --- producer side ----------------------------------------------------------------------
    def start(self) -> None:
        """Start the background task on the running event loop (``submit`` does this lazily)."""
        if self._task is not None:
            return
        if self._closed:
            raise RuntimeError("this SpanWriter is closed; create a new one.")
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._task = self._loop.create_task(self._run(), name="lightning-span-writer")

    def submit(self, span: Span) -> None:
        """Queue one span; never blocks, never raises because of the store."""
        self.submit_many((span,))

    def submit_many(self, spans: Iterable[Span]) -> None:
        """Queue spans; when the queue is full the oldest queued spans are dropped and counted."""
        if self._closed:
            n = sum(1 for _ in spans)
            self._dropped += n
            _log.warning("SpanWriter is closed: dropped %d span(s).", n)
            return
        with self._lock:
            queue = self._queue
            for span in spans:
                if len(queue) >= self.max_queue:
                    queue.popleft()
                    self._dropped += 1
                queue.append(span)
        self._signal()

    def _signal(self) -> None:
        if self._task is None:
            try:
                self.start()
            except RuntimeError:
                return  # no running loop in this thread: the first start() on a loop picks the queue up
        if threading.get_ident() == self._loop_thread:
            self._wake_up()
        elif self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nothing will drain anyway
                self._loop.call_soon_threadsafe(self._wake_up)

    def _wake_up(self) -> None:
        self._idle.clear()
        self._wake.set()

    # --- draining ---------------------------------------------------------------------------
    async def flush(self, timeout: float | None = None) -> bool:
        """Send everything queued now; return whether it was all acknowledged within ``timeout``."""
        if self._task is None:
            if not self._queue:
                return True
            self.start()
        self._flush_now = True
        self._wake.set()
        try:
            await asyncio.wait_for(self._wait_idle(), timeout)
        except TimeoutError:
            return False
        return True

    async def _wait_idle(self) -> None:
        while self.pending:
            self._wake_up()
            await self._idle.wait()

    async def close(self, timeout: float | None = 5.0) -> bool:
        """Flush (up to ``timeout``) and stop; returns whether nothing was left behind."""
        if self._closed:
            return self.pending == 0
        flushed = await self.flush(timeout)
        self._closed = True
        left = self.pending
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if left:
            self._dropped += left
            self._queue.clear()
            _log.warning("SpanWriter closed with %d span(s) not acknowledged by the store; dropped.", left)
        return flushed

    async def _run(self) -> None:
        while True:
            if not self._queue:
                self._idle.set()
                self._flush_now = False
                self._wake.clear()
                await self._wake.wait()
                continue
            if len(self._queue) < self.max_batch and not self._flush_now:
                await asyncio.sleep(self.flush_interval_s)  # let a partial batch fill up a little
            with self._lock:
                n = min(self.max_batch, len(self._queue))
                batch = [self._queue.popleft() for _ in range(n)]
                self._in_flight = n
            try:
                await self._write_until_acknowledged(batch)
            finally:
                self._in_flight = 0

    async def _write_until_acknowledged(self, batch: list[Span]) -> None:
        delay = self.initial_backoff_s
        while True:
            try:
                await self.store.add_spans(batch)
            except asyncio.CancelledError:
                self._requeue(batch)
                raise
            except Exception as exc:
                error = exc
            else:
                self._written += len(batch)
                self._batches += 1
                return
            if _is_permanent(error):
                await self._write_isolating_rejects(batch, error)
                return
            self._retries += 1
            _log.warning("span store write failed (%s); retrying %d span(s) in %.2f s", error, len(batch), delay)
            try:
                await asyncio.sleep(delay)
            except asyncio.CancelledError:
                self._requeue(batch)
                raise
            delay = min(delay * 2, self.max_backoff_s)

    def _requeue(self, batch: list[Span]) -> None:
        with self._lock:
            self._queue.extendleft(reversed(batch))  # keep them for a later flush, or count them on close

    async def _write_isolating_rejects(self, batch: list[Span], error: Exception) -> None:
        """A batch was refused: resend it per attempt, then span by span, so one bad span costs only itself."""
        groups: dict[tuple[str, str], list[Span]] = {}
        for span in batch:
            groups.setdefault((span.rollout_id, span.attempt_id), []).append(span)
        if len(groups) > 1:
            parts = list(groups.values())
        elif len(batch) > 1 and not isinstance(error, LookupError):
            parts = [[s] for s in batch]  # one attempt, but some span is invalid: find which
        else:  # the attempt is unknown (every span of it would fail) or a single span was refused
            self._rejected += len(batch)
            _log.warning(
                "span store refused %d span(s) of rollout %s attempt %s for good (%s); dropped them.",
                len(batch),
                batch[0].rollout_id,
                batch[0].attempt_id,
                error,
            )
            return
        for part in parts:
            await self._write_until_acknowledged(part)
