"""PostgreSQL store: one store shared by runners and trainers on many machines.

Why it looks like this:

* **psycopg 3, async, a small pool** of connections owned by the store (``pool_size``), so
  concurrent coroutines run their transactions side by side without a pool dependency.
* **Row locks, always in one order** (the rollout first, then its attempt; several rows by ``seq``),
  so concurrent finishes, cancels, heartbeats and expiries do not deadlock; if PostgreSQL still
  reports a deadlock or a serialization failure the whole operation is retried.
* **Claims use** ``SELECT … FOR UPDATE SKIP LOCKED``: two workers never take the same rollout and
  never wait for each other.
* **The queries and operations are ``store._sql``'s**, shared with SQLite; this module owns the
  connections and transactions and answers the statements an operation yields. Expiry runs before
  claims and queries as one indexed query that finds nothing in the common case; only then does a
  transaction lock the overdue attempts (skipping those another transaction holds).
* **Clocks.** Timestamps come from the caller's clock (``time.time()``), like the other backends;
  hosts sharing one store should keep their clocks in sync (NTP).
* ``schema=`` puts the tables in their own PostgreSQL schema (created if absent), which is how
  tests isolate themselves and how one database can hold several stores.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable, Generator
from typing import Any, Final, LiteralString, TypeVar, cast

from lightning_rl.errors import InvalidRequestError, StoreUnavailableError
from lightning_rl.store import _rules as rules
from lightning_rl.store import _sql as sq
from lightning_rl.store.base import now

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

_RETRIES: Final = 8
_RETRYABLE = (pg_errors.DeadlockDetected, pg_errors.SerializationFailure, pg_errors.LockNotAvailable)
_LOCK_KEY: Final = 0x4C6967687452  # advisory lock serialising table creation ("LightR")
_STATEMENTS: Final = sq.Statements(sq.POSTGRES)
_INSERT_SPANS: Final = (
    "INSERT INTO spans (trace_id, span_id, rollout_id, attempt_id, attempt_seq, seq, name, data)"
    " SELECT t, s, r, a, aseq, seq, n, d::json FROM unnest("
    "%s::text[], %s::text[], %s::text[], %s::text[], %s::bigint[], %s::bigint[], %s::text[], %s::text[]"
    ") AS u(t, s, r, a, aseq, seq, n, d) ON CONFLICT (trace_id, span_id) DO NOTHING"
)
"""Span rows as one array per column (sent in binary: no per-element escaping), one statement."""


def _trusted(text: str) -> LiteralString:
    """Mark SQL built by ``store._sql`` from constant fragments (never from user input) as literal."""
    return cast(LiteralString, text)


_SCHEMA: Final = _trusted(
    "CREATE TABLE IF NOT EXISTS lightning_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);" + _STATEMENTS.schema
)


class PostgresStore(sq.SqlStore):
    """A store in a PostgreSQL database (see the module docstring). Create it with ``await PostgresStore.open(dsn)``."""

    def __init__(self, dsn: str, schema: str | None, pool_size: int, poll_s: float) -> None:
        """Use ``PostgresStore.open``; this only records the settings."""
        if pool_size < 1:
            raise InvalidRequestError(f"pool_size must be >= 1, got {pool_size}.")
        super().__init__()
        self._s = _STATEMENTS
        self._dsn = dsn
        self._schema = schema
        self._poll_s = poll_s
        self._idle: list[Conn] = []
        self._slots = asyncio.Semaphore(pool_size)
        self._closed = False

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
            await conn.execute(
                "INSERT INTO lightning_meta (key, value) VALUES ('schema_version', %s) ON CONFLICT (key) DO NOTHING",
                (str(rules.LAYOUT_VERSION),),
            )
            row = await (await conn.execute("SELECT value FROM lightning_meta WHERE key = 'schema_version'")).fetchone()
            rules.check_layout(row and row[0], f"PostgreSQL store schema {schema or 'public'}", "another schema")
            columns = await conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema()"
                " AND table_name = 'attempts'"
            )
            upgrade = _STATEMENTS.upgrade({name for (name,) in await columns.fetchall()})
            if len(upgrade) > 1:  # columns to add: one opener at a time
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
            await conn.execute(_trusted(";".join(upgrade)))
        return store

    def __repr__(self) -> str:
        return f"PostgresStore(schema={self._schema!r})"

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

    async def _run(self, op: Callable[[], sq.Op[T]], *, write: bool = True, expire: bool = False) -> T:
        """Run ``op`` in a transaction, after expiring overdue attempts when asked (one indexed query
        when none are due), with the driver's errors turned into the store's."""
        try:
            async with self._connection() as conn:
                if expire:
                    t = now()
                    if await (await conn.execute(_trusted(self._s.due), (t,))).fetchone():
                        await self._transact(conn, lambda: sq.expire_op(self._s, t))
                return await self._transact(conn, op)
        except psycopg.DataError as exc:
            raise InvalidRequestError(
                f"PostgreSQL cannot store this value: {exc}; remove NUL characters from ids, names and errors."
            ) from exc
        except psycopg.OperationalError as exc:
            raise StoreUnavailableError(
                f"PostgreSQL store failed: {exc}; the operation was not applied, retry it later."
            ) from exc

    async def _transact(self, conn: Conn, op: Callable[[], sq.Op[T]]) -> T:
        """One transaction, started over (with a fresh ``op()``) on a deadlock or serialization failure."""
        for attempt in range(_RETRIES):
            ended: list[bool] = []
            try:
                async with conn.transaction():
                    result = await _drive(conn, op(), ended)
            except _RETRYABLE:
                if attempt == _RETRIES - 1:
                    raise
                await asyncio.sleep(0.005 * (attempt + 1))
                continue
            if ended:
                self._rollouts_ended()
            return result
        raise AssertionError("unreachable")  # pragma: no cover

    def _insert_span_rows(self, rows: list[tuple[Any, ...]]) -> sq.Request:
        return sq.Run(_INSERT_SPANS, [list(column) for column in zip(*rows, strict=True)], binary=True)


async def _drive(c: Conn, op: Generator[sq.Request, Any, T], ended: list[bool]) -> T:
    """Run an operation, answering each statement it yields (``ended`` gets an item on ``sq.ENDED``)."""
    answer: Any = None
    try:
        while True:
            answer = await _answer(c, op.send(answer), ended)
    except StopIteration as stop:
        return stop.value


async def _answer(c: Conn, request: sq.Request, ended: list[bool]) -> Any:
    if isinstance(request, sq.Rows):
        return await (await c.execute(_trusted(request.text), request.params)).fetchall()
    if isinstance(request, sq.Run):
        return (await c.execute(_trusted(request.text), request.params, binary=request.binary)).rowcount
    if isinstance(request, sq.Many):
        if len(request.rows) == 1:  # a plain execute: one round trip less than a pipeline
            await c.execute(_trusted(request.text), request.rows[0])
        elif request.rows:
            async with c.cursor() as cur:
                await cur.executemany(_trusted(request.text), request.rows)
        return None
    if isinstance(request, sq.Inserted):
        out: list[Any] = []
        async with c.cursor() as cur:
            await cur.executemany(_trusted(request.text), request.rows, returning=True)
            async for result in cur.results():
                row = await result.fetchone()
                out.append(None if row is None else row[0])
        return out
    assert request is sq.ENDED
    ended.append(True)
    return None
