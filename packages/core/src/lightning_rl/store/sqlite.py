"""SQLite store: the embedded default, durable and safe with several processes on one file.

Why it looks like this:

* **One worker thread per store, one connection.** ``sqlite3`` blocks, so every operation runs on a
  dedicated thread and the event loop only awaits a future.
* **Group commit.** Operations queue up while the thread is busy; the thread then runs all of them
  in *one* ``BEGIN IMMEDIATE`` transaction, each inside its own ``SAVEPOINT`` (so one failing
  operation rolls back alone), and commits once. With ``synchronous=FULL`` that one fsync makes the
  whole group durable, and only then are the callers answered: an acknowledged write is on disk.
* **Several processes, one file.** WAL mode lets readers run beside the writer; ``BEGIN IMMEDIATE``
  takes the write lock before reading, so a claim's read-then-update is atomic across processes, and
  ``busy_timeout`` makes a process wait for the lock instead of failing.
* **What happens** when an attempt ends or expires is decided by ``store.base`` and ``store._sql``,
  exactly as in ``MemoryStore``. Expiry is an indexed query over running attempts' deadlines, so it
  is cheap to run before every claim and query.
* ``wait_for_rollouts`` wakes at once on changes made through this store and polls (``poll_s``) for
  changes made by other processes and for deadlines passing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from lightning_rl.errors import StoreUnavailableError
from lightning_rl.store import _sql as q
from lightning_rl.store.base import (
    DEFAULT_HEARTBEAT_TIMEOUT_S,
    attempt_deadline,
    check_batch,
    check_page,
    expiry_reason,
    now,
)
from lightning_rl.types import (
    TERMINAL_ROLLOUT,
    Attempt,
    AttemptStatus,
    Claim,
    LLMResource,
    Resources,
    Rollout,
    RolloutConfig,
    RolloutRequest,
    RolloutStatus,
    Span,
    StoreStats,
    check_attempt_transition,
)

__all__ = ["SQLiteStore"]

T = TypeVar("T")

SCHEMA_VERSION: Final = 1
_MAX_GROUP: Final = 256
"""Most operations committed together in one transaction."""

_WAITING_SQL = "('queued', 'requeued')"
_TERMINAL_SQL = "(" + ", ".join(f"'{s}'" for s in q.TERMINAL) + ")"
_R_COLS = ", ".join(q.ROLLOUT_COLUMNS)
_A_COLS = ", ".join(q.ATTEMPT_COLUMNS)
_A_COLS_A = ", ".join("a." + col for col in q.ATTEMPT_COLUMNS)
_R_COLS_R = ", ".join("r." + col for col in q.ROLLOUT_COLUMNS)
_IN_JSON = "(SELECT value FROM json_each(?))"
"""``column IN {_IN_JSON}`` with one JSON-array parameter: any number of values, one bound parameter."""

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS rollouts (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    task TEXT NOT NULL,
    group_id TEXT,
    mode TEXT NOT NULL,
    resources_version INTEGER,
    config TEXT NOT NULL,
    metadata TEXT NOT NULL,
    status TEXT NOT NULL,
    attempt_count INTEGER NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    ended_at REAL,
    final_reward REAL,
    error TEXT
);
CREATE INDEX IF NOT EXISTS rollouts_waiting ON rollouts (seq) WHERE status IN {_WAITING_SQL};
CREATE INDEX IF NOT EXISTS rollouts_group ON rollouts (group_id, seq);
CREATE INDEX IF NOT EXISTS rollouts_ended ON rollouts (ended_at) WHERE ended_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS attempts (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    rollout_id TEXT NOT NULL,
    number INTEGER NOT NULL,
    worker_id TEXT NOT NULL,
    status TEXT NOT NULL,
    started_at REAL NOT NULL,
    heartbeat_at REAL NOT NULL,
    ended_at REAL,
    deadline REAL,
    error TEXT,
    reward REAL,
    span_count INTEGER NOT NULL DEFAULT 0,
    timeout_s REAL,
    gateway_key TEXT
);
CREATE INDEX IF NOT EXISTS attempts_rollout ON attempts (rollout_id, number);
CREATE INDEX IF NOT EXISTS attempts_expiry ON attempts (deadline) WHERE status = 'running';
CREATE TABLE IF NOT EXISTS spans (
    trace_id TEXT NOT NULL,
    span_id TEXT NOT NULL,
    rollout_id TEXT NOT NULL,
    attempt_id TEXT NOT NULL,
    attempt_seq INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    name TEXT NOT NULL,
    data TEXT NOT NULL,
    UNIQUE (trace_id, span_id)
);
CREATE INDEX IF NOT EXISTS spans_rollout ON spans (rollout_id, attempt_seq, seq);
CREATE INDEX IF NOT EXISTS spans_attempt ON spans (attempt_id, seq);
CREATE TABLE IF NOT EXISTS resources (
    version INTEGER PRIMARY KEY,
    data TEXT NOT NULL
);
"""


@dataclass
class _Job:
    fn: Callable[[sqlite3.Connection], Any]
    write: bool
    future: concurrent.futures.Future[Any] = field(default_factory=concurrent.futures.Future[Any])


class SQLiteStore:
    """A durable store in one SQLite file (see the module docstring).

    Args:
        path: The database file (created if absent). Several processes may open the same file.
        busy_timeout_s: How long to wait for another process's write lock before giving up with
            ``StoreUnavailableError``.
        poll_s: How often ``wait_for_rollouts`` re-reads the file for other processes' changes.
    """

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout_s: float = 30.0, poll_s: float = 0.05) -> None:
        self._path = os.fspath(path)
        self._poll_s = poll_s
        self._conn = self._connect(busy_timeout_s)
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._closed = False
        self._ended_any = False  # set by jobs (worker thread) when a rollout reached a terminal status
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        self._waiters_lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, name=f"lightning-sqlite:{self._path}", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return f"SQLiteStore({self._path!r})"

    # --- rollouts ---------------------------------------------------------------------------
    async def enqueue(self, requests: Sequence[RolloutRequest]) -> list[Rollout]:
        check_batch("enqueue", len(requests))
        reqs = [q.normalised(r) for r in requests]
        return await self._call(lambda c: self._enqueue(c, reqs))

    async def claim(self, worker_id: str, n: int = 1, *, timeout_s: float | None = None) -> list[Claim]:
        q.check_claim_args(worker_id, n, timeout_s)
        return await self._call(lambda c: self._claim(c, worker_id, n, timeout_s))

    async def heartbeat(self, attempt_id: str) -> Attempt:
        return await self._call(lambda c: self._heartbeat(c, attempt_id))

    async def finish_attempt(
        self,
        attempt_id: str,
        status: AttemptStatus,
        *,
        error: str | None = None,
        reward: float | None = None,
    ) -> Rollout:
        q.check_finish(status, reward)
        return await self._call(lambda c: self._finish(c, attempt_id, status, error, reward))

    async def cancel(self, rollout_ids: Sequence[str]) -> list[Rollout]:
        check_batch("cancel", len(rollout_ids))
        ids = list(rollout_ids)
        return await self._call(lambda c: self._cancel(c, ids))

    async def get_rollout(self, rollout_id: str) -> Rollout:
        def run(c: sqlite3.Connection) -> Rollout:
            self._expire(c, now())
            return self._rollout(c, rollout_id)

        return await self._call(run)

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
        where: list[str] = []
        params: list[Any] = []
        for column, values in (("id", ids), ("status", None if status is None else [s.value for s in status])):
            if values is not None:
                where.append(f"{column} IN {_IN_JSON}")
                params.append(_json_list(values))
        for column, value in (("group_id", group_id), ("mode", mode)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        sql = f"SELECT {_R_COLS} FROM rollouts"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY seq LIMIT ? OFFSET ?"
        params += [limit, offset]

        def run(c: sqlite3.Connection) -> list[Rollout]:
            self._expire(c, now())
            return [q.rollout_from_row(row) for row in c.execute(sql, params)]

        return await self._call(run)

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
                ended = await self._call(lambda c: self._ended(c, wanted))
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

    # --- attempts ---------------------------------------------------------------------------
    async def get_attempt(self, attempt_id: str) -> Attempt:
        def run(c: sqlite3.Connection) -> Attempt:
            self._expire(c, now())
            return self._attempt(c, attempt_id)

        return await self._call(run)

    async def query_attempts(self, rollout_id: str) -> list[Attempt]:
        def run(c: sqlite3.Connection) -> list[Attempt]:
            self._expire(c, now())
            self._rollout(c, rollout_id)
            rows = c.execute(f"SELECT {_A_COLS} FROM attempts WHERE rollout_id = ? ORDER BY number", (rollout_id,))
            return [q.attempt_from_row(row) for row in rows]

        return await self._call(run)

    # --- spans ------------------------------------------------------------------------------
    async def add_spans(self, spans: Sequence[Span]) -> int:
        check_batch("add_spans", len(spans))
        batch = list(spans)
        if not batch:
            return 0
        return await self._call(lambda c: self._add_spans(c, batch))

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
        where: list[str] = []
        params: list[Any] = []
        for column, value in (("rollout_id", rollout_id), ("attempt_id", attempt_id), ("name", name)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        sql = "SELECT data FROM spans"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY attempt_seq, seq LIMIT ? OFFSET ?"
        params += [limit, offset]

        def run(c: sqlite3.Connection) -> list[Span]:
            return [q.span_from_data(row[0]) for row in c.execute(sql, params)]

        return await self._call(run, write=False)

    # --- resources --------------------------------------------------------------------------
    async def add_resources(
        self,
        *,
        llm: LLMResource | None = None,
        prompts: dict[str, str] | None = None,
        extra: dict[str, object] | None = None,
    ) -> Resources:
        def run(c: sqlite3.Connection) -> Resources:
            (latest,) = c.execute("SELECT COALESCE(MAX(version), 0) FROM resources").fetchone()
            res = Resources(version=latest + 1, llm=llm, prompts=prompts or {}, extra=extra or {})
            c.execute("INSERT INTO resources (version, data) VALUES (?, ?)", (res.version, q.resources_to_data(res)))
            return res

        return await self._call(run)

    async def get_resources(self, version: int | None = None) -> Resources:
        def run(c: sqlite3.Connection) -> Resources:
            if version is None:
                row = c.execute("SELECT data FROM resources ORDER BY version DESC LIMIT 1").fetchone()
            else:
                row = c.execute("SELECT data FROM resources WHERE version = ?", (version,)).fetchone()
            if row is None:
                (latest,) = c.execute("SELECT COALESCE(MAX(version), 0) FROM resources").fetchone()
                raise q.resources_not_found(version, latest)
            return q.resources_from_data(row[0])

        return await self._call(run, write=False)

    # --- housekeeping -----------------------------------------------------------------------
    async def expire(self, now: float | None = None) -> int:
        t = time.time() if now is None else now
        return await self._call(lambda c: self._expire(c, t))

    async def prune(self, older_than: float) -> int:
        def run(c: sqlite3.Connection) -> int:
            doomed = (
                f"SELECT id FROM rollouts WHERE ended_at IS NOT NULL AND ended_at < ? AND status IN {_TERMINAL_SQL}"
            )
            c.execute(f"DELETE FROM spans WHERE rollout_id IN ({doomed})", (older_than,))
            c.execute(f"DELETE FROM attempts WHERE rollout_id IN ({doomed})", (older_than,))
            return c.execute(f"DELETE FROM rollouts WHERE id IN ({doomed})", (older_than,)).rowcount

        return await self._call(run)

    async def stats(self) -> StoreStats:
        def run(c: sqlite3.Connection) -> StoreStats:
            self._expire(c, now())
            rollouts = dict(c.execute("SELECT status, COUNT(*) FROM rollouts GROUP BY status").fetchall())
            attempts = dict(c.execute("SELECT status, COUNT(*) FROM attempts GROUP BY status").fetchall())
            (spans,) = c.execute("SELECT COUNT(*) FROM spans").fetchone()
            (versions,) = c.execute("SELECT COUNT(*) FROM resources").fetchone()
            return StoreStats(
                rollouts_by_status=rollouts, attempts_by_status=attempts, spans=spans, resources_versions=versions
            )

        return await self._call(run)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._jobs.put(None)
        await asyncio.to_thread(self._thread.join)

    # --- the worker thread ------------------------------------------------------------------
    def _connect(self, busy_timeout_s: float) -> sqlite3.Connection:
        _create_private(self._path)
        try:
            conn = sqlite3.connect(self._path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise StoreUnavailableError(
                f"cannot open SQLite store {self._path!r}: {exc}; check that the folder exists and is writable."
            ) from exc
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode != "wal" and self._path != ":memory:":
                raise StoreUnavailableError(
                    f"SQLite store {self._path!r} could not switch to WAL mode (got {mode}); "
                    "use a local file system (WAL does not work on network shares)."
                )
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute("BEGIN IMMEDIATE")
            (version,) = conn.execute("PRAGMA user_version").fetchone()
            if version not in (0, SCHEMA_VERSION):
                raise StoreUnavailableError(
                    f"SQLite store {self._path!r} has schema version {version}, this Lightning expects "
                    f"{SCHEMA_VERSION}; use a new file or the matching Lightning version."
                )
            _run_script(conn, _SCHEMA)
            _upgrade(conn)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            conn.close()
            raise
        return conn

    async def _call(self, fn: Callable[[sqlite3.Connection], T], *, write: bool = True) -> T:
        if self._closed or not self._thread.is_alive():
            raise StoreUnavailableError(f"{self!r} is closed; open a new SQLiteStore.")
        job = _Job(fn, write)
        self._jobs.put(job)
        return await asyncio.wrap_future(job.future)

    def _serve(self) -> None:
        try:
            stop = False
            while not stop:
                first = self._jobs.get()
                if first is None:
                    break
                group = [first]
                while len(group) < _MAX_GROUP:
                    try:
                        job = self._jobs.get_nowait()
                    except queue.Empty:
                        break
                    if job is None:
                        stop = True
                        break
                    group.append(job)
                try:
                    self._run_group(group)
                except BaseException as exc:  # never leave callers waiting on a dead thread
                    error = StoreUnavailableError(f"SQLite store {self._path!r} failed unexpectedly: {exc!r}")
                    _fail_all([job for job in group if not job.future.done()], error)
                    if not isinstance(exc, Exception):
                        raise
        finally:
            self._conn.close()

    def _run_group(self, group: list[_Job]) -> None:
        """Run jobs in one transaction, each in a savepoint; answer them only after COMMIT."""
        jobs = [job for job in group if job.future.set_running_or_notify_cancel()]
        if not jobs:
            return
        c = self._conn
        self._ended_any = False
        try:
            c.execute("BEGIN IMMEDIATE" if any(job.write for job in jobs) else "BEGIN")
        except sqlite3.Error as exc:
            _fail_all(jobs, self._unavailable(exc))
            return
        results: list[tuple[_Job, Any, BaseException | None]] = []
        try:
            for job in jobs:
                c.execute("SAVEPOINT job")
                try:
                    value, error = job.fn(c), None
                except sqlite3.OperationalError as exc:
                    value, error = None, self._unavailable(exc)
                except Exception as exc:
                    value, error = None, exc
                if error is not None:
                    c.execute("ROLLBACK TO job")
                c.execute("RELEASE job")
                results.append((job, value, error))
            c.execute("COMMIT")
        except sqlite3.Error as exc:
            if c.in_transaction:
                c.execute("ROLLBACK")
            _fail_all(jobs, self._unavailable(exc))
            return
        for job, value, error in results:
            if error is None:
                job.future.set_result(value)
            else:
                job.future.set_exception(error)
        if self._ended_any:
            self._wake_waiters()

    def _wake_waiters(self) -> None:
        with self._waiters_lock:
            waiters = list(self._waiters)
        for loop, event in waiters:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # that loop is closed; its waiter is gone
                pass

    def _unavailable(self, exc: sqlite3.Error) -> StoreUnavailableError:
        error = StoreUnavailableError(
            f"SQLite store {self._path!r} failed: {exc}; if the database is locked, another process holds "
            "the write lock for too long (raise busy_timeout_s); otherwise check the disk."
        )
        error.__cause__ = exc
        return error

    # --- operations (worker thread, inside a transaction) -----------------------------------
    def _rollout(self, c: sqlite3.Connection, rollout_id: str) -> Rollout:
        row = c.execute(f"SELECT {_R_COLS} FROM rollouts WHERE id = ?", (rollout_id,)).fetchone()
        if row is None:
            raise q.rollout_not_found(rollout_id)
        return q.rollout_from_row(row)

    def _attempt(self, c: sqlite3.Connection, attempt_id: str) -> Attempt:
        row = c.execute(f"SELECT {_A_COLS} FROM attempts WHERE id = ?", (attempt_id,)).fetchone()
        if row is None:
            raise q.attempt_not_found(attempt_id)
        return q.attempt_from_row(row)

    def _save(self, c: sqlite3.Connection, rollout: Rollout, attempt: Attempt | None = None) -> None:
        c.execute(
            "UPDATE rollouts SET status = ?, attempt_count = ?, updated_at = ?, ended_at = ?, final_reward = ?,"
            " error = ? WHERE id = ?",
            q.rollout_update_params(rollout),
        )
        if attempt is not None:
            c.execute(
                "UPDATE attempts SET status = ?, heartbeat_at = ?, ended_at = ?, deadline = ?, error = ?, reward = ?"
                " WHERE id = ?",
                q.attempt_update_params(attempt),
            )
        if rollout.status in TERMINAL_ROLLOUT:
            self._ended_any = True

    def _enqueue(self, c: sqlite3.Connection, reqs: list[RolloutRequest]) -> list[Rollout]:
        found: dict[str, Rollout] = {}
        ids = _json_list([r.id for r in reqs])
        for row in c.execute(f"SELECT {_R_COLS} FROM rollouts WHERE id IN {_IN_JSON}", (ids,)):
            found[row[1]] = q.rollout_from_row(row)
        (seq,) = c.execute("SELECT COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'rollouts'), 0)").fetchone()
        out: list[Rollout] = []
        fresh: list[tuple[Any, ...]] = []
        t = now()
        for req in reqs:
            stored = found.get(req.id)
            if stored is not None:
                q.check_resend(stored, req)
                out.append(stored)
                continue
            seq += 1
            rollout = Rollout(**req.model_dump(), seq=seq, created_at=t, updated_at=t)
            found[req.id] = rollout
            fresh.append((seq, *q.rollout_insert_params(rollout)))
            out.append(rollout)
        c.executemany(f"INSERT INTO rollouts ({_R_COLS}) VALUES ({_marks(len(q.ROLLOUT_COLUMNS))})", fresh)
        return q.unshared(out)

    def _claim(self, c: sqlite3.Connection, worker_id: str, n: int, timeout_s: float | None) -> list[Claim]:
        self._expire(c, now())
        rows = c.execute(
            f"SELECT {_R_COLS} FROM rollouts INDEXED BY rollouts_waiting"
            f" WHERE status IN {_WAITING_SQL} ORDER BY seq LIMIT ?",
            (n,),
        ).fetchall()
        claims: list[Claim] = []
        t = now()
        for row in rows:
            rollout = q.rollout_from_row(row)
            attempt = q.open_attempt(rollout, worker_id, t, timeout_s)
            claims.append(Claim(rollout=rollout, attempt=attempt))
        c.executemany(
            "UPDATE rollouts SET status = ?, attempt_count = ?, updated_at = ?, ended_at = ?, final_reward = ?,"
            " error = ? WHERE id = ?",
            [q.rollout_update_params(cl.rollout) for cl in claims],
        )
        c.executemany(
            f"INSERT INTO attempts ({_A_COLS}) VALUES ({_marks(len(q.ATTEMPT_COLUMNS))})",
            [q.attempt_insert_params(cl.attempt) for cl in claims],
        )
        return claims

    def _heartbeat(self, c: sqlite3.Connection, attempt_id: str) -> Attempt:
        self._attempt(c, attempt_id)
        self._expire(c, now())
        attempt = self._attempt(c, attempt_id)
        if attempt.status is not AttemptStatus.RUNNING:
            check_attempt_transition(attempt.id, attempt.status, AttemptStatus.RUNNING)
        (config,) = c.execute("SELECT config FROM rollouts WHERE id = ?", (attempt.rollout_id,)).fetchone()
        t = now()
        attempt.heartbeat_at = t
        config = RolloutConfig.model_validate_json(config)
        attempt.deadline = attempt_deadline(config, attempt.started_at, t, attempt.timeout_s)
        c.execute("UPDATE attempts SET heartbeat_at = ?, deadline = ? WHERE id = ?", (t, attempt.deadline, attempt.id))
        return attempt

    def _finish(
        self,
        c: sqlite3.Connection,
        attempt_id: str,
        status: AttemptStatus,
        error: str | None,
        reward: float | None,
    ) -> Rollout:
        self._attempt(c, attempt_id)
        self._expire(c, now())
        attempt = self._attempt(c, attempt_id)
        rollout = self._rollout(c, attempt.rollout_id)
        q.end_attempt(rollout, attempt, status, None, error, reward, now())
        self._save(c, rollout, attempt)
        return rollout

    def _cancel(self, c: sqlite3.Connection, ids: list[str]) -> list[Rollout]:
        out: list[Rollout] = []
        t = now()
        for rid in ids:
            rollout = self._rollout(c, rid)
            row = c.execute(
                f"SELECT {_A_COLS} FROM attempts WHERE rollout_id = ? AND status = 'running' ORDER BY number DESC",
                (rid,),
            ).fetchone()
            running = None if row is None else q.attempt_from_row(row)
            if q.cancel_rollout(rollout, running, t):
                self._save(c, rollout, running)
            out.append(rollout)
        return out

    def _ended(self, c: sqlite3.Connection, ids: list[str]) -> list[Rollout]:
        self._expire(c, now())
        rows = c.execute(
            f"SELECT {_R_COLS} FROM rollouts WHERE id IN {_IN_JSON} AND status IN {_TERMINAL_SQL}",
            (_json_list(ids),),
        )
        by_id = {row[1]: q.rollout_from_row(row) for row in rows}
        return q.unshared([by_id[i] for i in ids if i in by_id])

    def _add_spans(self, c: sqlite3.Connection, spans: list[Span]) -> int:
        targets: dict[str, tuple[str, int, int]] = {}  # attempt id -> (rollout id, attempt seq, span count)
        ids = _json_list(sorted({s.attempt_id for s in spans}))
        for aid, rid, aseq, count in c.execute(
            f"SELECT id, rollout_id, seq, span_count FROM attempts WHERE id IN {_IN_JSON}", (ids,)
        ):
            targets[aid] = (rid, aseq, count)
        q.check_span_targets(spans, {aid: v[0] for aid, v in targets.items()})
        counts = {aid: v[2] for aid, v in targets.items()}
        new = 0
        for span in spans:
            seq = counts[span.attempt_id] + 1
            params = q.span_insert_params(span, targets[span.attempt_id][1], seq)
            cur = c.execute(_INSERT_SPAN, params)
            if cur.rowcount == 1:
                counts[span.attempt_id] = seq
                new += 1
        c.executemany(
            "UPDATE attempts SET span_count = ? WHERE id = ?",
            [(count, aid) for aid, count in counts.items() if count != targets[aid][2]],
        )
        return new

    def _expire(self, c: sqlite3.Connection, t: float) -> int:
        rows = c.execute(
            f"SELECT {_A_COLS_A}, {_R_COLS_R} FROM attempts a INDEXED BY attempts_expiry"
            " JOIN rollouts r ON r.id = a.rollout_id"
            " WHERE a.status = 'running' AND a.deadline <= ? ORDER BY a.seq",
            (t,),
        ).fetchall()
        split = len(q.ATTEMPT_COLUMNS)
        for row in rows:
            attempt, rollout = q.attempt_from_row(row[:split]), q.rollout_from_row(row[split:])
            reason, message = expiry_reason(rollout.config, attempt, t)
            q.end_attempt(rollout, attempt, AttemptStatus.TIMED_OUT, reason, message, None, now())
            self._save(c, rollout, attempt)
        return len(rows)


def _create_private(path: str) -> None:
    """Create the database file readable by its owner only (0600) if it does not exist yet.

    The store holds prompts, model outputs and rewards; SQLite would create it with the process's
    umask (usually 0644, world-readable). Its ``-wal`` and ``-shm`` files copy this file's mode.
    """
    if path in ("", ":memory:"):
        return
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return  # an existing file keeps the mode its owner gave it
    except OSError:
        return  # e.g. a missing folder: sqlite3.connect reports it with a clearer message
    os.close(fd)


def _upgrade(conn: sqlite3.Connection) -> None:
    """Bring a file written by an older Lightning up to date (additive only, so older versions can
    still open it): the ``timeout_s`` column, and a deadline for running attempts that had none."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(attempts)")}
    if "timeout_s" not in columns:
        conn.execute("ALTER TABLE attempts ADD COLUMN timeout_s REAL")
    if "gateway_key" not in columns:  # attempts opened before it have none: the gateway accepts them unkeyed
        conn.execute("ALTER TABLE attempts ADD COLUMN gateway_key TEXT")
    conn.execute(
        "UPDATE attempts SET deadline = heartbeat_at + ? WHERE status = 'running' AND deadline IS NULL",
        (DEFAULT_HEARTBEAT_TIMEOUT_S,),
    )


def _marks(n: int) -> str:
    return ", ".join("?" * n)


_INSERT_SPAN = (
    f"INSERT INTO spans ({', '.join(q.SPAN_COLUMNS)}) VALUES ({_marks(len(q.SPAN_COLUMNS))})"
    " ON CONFLICT (trace_id, span_id) DO NOTHING"
)


def _json_list(values: Sequence[str]) -> str:
    return json.dumps(list(values))


def _run_script(conn: sqlite3.Connection, script: str) -> None:
    # executescript() would COMMIT the open transaction; run the statements one by one instead.
    for statement in script.split(";"):
        if statement.strip():
            conn.execute(statement)


def _fail_all(jobs: list[_Job], error: BaseException) -> None:
    for job in jobs:
        job.future.set_exception(error)
