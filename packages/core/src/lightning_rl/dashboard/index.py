"""An in-memory index of a store's rollouts, so filtering and paging stay fast on 100k rollouts.

The store's query API filters by status, mode and group, in enqueue order; the dashboard also
filters by reward range, model version, role and text, and shows newest first. Asking the store for
all of that on every page would read every rollout each time, so the index keeps one small summary
per rollout and stays in step cheaply, through the public API only:

* new rollouts are appended: rollouts only ever arrive at the end of enqueue order, so one query
  from the last known position fetches them (if the store was pruned and positions shifted, the
  overlap row differs and the index reloads);
* with ``history_in_background`` (the web page), the first refresh reads only the newest
  ``HISTORY_CHUNK`` rollouts, so the first page is served at once even on 100k rollouts, and older
  ones are read backwards in small chunks in the background (``history_complete`` says when done;
  until then totals count only what was read). Without it (``inspect``), a refresh reads everything;
* rollouts that had not ended are re-read by id (ended rollouts never change again);
* what only spans tell (roles, model versions, number of calls and tool calls, the response text
  searched by ``q``) is read in the background, newest ended rollouts first. Until a rollout's spans
  are read, role and model-version filters do not match it; ``span_progress`` says how far it got.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from lightning_rl import semconv
from lightning_rl.errors import InvalidRequestError
from lightning_rl.store.base import MAX_PAGE, LightningStore
from lightning_rl.types import TERMINAL_ROLLOUT, Rollout, RolloutStatus, Span

__all__ = ["RolloutSummary", "RolloutFilter", "RolloutPage", "RolloutIndex", "MAX_LIMIT", "HISTORY_CHUNK"]

log = logging.getLogger(__name__)

MAX_LIMIT = 500
"""Most rows one page returns."""
HISTORY_CHUNK = 1_000
"""Rollouts read per query when the history loads in the background: small enough that parsing one
chunk keeps the event loop (and so the page requests between chunks) within the page budget."""
_TERMINAL = frozenset(s.value for s in TERMINAL_ROLLOUT)
_SEARCH_CHARS = 4_000
"""Characters of task input and response text kept per rollout for ``q`` (enough to find a word)."""


@dataclass(slots=True)
class RolloutSummary:
    """One row of the rollouts list."""

    seq: int
    id: str
    status: str
    mode: str
    group_id: str | None
    task_id: str | None
    reward: float | None
    resources_version: int | None
    attempt_count: int
    created_at: float
    ended_at: float | None
    error: str | None
    text: str
    """Lower-cased haystack for the ``q`` filter: id, task, group, error, then response text."""
    roles: tuple[str, ...] | None = None
    """None until the rollout's spans were read."""
    model_versions: tuple[int, ...] | None = None
    n_calls: int | None = None
    n_tool_calls: int | None = None

    @classmethod
    def of(cls, r: Rollout) -> RolloutSummary:
        task = json.dumps(r.task.input, ensure_ascii=False, default=str)[:_SEARCH_CHARS]
        text = " ".join(x for x in (r.id, r.task.id or "", r.group_id or "", task, r.error or "") if x)
        return cls(
            seq=r.seq,
            id=r.id,
            status=r.status.value,
            mode=r.mode,
            group_id=r.group_id,
            task_id=r.task.id,
            reward=r.final_reward,
            resources_version=r.resources_version,
            attempt_count=r.attempt_count,
            created_at=r.created_at,
            ended_at=r.ended_at,
            error=r.error,
            text=text.lower(),
        )

    def refresh(self, r: Rollout) -> None:
        """Take a re-read rollout's lifecycle fields (the task never changes)."""
        self.status = r.status.value
        self.attempt_count = r.attempt_count
        self.ended_at = r.ended_at
        self.error = r.error
        if r.final_reward is not None:
            self.reward = r.final_reward
        if r.error and r.error.lower() not in self.text:
            self.text += " " + r.error.lower()

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "id": self.id,
            "status": self.status,
            "mode": self.mode,
            "group_id": self.group_id,
            "task_id": self.task_id,
            "reward": self.reward,
            "resources_version": self.resources_version,
            "attempt_count": self.attempt_count,
            "created_at": self.created_at,
            "ended_at": self.ended_at,
            "error": self.error,
            "roles": list(self.roles) if self.roles is not None else None,
            "model_versions": list(self.model_versions) if self.model_versions is not None else None,
            "n_calls": self.n_calls,
            "n_tool_calls": self.n_tool_calls,
        }


@dataclass(frozen=True)
class RolloutFilter:
    """What the rollouts list shows; every given field must match."""

    status: frozenset[str] = frozenset()
    mode: str | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    model_version: int | None = None
    role: str | None = None
    q: str | None = None

    def __post_init__(self) -> None:
        bad = sorted(self.status - {s.value for s in RolloutStatus})
        if bad:
            raise InvalidRequestError(
                f"unknown status {', '.join(bad)}; use any of {', '.join(s.value for s in RolloutStatus)}."
            )
        if self.mode is not None and self.mode not in ("train", "val", "test"):
            raise InvalidRequestError(f"unknown mode {self.mode!r}; use train, val or test.")
        if self.reward_min is not None and self.reward_max is not None and self.reward_min > self.reward_max:
            raise InvalidRequestError(
                f"reward_min ({self.reward_min}) is above reward_max ({self.reward_max}); swap them."
            )

    def matches(self, row: RolloutSummary, q: str | None) -> bool:
        if self.status and row.status not in self.status:
            return False
        if self.mode is not None and row.mode != self.mode:
            return False
        if self.reward_min is not None and (row.reward is None or row.reward < self.reward_min):
            return False
        if self.reward_max is not None and (row.reward is None or row.reward > self.reward_max):
            return False
        if self.model_version is not None and (
            row.model_versions is None or self.model_version not in row.model_versions
        ):
            return False
        if self.role is not None and (row.roles is None or self.role not in row.roles):
            return False
        return q is None or q in row.text


@dataclass
class RolloutPage:
    """One page of the filtered list, newest first."""

    rows: list[RolloutSummary]
    total: int
    """Rollouts matching the filter (all pages)."""
    offset: int
    limit: int
    indexed: int
    """Rollouts whose spans are read (role / model-version / response-text filters see only these)."""
    known: int
    """Rollouts in the index."""
    took_ms: float = 0.0
    history_complete: bool = True
    """False while older rollouts are still being read (``total`` then counts only those read)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "rows": [r.to_json() for r in self.rows],
            "total": self.total,
            "offset": self.offset,
            "limit": self.limit,
            "span_progress": {"indexed": self.indexed, "known": self.known},
            "history_complete": self.history_complete,
            "took_ms": self.took_ms,
        }


@dataclass
class RolloutIndex:
    """Rollout summaries of one store, kept in step on demand (see the module docstring)."""

    store: LightningStore
    min_refresh_s: float = 1.0
    """Refresh at most this often; pages in between are served from memory."""
    history_in_background: bool = False
    """Read only the newest rollouts on the first refresh and the older ones in a background task
    (started by ``start_span_indexing``); see the module docstring."""
    rows: list[RolloutSummary] = field(default_factory=list[RolloutSummary])
    _by_id: dict[str, RolloutSummary] = field(default_factory=dict[str, RolloutSummary])
    _open: dict[str, RolloutSummary] = field(default_factory=dict[str, RolloutSummary])
    _unindexed: dict[str, RolloutSummary] = field(default_factory=dict[str, RolloutSummary])
    _unindexed_history: deque[RolloutSummary] = field(default_factory=deque[RolloutSummary])
    """Ended rollouts from the background history read, newest first (spans read after ``_unindexed``)."""
    _base: int = 0
    """Store position (enqueue order) of ``rows[0]``: above 0 while older rollouts are still unread."""
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _refreshed_at: float = 0.0
    _span_task: asyncio.Task[None] | None = None
    _history_task: asyncio.Task[None] | None = None
    _new_work: asyncio.Event = field(default_factory=asyncio.Event)
    _reading: int = 0
    """Rollouts whose spans are being read now: out of the queues but not yet summarised."""

    # --- keeping in step -------------------------------------------------------------------
    async def refresh(self, *, force: bool = False) -> None:
        """Fetch new rollouts and re-read those that had not ended (throttled by ``min_refresh_s``)."""
        if not force and time.monotonic() - self._refreshed_at < self.min_refresh_s:
            return
        async with self._lock:
            if not force and time.monotonic() - self._refreshed_at < self.min_refresh_s:
                return
            await self._append_new()
            await self._reread_open()
            self._refreshed_at = time.monotonic()
        if self._unindexed:
            self._new_work.set()

    @property
    def history_complete(self) -> bool:
        """Whether every rollout older than the first one read is in the index too."""
        return self._base == 0

    async def _append_new(self) -> None:
        while True:
            if not self.rows and self.history_in_background:
                total = sum((await self.store.stats()).rollouts_by_status.values())
                self._base = max(total - HISTORY_CHUNK, 0)
            start = self._base + max(len(self.rows) - 1, 0)
            page = await self.store.query_rollouts(limit=MAX_PAGE, offset=start)
            if self.rows:
                if not page or page[0].id != self.rows[-1].id:
                    self._reset()
                    continue
                page = page[1:]
            for rollout in page:
                self._add(rollout)
            if len(page) < MAX_PAGE - (1 if start else 0):
                return

    async def _load_history(self) -> None:
        """Read the rollouts before ``rows[0]``, newest chunk first, until the store's first one."""
        while True:
            async with self._lock:
                if self._base == 0 or not self.rows:
                    return
                lo = max(self._base - HISTORY_CHUNK, 0)
                # one row of overlap (rows[0]) proves the positions did not shift meanwhile
                page = await self.store.query_rollouts(limit=self._base - lo + 1, offset=lo)
                if not page or page[-1].id != self.rows[0].id:
                    self._reset()  # the next refresh reloads from the newest end
                    self._refreshed_at = 0.0
                    return
                older = [RolloutSummary.of(r) for r in page[:-1] if r.id not in self._by_id]
                self.rows[0:0] = older
                for row in reversed(older):
                    self._register(row, history=True)
                self._base = lo
            self._new_work.set()
            await asyncio.sleep(0)  # page requests go first between chunks

    def _reset(self) -> None:
        log.info("store positions shifted (pruned?); reloading the rollout index")
        self.rows.clear()
        self._by_id.clear()
        self._open.clear()
        self._unindexed.clear()
        self._unindexed_history.clear()
        self._base = 0

    def _add(self, rollout: Rollout) -> None:
        if rollout.id in self._by_id:
            return
        row = RolloutSummary.of(rollout)
        self.rows.append(row)
        self._register(row, history=False)

    def _register(self, row: RolloutSummary, *, history: bool) -> None:
        self._by_id[row.id] = row
        if row.status not in _TERMINAL:
            self._open[row.id] = row
        elif history:
            self._unindexed_history.append(row)
        else:
            self._unindexed[row.id] = row

    async def _reread_open(self) -> None:
        ids = list(self._open)
        for i in range(0, len(ids), MAX_PAGE):
            chunk = ids[i : i + MAX_PAGE]
            for rollout in await self.store.query_rollouts(ids=chunk, limit=len(chunk)):
                row = self._open.get(rollout.id)
                if row is None:
                    continue
                row.refresh(rollout)
                if row.status in _TERMINAL:
                    del self._open[row.id]
                    self._unindexed[row.id] = row

    # --- spans, in the background ----------------------------------------------------------
    def start_span_indexing(self) -> None:
        """Read ended rollouts' spans (newest first) and, with ``history_in_background``, the older
        rollouts, in background tasks until ``close``."""
        if self._span_task is None:
            self._span_task = asyncio.create_task(self._index_spans_forever())
        if self.history_in_background and self._history_task is None:
            self._history_task = asyncio.create_task(self._load_history_forever())

    async def _load_history_forever(self) -> None:
        while True:
            try:
                await self._load_history()
            except asyncio.CancelledError:
                raise
            except Exception:  # a store hiccup must not stop the index; retried below
                log.warning("could not read older rollouts; will retry", exc_info=True)
            await asyncio.sleep(self.min_refresh_s)  # after a reset, the next refresh sets a new base

    def _next_unindexed(self) -> RolloutSummary | None:
        if self._unindexed:
            return self._unindexed.pop(next(reversed(self._unindexed)))  # newest ended first
        if self._unindexed_history:
            return self._unindexed_history.popleft()
        return None

    async def _index_spans_forever(self) -> None:
        while True:
            await self._new_work.wait()
            self._new_work.clear()
            while (row := self._next_unindexed()) is not None:
                self._reading += 1  # not ``indexed`` until its spans are in the summary
                try:
                    await self.index_spans(row)
                except asyncio.CancelledError:
                    raise
                except Exception:  # a store hiccup must not stop the index; the row is retried later
                    log.warning("could not read spans of rollout %s; will retry", row.id, exc_info=True)
                    self._unindexed[row.id] = row
                    await asyncio.sleep(1.0)
                finally:
                    self._reading -= 1
                await asyncio.sleep(0)  # let page requests in between rollouts

    async def index_spans(self, row: RolloutSummary) -> None:
        """Read one rollout's spans into its summary."""
        spans = await self.store.query_spans(rollout_id=row.id)
        summarise_spans(row, spans)

    async def close(self) -> None:
        for task in (self._span_task, self._history_task):
            if task is not None:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        self._span_task = self._history_task = None

    # --- reading ---------------------------------------------------------------------------
    def get(self, rollout_id: str) -> RolloutSummary | None:
        return self._by_id.get(rollout_id)

    @property
    def indexed(self) -> int:
        pending = len(self._unindexed) + len(self._unindexed_history) + len(self._open) + self._reading
        return max(len(self.rows) - pending, 0)  # a reset during a read empties rows before the read ends

    async def page(self, flt: RolloutFilter, *, limit: int = 50, offset: int = 0) -> RolloutPage:
        """One page of the rollouts matching ``flt``, newest first."""
        if not 0 < limit <= MAX_LIMIT:
            raise InvalidRequestError(f"limit must be between 1 and {MAX_LIMIT}, got {limit}.")
        if offset < 0:
            raise InvalidRequestError(f"offset must be >= 0, got {offset}.")
        started = time.perf_counter()
        await self.refresh()
        q = flt.q.strip().lower() or None if flt.q else None
        total = 0
        out: list[RolloutSummary] = []
        for row in reversed(self.rows):
            if flt.matches(row, q):
                if offset <= total < offset + limit:
                    out.append(row)
                total += 1
        took = (time.perf_counter() - started) * 1e3
        return RolloutPage(out, total, offset, limit, self.indexed, len(self.rows), took, self.history_complete)

    def since(self, seq: int) -> list[RolloutSummary]:
        """Rows enqueued after ``seq`` (for ``tail``)."""
        return [r for r in self.rows if r.seq > seq]


def summarise_spans(row: RolloutSummary, spans: Sequence[Span]) -> None:
    """Fill the span-derived fields of ``row`` from the rollout's spans (every attempt)."""
    roles: set[str] = set()
    versions: set[int] = set()
    n_calls = n_tools = 0
    texts: list[str] = []
    reward: float | None = None
    reward_key: tuple[int, int] = (-1, -1)
    for span in spans:
        attrs = span.attributes
        role = attrs.get(semconv.ROLE)
        if role:
            roles.add(str(role))
        if span.name == semconv.SPAN_LLM_CALL:
            n_calls += 1
            version = attrs.get(semconv.MODEL_VERSION)
            if isinstance(version, int):
                versions.add(version)
            raw = attrs.get(semconv.TOOL_CALLS)
            try:
                calls: Any = json.loads(raw) if isinstance(raw, str) else raw
            except ValueError:
                calls = None
            if isinstance(calls, list):
                n_tools += len(cast(list[Any], calls))
            text = attrs.get(semconv.RESPONSE_TEXT)
            if isinstance(text, str):
                texts.append(text)
        elif span.name == semconv.SPAN_REWARD and semconv.REWARD_VALUE in attrs:
            key = (span.start_ns, span.seq)
            if key > reward_key:
                reward_key, reward = key, float(attrs[semconv.REWARD_VALUE])
    row.roles = tuple(sorted(roles))
    row.model_versions = tuple(sorted(versions))
    row.n_calls = n_calls
    row.n_tool_calls = n_tools
    if row.reward is None and reward is not None:
        row.reward = reward  # as the adapter's final_reward: the last emitted reward
    if texts:
        row.text += " " + " ".join(texts)[:_SEARCH_CHARS].lower()
