"""PostgreSQL store: one store shared by runners and trainers on many machines.

Why it looks like this:

* **psycopg 3, async, a small pool** of connections owned by the store (``pool_size``), so
  concurrent coroutines run their transactions side by side without a pool dependency.
* **Row locks, always in one order** (the rollout first, then its attempt; several rows by ``seq``),
  so concurrent finishes, cancels, heartbeats and expiries do not deadlock; if PostgreSQL still
  reports a deadlock or a serialization failure the whole operation is retried.
* **Claims use** ``SELECT … FOR UPDATE SKIP LOCKED``: two workers never take the same rollout and
  never wait for each other.
* **What happens** when an attempt ends or expires is decided by ``store.base`` and ``store._sql``,
  exactly as in ``MemoryStore``. Expiry runs before claims and queries as one indexed query that
  finds nothing in the common case; found attempts are then locked and re-checked.
* **Clocks.** Timestamps come from the caller's clock (``time.time()``), like the other backends;
  hosts sharing one store should keep their clocks in sync (NTP).
* ``schema=`` puts the tables in their own PostgreSQL schema (created if absent), which is how
  tests isolate themselves and how one database can hold several stores.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any, Final, LiteralString, TypeVar, cast

from lightning_rl.errors import InvalidRequestError, StoreUnavailableError
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

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg import sql
    from psycopg.types.string import TextLoader
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("PostgresStore needs psycopg 3: install it with `pip install 'lightning-rl[postgres]'`.") from exc

__all__ = ["PostgresStore"]

T = TypeVar("T")
Conn = psycopg.AsyncConnection[tuple[Any, ...]]

SCHEMA_VERSION: Final = 1
_RETRIES: Final = 8
_RETRYABLE = (pg_errors.DeadlockDetected, pg_errors.SerializationFailure, pg_errors.LockNotAvailable)
_LOCK_KEY: Final = 0x4C6967687452  # advisory lock serialising table creation ("LightR")


def _trusted(text: str) -> LiteralString:
    """Mark SQL assembled in this module from constant fragments (never from user input) as literal."""
    return cast(LiteralString, text)


_WAITING_SQL = "('queued', 'requeued')"
_TERMINAL_SQL = _trusted("(" + ", ".join(f"'{s}'" for s in q.TERMINAL) + ")")
_R_COLS = _trusted(", ".join(q.ROLLOUT_COLUMNS))
_R_COLS_R = _trusted(", ".join("r." + c for c in q.ROLLOUT_COLUMNS))
_A_COLS = _trusted(", ".join(q.ATTEMPT_COLUMNS))
_JSON_COLUMNS = {"task", "config", "metadata"}
_R_INSERT = _trusted(
    f"INSERT INTO rollouts ({', '.join(q.ROLLOUT_COLUMNS[1:])}) VALUES ("
    + ", ".join("%s::json" if c in _JSON_COLUMNS else "%s" for c in q.ROLLOUT_COLUMNS[1:])
    + ") ON CONFLICT (id) DO NOTHING RETURNING seq"
)
_R_UPDATE = (
    "UPDATE rollouts SET status = %s, attempt_count = %s, updated_at = %s, ended_at = %s, final_reward = %s,"
    " error = %s WHERE id = %s"
)
_A_INSERT = _trusted(f"INSERT INTO attempts ({_A_COLS}) VALUES ({', '.join(['%s'] * len(q.ATTEMPT_COLUMNS))})")
_A_UPDATE = (
    "UPDATE attempts SET status = %s, heartbeat_at = %s, ended_at = %s, deadline = %s, error = %s, reward = %s"
    " WHERE id = %s"
)
_S_INSERT = (
    f"INSERT INTO spans ({', '.join(q.SPAN_COLUMNS)})"
    " SELECT t, s, r, a, aseq, seq, n, d::json FROM unnest("
    "%s::text[], %s::text[], %s::text[], %s::text[], %s::bigint[], %s::bigint[], %s::text[], %s::text[]"
    ") AS u(t, s, r, a, aseq, seq, n, d) ON CONFLICT (trace_id, span_id) DO NOTHING"
)

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS lightning_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rollouts (
    seq BIGSERIAL PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    task JSON NOT NULL,
    group_id TEXT,
    mode TEXT NOT NULL,
    resources_version INTEGER,
    config JSON NOT NULL,
    metadata JSON NOT NULL,
    status TEXT NOT NULL,
    attempt_count INTEGER NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    ended_at DOUBLE PRECISION,
    final_reward DOUBLE PRECISION,
    error TEXT
);
CREATE INDEX IF NOT EXISTS rollouts_waiting ON rollouts (seq) WHERE status IN {_WAITING_SQL};
CREATE INDEX IF NOT EXISTS rollouts_group ON rollouts (group_id, seq);
CREATE INDEX IF NOT EXISTS rollouts_ended ON rollouts (ended_at) WHERE ended_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS attempts (
    seq BIGSERIAL PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    rollout_id TEXT NOT NULL,
    number INTEGER NOT NULL,
    worker_id TEXT NOT NULL,
    status TEXT NOT NULL,
    started_at DOUBLE PRECISION NOT NULL,
    heartbeat_at DOUBLE PRECISION NOT NULL,
    ended_at DOUBLE PRECISION,
    deadline DOUBLE PRECISION,
    error TEXT,
    reward DOUBLE PRECISION,
    span_count INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS attempts_rollout ON attempts (rollout_id, number);
CREATE INDEX IF NOT EXISTS attempts_expiry ON attempts (deadline) WHERE status = 'running';
CREATE TABLE IF NOT EXISTS spans (
    trace_id TEXT NOT NULL,
    span_id TEXT NOT NULL,
    rollout_id TEXT NOT NULL,
    attempt_id TEXT NOT NULL,
    attempt_seq BIGINT NOT NULL,
    seq BIGINT NOT NULL,
    name TEXT NOT NULL,
    data JSON NOT NULL,
    PRIMARY KEY (trace_id, span_id)
);
CREATE INDEX IF NOT EXISTS spans_rollout ON spans (rollout_id, attempt_seq, seq);
CREATE INDEX IF NOT EXISTS spans_attempt ON spans (attempt_id, seq);
CREATE TABLE IF NOT EXISTS resources (version INTEGER PRIMARY KEY, data JSON NOT NULL);
"""

_UPGRADE = _trusted(f"""
ALTER TABLE attempts ADD COLUMN IF NOT EXISTS timeout_s DOUBLE PRECISION;
ALTER TABLE attempts ADD COLUMN IF NOT EXISTS gateway_key TEXT;
UPDATE attempts SET deadline = heartbeat_at + {DEFAULT_HEARTBEAT_TIMEOUT_S!r}
    WHERE status = 'running' AND deadline IS NULL;
""")
"""Additive changes to a schema an older Lightning created (older versions can still use it): the
attempt's ``timeout_s`` column, and a deadline for running attempts that had none."""


class PostgresStore:
    """A store in a PostgreSQL database (see the module docstring). Create it with ``await PostgresStore.open(dsn)``."""

    def __init__(self, dsn: str, schema: str | None, pool_size: int, poll_s: float) -> None:
        """Use ``PostgresStore.open``; this only records the settings."""
        if pool_size < 1:
            raise InvalidRequestError(f"pool_size must be >= 1, got {pool_size}.")
        self._dsn = dsn
        self._schema = schema
        self._poll_s = poll_s
        self._pool_size = pool_size
        self._idle: list[Conn] = []
        self._opened = 0
        self._slots = asyncio.Semaphore(pool_size)
        self._closed = False
        self._waiters: set[asyncio.Event] = set()
        self._ended_count = 0  # bumped whenever a rollout reaches a terminal status; wakes waiters after commit

    @classmethod
    async def open(
        cls, dsn: str, *, schema: str | None = None, pool_size: int = 4, poll_s: float = 0.05
    ) -> PostgresStore:
        """Connect, create the schema and tables if absent, and return the store.

        Args:
            dsn: A libpq connection string or URL, e.g. ``postgresql://user@host:5432/db``.
            schema: A PostgreSQL schema for the tables (created if absent); default: the
                connection's ``search_path`` (usually ``public``).
            pool_size: Most connections used at once.
            poll_s: How often ``wait_for_rollouts`` re-reads for other clients' changes.
        """
        store = cls(dsn, schema, pool_size, poll_s)
        async with store._connection() as conn, conn.transaction():
            row = await (await conn.execute("SELECT to_regclass('lightning_meta') IS NOT NULL")).fetchone()
            if not (row and row[0]):  # first open of this schema: create it (once, even with many openers)
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
                await conn.execute(_SCHEMA)  # several statements, no parameters: one round trip
            await store._check_version(conn)
            columns = await conn.execute(
                "SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema()"
                " AND table_name = 'attempts' AND column_name = 'gateway_key'"
            )
            if await columns.fetchone() is None:
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
                await conn.execute(_UPGRADE)
        return store

    def __repr__(self) -> str:
        return f"PostgresStore(schema={self._schema!r})"

    # --- rollouts ---------------------------------------------------------------------------
    async def enqueue(self, requests: Sequence[RolloutRequest]) -> list[Rollout]:
        check_batch("enqueue", len(requests))
        reqs = [q.normalised(r) for r in requests]
        if not reqs:
            return []
        return await self._run(lambda c: self._enqueue(c, reqs))

    async def claim(self, worker_id: str, n: int = 1, *, timeout_s: float | None = None) -> list[Claim]:
        q.check_claim_args(worker_id, n, timeout_s)
        return await self._run(lambda c: self._claim(c, worker_id, n, timeout_s), expire=True)

    async def heartbeat(self, attempt_id: str) -> Attempt:
        return await self._run(lambda c: self._heartbeat(c, attempt_id), expire=True)

    async def finish_attempt(
        self,
        attempt_id: str,
        status: AttemptStatus,
        *,
        error: str | None = None,
        reward: float | None = None,
    ) -> Rollout:
        q.check_finish(status, reward)
        return await self._run(lambda c: self._finish(c, attempt_id, status, error, reward), expire=True)

    async def cancel(self, rollout_ids: Sequence[str]) -> list[Rollout]:
        check_batch("cancel", len(rollout_ids))
        ids = list(rollout_ids)
        if not ids:
            return []
        return await self._run(lambda c: self._cancel(c, ids))

    async def get_rollout(self, rollout_id: str) -> Rollout:
        return await self._run(lambda c: self._rollout(c, rollout_id), expire=True)

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
                where.append(f"{column} = ANY(%s::text[])")
                params.append(list(values))
        for column, value in (("group_id", group_id), ("mode", mode)):
            if value is not None:
                where.append(f"{column} = %s")
                params.append(value)
        query = f"SELECT {_R_COLS} FROM rollouts"
        if where:
            query += " WHERE " + " AND ".join(where)
        query += " ORDER BY seq LIMIT %s OFFSET %s"
        params += [limit, offset]

        async def run(c: Conn) -> list[Rollout]:
            cur = await c.execute(_trusted(query), params)
            return [q.rollout_from_row(row) for row in await cur.fetchall()]

        return await self._run(run, expire=True)

    async def wait_for_rollouts(self, ids: Sequence[str], timeout_s: float) -> list[Rollout]:
        wanted = list(ids)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout_s, 0.0)
        changed = asyncio.Event()
        self._waiters.add(changed)
        try:
            while True:
                changed.clear()
                ended = await self._run(lambda c: self._ended(c, wanted), expire=True)
                remaining = deadline - loop.time()
                if len(ended) == len(wanted) or remaining <= 0:
                    return ended
                try:
                    await asyncio.wait_for(changed.wait(), timeout=min(remaining, self._poll_s))
                except TimeoutError:
                    pass
        finally:
            self._waiters.discard(changed)

    # --- attempts ---------------------------------------------------------------------------
    async def get_attempt(self, attempt_id: str) -> Attempt:
        return await self._run(lambda c: self._attempt(c, attempt_id), expire=True)

    async def query_attempts(self, rollout_id: str) -> list[Attempt]:
        async def run(c: Conn) -> list[Attempt]:
            await self._rollout(c, rollout_id)
            cur = await c.execute(
                f"SELECT {_A_COLS} FROM attempts WHERE rollout_id = %s ORDER BY number", (rollout_id,)
            )
            return [q.attempt_from_row(row) for row in await cur.fetchall()]

        return await self._run(run, expire=True)

    # --- spans ------------------------------------------------------------------------------
    async def add_spans(self, spans: Sequence[Span]) -> int:
        check_batch("add_spans", len(spans))
        batch = list(spans)
        if not batch:
            return 0
        return await self._run(lambda c: self._add_spans(c, batch))

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
                where.append(f"{column} = %s")
                params.append(value)
        query = "SELECT data FROM spans"
        if where:
            query += " WHERE " + " AND ".join(where)
        query += " ORDER BY attempt_seq, seq LIMIT %s OFFSET %s"
        params += [limit, offset]

        async def run(c: Conn) -> list[Span]:
            cur = await c.execute(_trusted(query), params)
            return [q.span_from_data(row[0]) for row in await cur.fetchall()]

        return await self._run(run)

    # --- resources --------------------------------------------------------------------------
    async def add_resources(
        self,
        *,
        llm: LLMResource | None = None,
        prompts: dict[str, str] | None = None,
        extra: dict[str, object] | None = None,
    ) -> Resources:
        async def run(c: Conn) -> Resources:
            await c.execute("LOCK TABLE resources IN EXCLUSIVE MODE")
            latest = await self._latest_version(c)
            res = Resources(version=latest + 1, llm=llm, prompts=prompts or {}, extra=extra or {})
            await c.execute(
                "INSERT INTO resources (version, data) VALUES (%s, %s::json)", (res.version, q.resources_to_data(res))
            )
            return res

        return await self._run(run)

    async def get_resources(self, version: int | None = None) -> Resources:
        async def run(c: Conn) -> Resources:
            if version is None:
                cur = await c.execute("SELECT data FROM resources ORDER BY version DESC LIMIT 1")
            else:
                cur = await c.execute("SELECT data FROM resources WHERE version = %s", (version,))
            row = await cur.fetchone()
            if row is None:
                raise q.resources_not_found(version, await self._latest_version(c))
            return q.resources_from_data(row[0])

        return await self._run(run)

    # --- housekeeping -----------------------------------------------------------------------
    async def expire(self, now: float | None = None) -> int:
        t = time.time() if now is None else now
        async with self._connection() as conn:
            return await self._expire(conn, t)

    async def prune(self, older_than: float) -> int:
        async def run(c: Conn) -> int:
            cur = await c.execute(
                "WITH doomed AS (SELECT id FROM rollouts WHERE ended_at IS NOT NULL AND ended_at < %s"
                f" AND status IN {_TERMINAL_SQL} FOR UPDATE),"
                " s AS (DELETE FROM spans WHERE rollout_id IN (SELECT id FROM doomed)),"
                " a AS (DELETE FROM attempts WHERE rollout_id IN (SELECT id FROM doomed))"
                " DELETE FROM rollouts WHERE id IN (SELECT id FROM doomed)",
                (older_than,),
            )
            return cur.rowcount

        return await self._run(run)

    async def stats(self) -> StoreStats:
        async def run(c: Conn) -> StoreStats:
            rollouts = await (await c.execute("SELECT status, COUNT(*) FROM rollouts GROUP BY status")).fetchall()
            attempts = await (await c.execute("SELECT status, COUNT(*) FROM attempts GROUP BY status")).fetchall()
            counts = await (
                await c.execute("SELECT (SELECT COUNT(*) FROM spans), (SELECT COUNT(*) FROM resources)")
            ).fetchone()
            assert counts is not None
            return StoreStats(
                rollouts_by_status=dict(rollouts),
                attempts_by_status=dict(attempts),
                spans=counts[0],
                resources_versions=counts[1],
            )

        return await self._run(run, expire=True)

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.close()

    # --- connections and transactions -------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncGenerator[Conn]:
        if self._closed:
            raise StoreUnavailableError(f"{self!r} is closed; open a new PostgresStore.")
        async with self._slots:
            conn = self._idle.pop() if self._idle else await self._connect()
            try:
                yield conn
            finally:
                if self._closed or conn.broken:
                    await conn.close()
                elif not conn.closed:
                    self._idle.append(conn)

    async def _connect(self) -> Conn:
        try:
            conn = await psycopg.AsyncConnection.connect(self._dsn, autocommit=True)
        except psycopg.OperationalError as exc:
            raise StoreUnavailableError(
                f"cannot connect to PostgreSQL: {exc}; check the DSN and that the server is running."
            ) from exc
        conn.adapters.register_loader("json", TextLoader)  # rows carry JSON as text; pydantic parses it
        if self._schema is not None:
            await conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self._schema)))
            await conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self._schema)))
        return conn

    async def _run(self, fn: Callable[[Conn], Awaitable[T]], *, expire: bool = False) -> T:
        """Run ``fn`` in a transaction (after expiring overdue attempts), retrying lock conflicts."""
        async with self._connection() as conn:
            for attempt in range(_RETRIES):
                try:
                    if expire:
                        await self._expire(conn, now())
                    before = self._ended_count
                    async with conn.transaction():
                        result = await fn(conn)
                    if self._ended_count != before:
                        self._wake_waiters()
                    return result
                except _RETRYABLE:
                    if attempt == _RETRIES - 1:
                        raise
                    await asyncio.sleep(0.005 * (attempt + 1))
                except psycopg.DataError as exc:
                    raise InvalidRequestError(
                        f"PostgreSQL cannot store this value: {exc}; remove NUL characters from ids, names and errors."
                    ) from exc
                except psycopg.OperationalError as exc:
                    raise StoreUnavailableError(
                        f"PostgreSQL store failed: {exc}; the operation was not applied, retry it later."
                    ) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _wake_waiters(self) -> None:
        for event in self._waiters:
            event.set()

    async def _check_version(self, c: Conn) -> None:
        cur = await c.execute("SELECT value FROM lightning_meta WHERE key = 'schema_version'")
        row = await cur.fetchone()
        if row is None:
            await c.execute(
                "INSERT INTO lightning_meta (key, value) VALUES ('schema_version', %s)", (str(SCHEMA_VERSION),)
            )
        elif row[0] != str(SCHEMA_VERSION):
            raise StoreUnavailableError(
                f"PostgreSQL store schema {self._schema or 'public'} has version {row[0]}, this Lightning "
                f"expects {SCHEMA_VERSION}; use another schema or the matching Lightning version."
            )

    # --- operations (inside a transaction) --------------------------------------------------
    async def _rollout(self, c: Conn, rollout_id: str, *, lock: bool = False) -> Rollout:
        cur = await c.execute(
            f"SELECT {_R_COLS} FROM rollouts WHERE id = %s" + (" FOR UPDATE" if lock else ""), (rollout_id,)
        )
        row = await cur.fetchone()
        if row is None:
            raise q.rollout_not_found(rollout_id)
        return q.rollout_from_row(row)

    async def _attempt(self, c: Conn, attempt_id: str, *, lock: bool = False) -> Attempt:
        cur = await c.execute(
            f"SELECT {_A_COLS} FROM attempts WHERE id = %s" + (" FOR UPDATE" if lock else ""), (attempt_id,)
        )
        row = await cur.fetchone()
        if row is None:
            raise q.attempt_not_found(attempt_id)
        return q.attempt_from_row(row)

    async def _save(self, c: Conn, pairs: Sequence[tuple[Rollout, Attempt | None]]) -> None:
        rollouts = [q.rollout_update_params(r) for r, _ in pairs]
        attempts = [q.attempt_update_params(a) for _, a in pairs if a is not None]
        await _execute_rows(c, _R_UPDATE, rollouts)
        await _execute_rows(c, _A_UPDATE, attempts)
        if any(r.status in TERMINAL_ROLLOUT for r, _ in pairs):
            self._ended_count += 1

    async def _latest_version(self, c: Conn) -> int:
        row = await (await c.execute("SELECT COALESCE(MAX(version), 0) FROM resources")).fetchone()
        assert row is not None
        return int(row[0])

    async def _enqueue(self, c: Conn, reqs: list[RolloutRequest]) -> list[Rollout]:
        cur = await c.execute(f"SELECT {_R_COLS} FROM rollouts WHERE id = ANY(%s::text[])", ([r.id for r in reqs],))
        found = {row[1]: q.rollout_from_row(row) for row in await cur.fetchall()}
        out: list[Rollout] = []
        fresh: list[Rollout] = []
        t = now()
        for req in reqs:
            stored = found.get(req.id)
            if stored is not None:
                q.check_resend(stored, req)
                out.append(stored)
                continue
            rollout = Rollout(**req.model_dump(), created_at=t, updated_at=t)
            found[req.id] = rollout
            fresh.append(rollout)
            out.append(rollout)
        if fresh:
            lost: list[str] = []
            async with c.cursor() as ins:
                await ins.executemany(_R_INSERT, [q.rollout_insert_params(r) for r in fresh], returning=True)
                index = 0
                async for result in ins.results():
                    row = await result.fetchone()
                    if row is None:  # another client inserted this id since our SELECT
                        lost.append(fresh[index].id)
                    else:
                        fresh[index].seq = row[0]
                    index += 1
            if lost:
                cur = await c.execute(f"SELECT {_R_COLS} FROM rollouts WHERE id = ANY(%s::text[])", (lost,))
                for row in await cur.fetchall():
                    stored = q.rollout_from_row(row)
                    q.check_resend(stored, found[stored.id])
                    found[stored.id] = stored
                out = [found[r.id] for r in reqs]
        return q.unshared(out)

    async def _claim(self, c: Conn, worker_id: str, n: int, timeout_s: float | None) -> list[Claim]:
        cur = await c.execute(
            f"SELECT {_R_COLS} FROM rollouts WHERE status IN {_WAITING_SQL}"
            " ORDER BY seq LIMIT %s FOR UPDATE SKIP LOCKED",
            (n,),
        )
        claims: list[Claim] = []
        t = now()
        for row in await cur.fetchall():
            rollout = q.rollout_from_row(row)
            claims.append(Claim(rollout=rollout, attempt=q.open_attempt(rollout, worker_id, t, timeout_s)))
        if claims:
            async with c.cursor() as many:
                await many.executemany(_R_UPDATE, [q.rollout_update_params(cl.rollout) for cl in claims])
                await many.executemany(_A_INSERT, [q.attempt_insert_params(cl.attempt) for cl in claims])
        return claims

    async def _heartbeat(self, c: Conn, attempt_id: str) -> Attempt:
        attempt = await self._attempt(c, attempt_id, lock=True)
        if attempt.status is not AttemptStatus.RUNNING:
            check_attempt_transition(attempt.id, attempt.status, AttemptStatus.RUNNING)
        row = await (await c.execute("SELECT config FROM rollouts WHERE id = %s", (attempt.rollout_id,))).fetchone()
        assert row is not None
        t = now()
        attempt.heartbeat_at = t
        config = RolloutConfig.model_validate_json(row[0])
        attempt.deadline = attempt_deadline(config, attempt.started_at, t, attempt.timeout_s)
        await c.execute(
            "UPDATE attempts SET heartbeat_at = %s, deadline = %s WHERE id = %s", (t, attempt.deadline, attempt.id)
        )
        return attempt

    async def _finish(
        self, c: Conn, attempt_id: str, status: AttemptStatus, error: str | None, reward: float | None
    ) -> Rollout:
        # Lock the rollout first, then its attempt: the order every operation uses.
        cur = await c.execute(
            f"SELECT {_R_COLS} FROM rollouts WHERE id = (SELECT rollout_id FROM attempts WHERE id = %s) FOR UPDATE",
            (attempt_id,),
        )
        row = await cur.fetchone()
        if row is None:
            raise q.attempt_not_found(attempt_id)
        rollout = q.rollout_from_row(row)
        attempt = await self._attempt(c, attempt_id, lock=True)
        q.end_attempt(rollout, attempt, status, None, error, reward, now())
        await self._save(c, [(rollout, attempt)])
        return rollout

    async def _cancel(self, c: Conn, ids: list[str]) -> list[Rollout]:
        cur = await c.execute(
            f"SELECT {_R_COLS} FROM rollouts WHERE id = ANY(%s::text[]) ORDER BY seq FOR UPDATE", (ids,)
        )
        rollouts = {row[1]: q.rollout_from_row(row) for row in await cur.fetchall()}
        for rid in ids:
            if rid not in rollouts:
                raise q.rollout_not_found(rid)
        cur = await c.execute(
            f"SELECT {_A_COLS} FROM attempts WHERE rollout_id = ANY(%s::text[]) AND status = 'running'"
            " ORDER BY seq FOR UPDATE",
            (ids,),
        )
        running = {a.rollout_id: a for a in (q.attempt_from_row(row) for row in await cur.fetchall())}
        t = now()
        changed: list[tuple[Rollout, Attempt | None]] = []
        for rid in ids:
            rollout, attempt = rollouts[rid], running.get(rid)
            if q.cancel_rollout(rollout, attempt, t):
                changed.append((rollout, attempt))
        if changed:
            await self._save(c, changed)
        return q.unshared([rollouts[rid] for rid in ids])

    async def _ended(self, c: Conn, ids: list[str]) -> list[Rollout]:
        cur = await c.execute(
            f"SELECT {_R_COLS} FROM rollouts WHERE id = ANY(%s::text[]) AND status IN {_TERMINAL_SQL}", (ids,)
        )
        by_id = {row[1]: q.rollout_from_row(row) for row in await cur.fetchall()}
        return q.unshared([by_id[i] for i in ids if i in by_id])

    async def _add_spans(self, c: Conn, spans: list[Span]) -> int:
        cur = await c.execute(
            "SELECT id, rollout_id, seq, span_count FROM attempts WHERE id = ANY(%s::text[]) ORDER BY seq FOR UPDATE",
            (sorted({s.attempt_id for s in spans}),),
        )
        targets: dict[str, tuple[str, int, int]] = {row[0]: (row[1], row[2], row[3]) for row in await cur.fetchall()}
        q.check_span_targets(spans, {aid: v[0] for aid, v in targets.items()})
        cur = await c.execute(
            "SELECT trace_id, span_id FROM spans WHERE (trace_id, span_id) IN"
            " (SELECT * FROM unnest(%s::text[], %s::text[]))",
            ([s.trace_id for s in spans], [s.span_id for s in spans]),
        )
        seen: set[tuple[str, str]] = {(row[0], row[1]) for row in await cur.fetchall()}
        counts = {aid: v[2] for aid, v in targets.items()}
        rows: list[tuple[Any, ...]] = []
        for span in spans:
            key = (span.trace_id, span.span_id)
            if key in seen:
                continue
            seen.add(key)
            counts[span.attempt_id] += 1
            rows.append(q.span_insert_params(span, targets[span.attempt_id][1], counts[span.attempt_id]))
        if not rows:
            return 0
        columns = [list(col) for col in zip(*rows, strict=True)]
        cur = await c.execute(_S_INSERT, columns, binary=True)  # binary arrays: no per-element escaping
        added = cur.rowcount
        changed = [aid for aid, count in counts.items() if count != targets[aid][2]]
        await c.execute(
            "UPDATE attempts SET span_count = u.n FROM unnest(%s::text[], %s::int[]) AS u(id, n)"
            " WHERE attempts.id = u.id",
            (changed, [counts[aid] for aid in changed]),
        )
        return added

    async def _expire(self, conn: Conn, t: float) -> int:
        """Time out running attempts past their deadline; one indexed query when there are none."""
        cur = await conn.execute("SELECT rollout_id FROM attempts WHERE status = 'running' AND deadline <= %s", (t,))
        candidates = [row[0] for row in await cur.fetchall()]
        if not candidates:
            return 0
        for attempt_no in range(_RETRIES):
            try:
                before = self._ended_count
                async with conn.transaction():
                    n = await self._expire_locked(conn, candidates, t)
                if self._ended_count != before:
                    self._wake_waiters()
                return n
            except _RETRYABLE:
                if attempt_no == _RETRIES - 1:
                    raise
                await asyncio.sleep(0.005 * (attempt_no + 1))
        return 0  # pragma: no cover

    async def _expire_locked(self, c: Conn, rollout_ids: list[str], t: float) -> int:
        # Rollouts another transaction holds are skipped: that one is finishing or expiring them.
        cur = await c.execute(
            f"SELECT {_R_COLS} FROM rollouts WHERE id = ANY(%s::text[]) ORDER BY seq FOR UPDATE SKIP LOCKED",
            (rollout_ids,),
        )
        rollouts = {row[1]: q.rollout_from_row(row) for row in await cur.fetchall()}
        if not rollouts:
            return 0
        cur = await c.execute(
            f"SELECT {_A_COLS} FROM attempts WHERE rollout_id = ANY(%s::text[]) AND status = 'running'"
            " AND deadline <= %s ORDER BY seq FOR UPDATE",
            (list(rollouts), t),
        )
        changed: list[tuple[Rollout, Attempt | None]] = []
        for row in await cur.fetchall():
            attempt = q.attempt_from_row(row)
            rollout = rollouts[attempt.rollout_id]
            reason, message = expiry_reason(rollout.config, attempt, t)
            q.end_attempt(rollout, attempt, AttemptStatus.TIMED_OUT, reason, message, None, now())
            changed.append((rollout, attempt))
        if changed:
            await self._save(c, changed)
        return len(changed)


async def _execute_rows(c: Conn, statement: LiteralString, rows: Sequence[tuple[Any, ...]]) -> None:
    """Run ``statement`` once per row: a plain execute for one row, a pipelined executemany for more."""
    if len(rows) == 1:
        await c.execute(statement, rows[0])
    elif rows:
        async with c.cursor() as cur:
            await cur.executemany(statement, rows)
