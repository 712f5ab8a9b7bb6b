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
* **The queries and operations are ``store._sql``'s**, shared with PostgreSQL; this module only
  owns the file, the thread and the transactions, and answers the statements an operation yields.
  Expiry is an indexed query over running attempts' deadlines, run in the same transaction before
  every claim and query.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import queue
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from lightning_rl.errors import StoreUnavailableError
from lightning_rl.store import _rules as rules
from lightning_rl.store import _sql as sq
from lightning_rl.store.base import now

__all__ = ["SQLiteStore"]

T = TypeVar("T")

_MAX_GROUP: Final = 256
"""Most operations committed together in one transaction."""
_STATEMENTS: Final = sq.Statements(sq.SQLITE)


@dataclass
class _Job:
    fn: Callable[[sqlite3.Connection], Any]
    write: bool
    future: concurrent.futures.Future[Any] = field(default_factory=concurrent.futures.Future[Any])


class SQLiteStore(sq.SqlStore):
    """A durable store in one SQLite file (see the module docstring).

    Args:
        path: The database file (created if absent). Several processes may open the same file.
        busy_timeout_s: How long to wait for another process's write lock before giving up with
            ``StoreUnavailableError``.
        poll_s: How often ``wait_for_rollouts`` re-reads the file for other processes' changes.
    """

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout_s: float = 30.0, poll_s: float = 0.05) -> None:
        super().__init__()
        self._path = os.fspath(path)
        self._s = _STATEMENTS
        self._poll_s = poll_s
        self._conn = self._connect(busy_timeout_s)
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._closed = False
        self._ended_any = False  # set by jobs (worker thread) when a rollout reached a terminal status
        self._thread = threading.Thread(target=self._serve, name=f"lightning-sqlite:{self._path}", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return f"SQLiteStore({self._path!r})"

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._jobs.put(None)
        await asyncio.to_thread(self._thread.join)

    async def _run(self, op: Callable[[], sq.Op[T]], *, write: bool = True, expire: bool = False) -> T:
        def job(c: sqlite3.Connection) -> T:
            if expire:
                self._drive(c, sq.expire_op(self._s, now()))
            return self._drive(c, op())

        return await self._call(job, write=write)

    def _insert_span_rows(self, rows: list[tuple[Any, ...]]) -> sq.Request:
        return sq.Many(self._s.insert_span, rows)

    def _drive(self, c: sqlite3.Connection, op: sq.Op[T]) -> T:
        """Run an operation on the worker thread, answering each statement it yields."""
        answer: Any = None
        try:
            while True:
                answer = self._answer(c, op.send(answer))
        except StopIteration as stop:
            return stop.value

    def _answer(self, c: sqlite3.Connection, request: sq.Request) -> Any:
        if isinstance(request, sq.Rows):
            return c.execute(request.text, request.params).fetchall()
        if isinstance(request, sq.Run):
            return c.execute(request.text, request.params).rowcount
        if isinstance(request, sq.Many):
            return c.executemany(request.text, request.rows).rowcount
        if isinstance(request, sq.Inserted):  # seq is the rowid: no RETURNING needed (SQLite < 3.35 has none)
            cursors = (c.execute(request.text, row) for row in request.rows)
            return [cur.lastrowid if cur.rowcount == 1 else None for cur in cursors]
        assert request is sq.ENDED
        self._ended_any = True
        return None

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
            rules.check_layout(version or rules.LAYOUT_VERSION, f"SQLite store {self._path!r}", "a new file")  # 0: new
            _run_script(conn, _STATEMENTS.schema)
            columns = {row[1] for row in conn.execute("PRAGMA table_info(attempts)")}
            _run_script(conn, ";".join(_STATEMENTS.upgrade(columns)))
            conn.execute(f"PRAGMA user_version = {rules.LAYOUT_VERSION}")
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
            self._rollouts_ended()

    def _unavailable(self, exc: sqlite3.Error) -> StoreUnavailableError:
        error = StoreUnavailableError(
            f"SQLite store {self._path!r} failed: {exc}; if the database is locked, another process holds "
            "the write lock for too long (raise busy_timeout_s); otherwise check the disk."
        )
        error.__cause__ = exc
        return error


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


def _run_script(conn: sqlite3.Connection, script: str) -> None:
    # executescript() would COMMIT the open transaction; run the statements one by one instead.
    for statement in script.split(";"):
        if statement.strip():
            conn.execute(statement)


def _fail_all(jobs: list[_Job], error: BaseException) -> None:
    for job in jobs:
        job.future.set_exception(error)
