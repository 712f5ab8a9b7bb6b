"""The SQL store: every query and every storage primitive, written once for SQLite and PostgreSQL.

Why it looks like this:

* **One builder, two dialects.** The two databases differ in a handful of fragments: the parameter
  mark (``?`` / ``%s``), how a list is bound (``IN (SELECT value FROM json_each(?))`` / ``= ANY(?)``),
  row locks (none in SQLite, whose ``BEGIN IMMEDIATE`` locks the whole file; ``FOR UPDATE`` /
  ``SKIP LOCKED`` in PostgreSQL), index hints and a JSON cast. ``Dialect`` holds exactly those, and
  ``Statements`` builds every statement from them once, at import.
* **Operations without I/O.** An operation (claim, finish, add spans …) is a generator that yields
  the statements it wants run and receives their results; it never touches a connection. SQLite
  runs it synchronously on its writer thread (inside its group-commit transaction), PostgreSQL with
  ``await`` on a pooled connection (inside a retried transaction), so one piece of code serves both.
  This layer is hand-written rather than SQLAlchemy Core: the statements are fixed, a few dozen, and
  building them once costs nothing per call, while a query builder in the hot path would add to
  every claim and finish (see benchmarks/README.md, "Store throughput").
* **What happens** on claim, finish, cancel and expiry is decided by ``store._rules``, as in every
  backend; ops only load and save rows.
"""

from __future__ import annotations

import json
from abc import abstractmethod
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from lightning_rl.store import _rules as rules
from lightning_rl.store._core import AttemptChange, RolloutChange, RolloutQuery, SpanQuery, StoreCore
from lightning_rl.store._spanjson import dump_span
from lightning_rl.store.base import DEFAULT_HEARTBEAT_TIMEOUT_S, now
from lightning_rl.types import (
    TERMINAL_ROLLOUT,
    Attempt,
    Claim,
    Resources,
    Rollout,
    RolloutConfig,
    RolloutRequest,
    RolloutStatus,
    Span,
    StoreStats,
    Task,
)

__all__ = [
    "Dialect",
    "Statements",
    "SqlStore",
    "Op",
    "Rows",
    "Run",
    "Many",
    "Inserted",
    "ENDED",
    "Request",
    "SQLITE",
    "POSTGRES",
    "expire_op",
    "ROLLOUT_COLUMNS",
]

T = TypeVar("T")

ROLLOUT_COLUMNS = (
    "seq id task group_id mode resources_version config metadata status attempt_count created_at updated_at"
    " ended_at final_reward error"
).split()
"""Columns of the rollouts table, in the order ``_rollout`` reads them."""
ATTEMPT_COLUMNS = (
    "id rollout_id number worker_id status started_at heartbeat_at ended_at deadline error reward timeout_s gateway_key"
).split()
"""Columns of the attempts table that make an ``Attempt`` (the table also has ``seq`` and ``span_count``)."""
SPAN_COLUMNS = "trace_id span_id rollout_id attempt_id attempt_seq seq name data".split()
"""Columns of the spans table; ``data`` is the whole span as JSON, the rest are for lookups and order."""
_JSON_COLUMNS = {"task", "config", "metadata", "data"}
_ROLLOUT_MUTABLE = "status attempt_count updated_at ended_at final_reward error".split()
_ATTEMPT_MUTABLE = "status heartbeat_at ended_at deadline error reward".split()
WAITING_SQL = "(" + ", ".join(f"'{s.value}'" for s in rules.WAITING) + ")"
"""Statuses a claim takes rollouts from, as an SQL list (also in partial index predicates)."""
TERMINAL_SQL = "(" + ", ".join(sorted(f"'{s.value}'" for s in TERMINAL_ROLLOUT)) + ")"


# --------------------------------------------------------------------------------------------
# Dialects and statements
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Dialect:
    """The fragments in which SQLite and PostgreSQL differ; everything else is shared."""

    mark: str
    """The parameter mark."""
    in_list: str
    """``{col}`` matches any element of one bound list parameter (``?`` stands for the mark)."""
    list_param: Callable[[Sequence[Any]], Any]
    """Turns a Python list into that parameter."""
    json_mark: str
    """The mark for a JSON column's text value."""
    lock: str = ""
    """Appended to a SELECT whose rows the transaction will change."""
    skip_locked: str = ""
    """Appended to a claim's SELECT: rows another transaction holds are skipped, not waited for."""
    expiry_lock: str = ""
    """Appended to the expiry query (attempts ``a`` joined with their rollouts ``r``)."""
    waiting_index: str = ""
    """An index hint for the claim's SELECT."""
    expiry_index: str = ""
    """An index hint for the expiry query."""
    lock_resources: str | None = None
    """A statement that serialises resources publishers, if the transaction does not already."""
    returning: str = " RETURNING seq"
    """Appended to the rollout INSERT so it answers the new ``seq``. Empty for SQLite: RETURNING needs
    SQLite 3.35, and its driver reads ``lastrowid`` instead (``seq`` is the rowid)."""
    serial: str = "BIGSERIAL PRIMARY KEY"
    """The type of an auto-incremented primary key."""
    json_type: str = "JSON"
    """The type of a JSON column."""
    add_column: str = "ADD COLUMN IF NOT EXISTS"
    """How ``upgrade`` adds a column (SQLite has no ``IF NOT EXISTS`` there: it adds only missing ones)."""


SQLITE = Dialect(
    mark="?",
    in_list="{col} IN (SELECT value FROM json_each(?))",
    list_param=lambda values: json.dumps(list(values)),
    json_mark="?",
    waiting_index=" INDEXED BY rollouts_waiting",
    expiry_index=" INDEXED BY attempts_expiry",
    returning="",
    serial="INTEGER PRIMARY KEY AUTOINCREMENT",  # AUTOINCREMENT: a pruned rollout's seq is never reused
    json_type="TEXT",
    add_column="ADD COLUMN",
)
POSTGRES = Dialect(
    mark="%s",
    in_list="{col} = ANY(?::text[])",
    list_param=list,
    json_mark="?::json",
    lock=" FOR UPDATE",
    skip_locked=" FOR UPDATE SKIP LOCKED",
    expiry_lock=" FOR UPDATE OF a, r SKIP LOCKED",
    lock_resources="LOCK TABLE resources IN EXCLUSIVE MODE",
)


_SCHEMA = """
CREATE TABLE IF NOT EXISTS rollouts (
    seq {serial}, id TEXT NOT NULL UNIQUE, task {json} NOT NULL, group_id TEXT, mode TEXT NOT NULL,
    resources_version INTEGER, config {json} NOT NULL, metadata {json} NOT NULL, status TEXT NOT NULL,
    attempt_count INTEGER NOT NULL, created_at DOUBLE PRECISION NOT NULL, updated_at DOUBLE PRECISION NOT NULL,
    ended_at DOUBLE PRECISION, final_reward DOUBLE PRECISION, error TEXT
);
CREATE INDEX IF NOT EXISTS rollouts_waiting ON rollouts (seq) WHERE status IN {waiting};
CREATE INDEX IF NOT EXISTS rollouts_group ON rollouts (group_id, seq);
CREATE INDEX IF NOT EXISTS rollouts_ended ON rollouts (ended_at) WHERE ended_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS attempts (
    seq {serial}, id TEXT NOT NULL UNIQUE, rollout_id TEXT NOT NULL, number INTEGER NOT NULL,
    worker_id TEXT NOT NULL, status TEXT NOT NULL, started_at DOUBLE PRECISION NOT NULL,
    heartbeat_at DOUBLE PRECISION NOT NULL, ended_at DOUBLE PRECISION, deadline DOUBLE PRECISION, error TEXT,
    reward DOUBLE PRECISION, span_count INTEGER NOT NULL DEFAULT 0, timeout_s DOUBLE PRECISION, gateway_key TEXT
);
CREATE INDEX IF NOT EXISTS attempts_rollout ON attempts (rollout_id, number);
CREATE INDEX IF NOT EXISTS attempts_expiry ON attempts (deadline) WHERE status = 'running';
CREATE TABLE IF NOT EXISTS spans (
    trace_id TEXT NOT NULL, span_id TEXT NOT NULL, rollout_id TEXT NOT NULL, attempt_id TEXT NOT NULL,
    attempt_seq BIGINT NOT NULL, seq BIGINT NOT NULL, name TEXT NOT NULL, data {json} NOT NULL,
    PRIMARY KEY (trace_id, span_id)
);
CREATE INDEX IF NOT EXISTS spans_rollout ON spans (rollout_id, attempt_seq, seq);
CREATE INDEX IF NOT EXISTS spans_attempt ON spans (attempt_id, seq);
CREATE TABLE IF NOT EXISTS resources (version INTEGER PRIMARY KEY, data {json} NOT NULL);
"""
"""The tables; ``ROLLOUT_COLUMNS`` and friends name their columns (older ones lack some: ``upgrade``)."""
_ADDED_COLUMNS = (("timeout_s", "DOUBLE PRECISION"), ("gateway_key", "TEXT"))
"""Columns of ``attempts`` that tables an older Lightning created lack."""


class Statements:
    """Every statement of the SQL store in one dialect, built once."""

    def __init__(self, d: Dialect) -> None:
        self.d = d
        self.schema = _SCHEMA.format(serial=d.serial, json=d.json_type, waiting=WAITING_SQL)
        r_cols, a_cols = ", ".join(ROLLOUT_COLUMNS), ", ".join(ATTEMPT_COLUMNS)
        r_in_id = self.in_("id")
        self.rollouts = f"SELECT {r_cols} FROM rollouts"
        self.rollouts_by_id = self.sql(f"{self.rollouts} WHERE {r_in_id}")
        self.rollouts_locked = self.sql(f"{self.rollouts} WHERE {r_in_id} ORDER BY seq{d.lock}")
        self.rollout_of_attempt = self.sql(
            f"{self.rollouts} WHERE id = (SELECT rollout_id FROM attempts WHERE id = ?){d.lock}"
        )
        self.insert_rollout = self.sql(
            f"INSERT INTO rollouts ({', '.join(ROLLOUT_COLUMNS[1:])}) VALUES ({self.marks(ROLLOUT_COLUMNS[1:])})"
            f" ON CONFLICT (id) DO NOTHING{d.returning}"
        )
        self.update_rollout = self.sql(
            f"UPDATE rollouts SET {', '.join(c + ' = ?' for c in _ROLLOUT_MUTABLE)} WHERE id = ?"
        )
        self.waiting = self.sql(
            f"SELECT {r_cols} FROM rollouts{d.waiting_index} WHERE status IN {WAITING_SQL}"
            f" ORDER BY seq LIMIT ?{d.skip_locked}"
        )
        self.attempt = self.sql(f"SELECT {a_cols} FROM attempts WHERE id = ?")
        self.attempt_locked = self.sql(f"SELECT {a_cols} FROM attempts WHERE id = ?{d.lock}")
        self.attempts_of = self.sql(f"SELECT {a_cols} FROM attempts WHERE rollout_id = ? ORDER BY number")
        self.running_of = self.sql(
            f"SELECT {a_cols} FROM attempts WHERE {self.in_('rollout_id')} AND status = 'running' ORDER BY seq{d.lock}"
        )
        self.rollout_exists = self.sql("SELECT 1 FROM rollouts WHERE id = ?")
        self.insert_attempt = self.sql(f"INSERT INTO attempts ({a_cols}) VALUES ({self.marks(ATTEMPT_COLUMNS)})")
        self.update_attempt = self.sql(
            f"UPDATE attempts SET {', '.join(c + ' = ?' for c in _ATTEMPT_MUTABLE)} WHERE id = ?"
        )
        self.due = self.sql("SELECT 1 FROM attempts WHERE status = 'running' AND deadline <= ? LIMIT 1")
        self.overdue = self.sql(
            f"SELECT {', '.join('a.' + c for c in ATTEMPT_COLUMNS)}, {', '.join('r.' + c for c in ROLLOUT_COLUMNS)}"
            f" FROM attempts a{d.expiry_index} JOIN rollouts r ON r.id = a.rollout_id"
            f" WHERE a.status = 'running' AND a.deadline <= ? ORDER BY a.seq{d.expiry_lock}"
        )
        self.span_targets = self.sql(
            f"SELECT id, rollout_id, seq, span_count FROM attempts WHERE {self.in_('id')} ORDER BY seq{d.lock}"
        )
        self.span_keys = self.sql(
            f"SELECT trace_id, span_id FROM spans WHERE {self.in_('trace_id')} AND {self.in_('span_id')}"
        )
        self.insert_span = self.sql(
            f"INSERT INTO spans ({', '.join(SPAN_COLUMNS)}) VALUES ({self.marks(SPAN_COLUMNS)})"
            " ON CONFLICT (trace_id, span_id) DO NOTHING"
        )
        self.span_count = self.sql("UPDATE attempts SET span_count = ? WHERE id = ?")
        self.latest_version = "SELECT COALESCE(MAX(version), 0) FROM resources"
        self.resources_latest = "SELECT data FROM resources ORDER BY version DESC LIMIT 1"
        self.resources = self.sql("SELECT data FROM resources WHERE version = ?")
        self.insert_resources = self.sql(f"INSERT INTO resources (version, data) VALUES (?, {d.json_mark})")
        self.doomed = self.sql(
            f"SELECT id FROM rollouts WHERE ended_at IS NOT NULL AND ended_at < ? AND status IN {TERMINAL_SQL}"
            f" ORDER BY seq{d.lock}"
        )
        self.delete = [
            self.sql(f"DELETE FROM {table} WHERE {self.in_(column)}")
            for table, column in (("spans", "rollout_id"), ("attempts", "rollout_id"), ("rollouts", "id"))
        ]
        self.counts = [f"SELECT status, COUNT(*) FROM {table} GROUP BY status" for table in ("rollouts", "attempts")]
        self.totals = "SELECT (SELECT COUNT(*) FROM spans), (SELECT COUNT(*) FROM resources)"

    def upgrade(self, columns: set[str]) -> list[str]:
        """What brings tables an older Lightning created up to date, given the ``attempts`` table's
        ``columns``. Additive only, so older versions can still open them: the columns added since,
        and a deadline for running attempts that had none."""
        add = [f"ALTER TABLE attempts {self.d.add_column} {c} {t}" for c, t in _ADDED_COLUMNS if c not in columns]
        deadline = f"heartbeat_at + {DEFAULT_HEARTBEAT_TIMEOUT_S!r}"
        return [*add, f"UPDATE attempts SET deadline = {deadline} WHERE status = 'running' AND deadline IS NULL"]

    def sql(self, text: str) -> str:
        """``text`` (written with ``?`` marks) in this dialect."""
        return text.replace("?", self.d.mark) if self.d.mark != "?" else text

    def in_(self, column: str) -> str:
        """``column`` is any element of one list parameter (bind it with ``d.list_param``)."""
        return self.d.in_list.format(col=column)

    def marks(self, columns: Sequence[str]) -> str:
        return ", ".join(self.d.json_mark if c in _JSON_COLUMNS else "?" for c in columns)

    def select_rollouts(self, q: RolloutQuery) -> tuple[str, list[Any]]:
        """The SELECT for a ``RolloutQuery``, with its parameters."""
        where: list[str] = []
        params: list[Any] = []
        statuses = None if q.statuses is None else [s.value for s in q.statuses]
        for column, values in (("id", q.ids), ("status", statuses)):
            if values is not None:
                where.append(self.in_(column))
                params.append(self.d.list_param(values))
        for column, value in (("group_id", q.group_id), ("mode", q.mode)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        text = self.rollouts + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY seq LIMIT ? OFFSET ?"
        return self.sql(text), [*params, q.limit, q.offset]

    def select_spans(self, q: SpanQuery) -> tuple[str, list[Any]]:
        """The SELECT for a ``SpanQuery``, with its parameters."""
        filters = (("rollout_id", q.rollout_id), ("attempt_id", q.attempt_id), ("name", q.name))
        where = [f"{column} = ?" for column, value in filters if value is not None]
        text = "SELECT data FROM spans" + (" WHERE " + " AND ".join(where) if where else "")
        text += " ORDER BY attempt_seq, seq LIMIT ? OFFSET ?"
        return self.sql(text), [*(v for _, v in filters if v is not None), q.limit, q.offset]


# --------------------------------------------------------------------------------------------
# Requests an operation yields (the driver answers each one)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rows:
    """Run one statement; the answer is its rows."""

    text: str
    params: Sequence[Any] = ()


@dataclass(frozen=True)
class Run:
    """Run one statement; the answer is its row count. ``binary``: send parameters in binary (PostgreSQL)."""

    text: str
    params: Sequence[Any] = ()
    binary: bool = False


@dataclass(frozen=True)
class Many:
    """Run one statement per parameter row; the answer is None."""

    text: str
    rows: Sequence[Sequence[Any]]


@dataclass(frozen=True)
class Inserted:
    """Run a rollout ``INSERT`` per parameter row; the answer is each new row's ``seq``, or None where
    the insert did nothing (a conflict)."""

    text: str
    rows: Sequence[Sequence[Any]]


class _Ended:
    """Yielded after a write that ended a rollout: the driver wakes waiters once it has committed."""


ENDED = _Ended()
Request = Rows | Run | Many | Inserted | _Ended
Op = Generator[Request, Any, T]
"""An operation: yields requests, receives their answers, returns its result."""


# --------------------------------------------------------------------------------------------
# Row mapping
# --------------------------------------------------------------------------------------------


def _json_text(value: Any) -> str:
    # A driver may hand back a JSON column as text (SQLite) or as already-parsed data.
    return value if isinstance(value, str) else json.dumps(value)


def _rollout(row: Sequence[Any]) -> Rollout:
    metadata = row[7]
    return Rollout(
        seq=row[0],
        id=row[1],
        task=Task.model_validate_json(_json_text(row[2])),
        group_id=row[3],
        mode=row[4],
        resources_version=row[5],
        config=RolloutConfig.model_validate_json(_json_text(row[6])),
        metadata=json.loads(metadata) if isinstance(metadata, str) else metadata,
        status=RolloutStatus(row[8]),
        attempt_count=row[9],
        created_at=row[10],
        updated_at=row[11],
        ended_at=row[12],
        final_reward=row[13],
        error=row[14],
    )


def _rollout_params(r: Rollout) -> tuple[Any, ...]:
    """Values for ``ROLLOUT_COLUMNS[1:]`` (JSON columns as text)."""
    return (
        *(r.id, r.task.model_dump_json(), r.group_id, r.mode, r.resources_version, r.config.model_dump_json()),
        *(json.dumps(r.metadata), r.status.value, r.attempt_count, r.created_at, r.updated_at, r.ended_at),
        *(r.final_reward, r.error),
    )


def _attempt(row: Sequence[Any]) -> Attempt:
    return Attempt(**dict(zip(ATTEMPT_COLUMNS, row, strict=True)))


def _attempt_params(a: Attempt) -> tuple[Any, ...]:
    return tuple(a.status.value if c == "status" else getattr(a, c) for c in ATTEMPT_COLUMNS)


def _mutable(model: Rollout | Attempt, columns: Sequence[str]) -> tuple[Any, ...]:
    """``columns`` then ``id``: the parameters of an UPDATE built from them (``status`` first)."""
    return (model.status.value, *(getattr(model, c) for c in columns[1:]), model.id)


# --------------------------------------------------------------------------------------------
# Operations
# --------------------------------------------------------------------------------------------


def _save(s: Statements, pairs: Sequence[tuple[Rollout, Attempt | None]]) -> Op[None]:
    """Write back rollouts (and attempts) changed by a ``_rules`` step."""
    yield Many(s.update_rollout, [_mutable(r, _ROLLOUT_MUTABLE) for r, _ in pairs])
    attempts = [_mutable(a, _ATTEMPT_MUTABLE) for _, a in pairs if a is not None]
    if attempts:
        yield Many(s.update_attempt, attempts)
    if any(r.status in TERMINAL_ROLLOUT for r, _ in pairs):
        yield ENDED


def expire_op(s: Statements, t: float) -> Op[int]:
    """Time out running attempts past their deadline (rows another transaction holds are skipped:
    that one is finishing or expiring them)."""
    rows: list[Sequence[Any]] = yield Rows(s.overdue, (t,))
    split = len(ATTEMPT_COLUMNS)
    changed: list[tuple[Rollout, Attempt | None]] = []
    for row in rows:
        attempt, rollout = _attempt(row[:split]), _rollout(row[split:])
        rules.expire(rollout, attempt, t, now())
        changed.append((rollout, attempt))
    if changed:
        yield from _save(s, changed)
    return len(changed)


def enqueue_op(s: Statements, requests: list[RolloutRequest]) -> Op[list[Rollout]]:
    ids = s.d.list_param(list(dict.fromkeys(r.id for r in requests)))
    found = {row[1]: _rollout(row) for row in (yield Rows(s.rollouts_by_id, (ids,)))}
    fresh = rules.plan_enqueue(requests, found, now())
    if fresh:
        seqs: list[Any] = yield Inserted(s.insert_rollout, [_rollout_params(r) for r in fresh])
        lost = [r.id for r, seq in zip(fresh, seqs, strict=True) if seq is None]
        for rollout, seq in zip(fresh, seqs, strict=True):
            rollout.seq = seq or 0
        if lost:  # another client inserted these ids since our SELECT (PostgreSQL only)
            for row in (yield Rows(s.rollouts_by_id, (s.d.list_param(lost),))):
                stored = _rollout(row)
                rules.check_resend(stored, found[stored.id])
                found[stored.id] = stored
    return [found[r.id] for r in requests]


def claim_op(s: Statements, worker_id: str, n: int, timeout_s: float | None) -> Op[list[Claim]]:
    rows: list[Sequence[Any]] = yield Rows(s.waiting, (n,))
    t = now()
    claims: list[Claim] = []
    for row in rows:
        rollout = _rollout(row)
        claims.append(Claim(rollout=rollout, attempt=rules.open_attempt(rollout, worker_id, t, timeout_s)))
    if claims:
        yield Many(s.update_rollout, [_mutable(c.rollout, _ROLLOUT_MUTABLE) for c in claims])
        yield Many(s.insert_attempt, [_attempt_params(c.attempt) for c in claims])
    return claims


def update_attempt_op(s: Statements, attempt_id: str, change: AttemptChange) -> Op[tuple[Rollout, Attempt]]:
    # Lock the rollout first, then its attempt: the order every operation uses (no deadlocks).
    rows: list[Sequence[Any]] = yield Rows(s.rollout_of_attempt, (attempt_id,))
    if not rows:
        raise rules.attempt_not_found(attempt_id)
    rollout = _rollout(rows[0])
    attempt = _attempt((yield Rows(s.attempt_locked, (attempt_id,)))[0])
    change(rollout, attempt)
    yield from _save(s, [(rollout, attempt)])
    return rollout, attempt


def update_rollouts_op(s: Statements, ids: list[str], change: RolloutChange) -> Op[list[Rollout]]:
    unique = s.d.list_param(list(dict.fromkeys(ids)))
    rollouts = {row[1]: _rollout(row) for row in (yield Rows(s.rollouts_locked, (unique,)))}
    for rid in ids:
        if rid not in rollouts:
            raise rules.rollout_not_found(rid)
    running = {a.rollout_id: a for a in map(_attempt, (yield Rows(s.running_of, (unique,))))}
    changed: list[tuple[Rollout, Attempt | None]] = []
    for rollout in rollouts.values():
        attempt = running.get(rollout.id)
        if change(rollout, attempt):
            changed.append((rollout, attempt))
    if changed:
        yield from _save(s, changed)
    return [rollouts[rid] for rid in ids]


def select_op(text: str, params: Sequence[Any], parse: Callable[[Sequence[Any]], T]) -> Op[list[T]]:
    return [parse(row) for row in (yield Rows(text, params))]


def select_attempts_op(s: Statements, rollout_id: str) -> Op[list[Attempt] | None]:
    if not (yield Rows(s.rollout_exists, (rollout_id,))):
        return None
    return [_attempt(row) for row in (yield Rows(s.attempts_of, (rollout_id,)))]


def insert_spans_op(s: Statements, spans: list[Span], insert: Callable[[list[tuple[Any, ...]]], Request]) -> Op[int]:
    """``insert`` makes the request that inserts span rows (the dialect's fastest way)."""
    aids = s.d.list_param(sorted({span.attempt_id for span in spans}))
    targets: dict[str, tuple[str, int, int]] = {r[0]: (r[1], r[2], r[3]) for r in (yield Rows(s.span_targets, (aids,)))}
    rules.check_span_targets(spans, {aid: v[0] for aid, v in targets.items()})
    key_lists = (s.d.list_param([x.trace_id for x in spans]), s.d.list_param([x.span_id for x in spans]))
    seen: set[tuple[str, str]] = {(r[0], r[1]) for r in (yield Rows(s.span_keys, key_lists))}
    counts = {aid: v[2] for aid, v in targets.items()}
    rows: list[tuple[Any, ...]] = []
    for span in spans:
        key = (span.trace_id, span.span_id)
        if key in seen:
            continue
        seen.add(key)
        counts[span.attempt_id] += 1
        seq = counts[span.attempt_id]
        where = (span.rollout_id, span.attempt_id, targets[span.attempt_id][1], seq)
        rows.append((span.trace_id, span.span_id, *where, span.name, dump_span(span, seq)))
    if not rows:
        return 0
    added: int = yield insert(rows)
    yield Many(s.span_count, [(count, aid) for aid, count in counts.items() if count != targets[aid][2]])
    return added


def insert_resources_op(s: Statements, make: Callable[[int], Resources]) -> Op[Resources]:
    if s.d.lock_resources:
        yield Run(s.d.lock_resources)
    ((latest,),) = yield Rows(s.latest_version)
    res = make(int(latest) + 1)
    yield Run(s.insert_resources, (res.version, res.model_dump_json()))
    return res


def select_resources_op(s: Statements, version: int | None) -> Op[tuple[Resources | None, int]]:
    rows: list[Sequence[Any]] = yield (Rows(s.resources_latest) if version is None else Rows(s.resources, (version,)))
    if rows:
        return Resources.model_validate_json(_json_text(rows[0][0])), 0
    ((latest,),) = yield Rows(s.latest_version)
    return None, int(latest)


def delete_ended_op(s: Statements, older_than: float) -> Op[int]:
    doomed = [row[0] for row in (yield Rows(s.doomed, (older_than,)))]
    if not doomed:
        return 0
    deleted = 0
    for statement in s.delete:
        deleted = yield Run(statement, (s.d.list_param(doomed),))
    return deleted


def count_op(s: Statements) -> Op[StoreStats]:
    rollouts = yield Rows(s.counts[0])
    attempts = yield Rows(s.counts[1])
    ((spans, versions),) = yield Rows(s.totals)
    return StoreStats(
        rollouts_by_status=dict(rollouts), attempts_by_status=dict(attempts), spans=spans, resources_versions=versions
    )


# --------------------------------------------------------------------------------------------
# The store: primitives as operations, run by the backend's driver
# --------------------------------------------------------------------------------------------


class SqlStore(StoreCore):
    """The storage primitives for SQL databases. A subclass sets ``_s`` (its dialect's statements)
    and implements ``_run``: run an operation (made afresh by ``op()`` for every try) in one
    transaction, expiring overdue attempts first when asked, and call ``_rollouts_ended`` after
    committing one that yielded ``ENDED``."""

    _s: Statements

    @abstractmethod
    async def _run(self, op: Callable[[], Op[T]], *, write: bool = True, expire: bool = False) -> T: ...

    @abstractmethod
    def _insert_span_rows(self, rows: list[tuple[Any, ...]]) -> Request:
        """The request that inserts span rows (``SPAN_COLUMNS``); its answer is how many were new."""

    async def _insert_rollouts(self, requests: list[RolloutRequest]) -> list[Rollout]:
        return await self._run(lambda: enqueue_op(self._s, requests))

    async def _claim(self, worker_id: str, n: int, timeout_s: float | None) -> list[Claim]:
        return await self._run(lambda: claim_op(self._s, worker_id, n, timeout_s), expire=True)

    async def _update_attempt(self, attempt_id: str, change: AttemptChange) -> tuple[Rollout, Attempt]:
        return await self._run(lambda: update_attempt_op(self._s, attempt_id, change), expire=True)

    async def _update_rollouts(self, ids: list[str], change: RolloutChange) -> list[Rollout]:
        return await self._run(lambda: update_rollouts_op(self._s, ids, change))

    async def _expire(self, t: float) -> int:
        return await self._run(lambda: expire_op(self._s, t))

    async def _select_rollouts(self, query: RolloutQuery) -> list[Rollout]:
        text, params = self._s.select_rollouts(query)
        return await self._run(lambda: select_op(text, params, _rollout), expire=True)

    async def _get_attempt(self, attempt_id: str) -> Attempt | None:
        found = await self._run(lambda: select_op(self._s.attempt, (attempt_id,), _attempt), expire=True)
        return found[0] if found else None

    async def _select_attempts(self, rollout_id: str) -> list[Attempt] | None:
        return await self._run(lambda: select_attempts_op(self._s, rollout_id), expire=True)

    async def _insert_spans(self, spans: list[Span]) -> int:
        return await self._run(lambda: insert_spans_op(self._s, spans, self._insert_span_rows))

    async def _select_spans(self, query: SpanQuery) -> list[Span]:
        text, params = self._s.select_spans(query)

        def parse(row: Sequence[Any]) -> Span:
            return Span.model_validate_json(_json_text(row[0]))

        return await self._run(lambda: select_op(text, params, parse), write=False)

    async def _insert_resources(self, make: Callable[[int], Resources]) -> Resources:
        return await self._run(lambda: insert_resources_op(self._s, make))

    async def _select_resources(self, version: int | None) -> tuple[Resources | None, int]:
        return await self._run(lambda: select_resources_op(self._s, version), write=False)

    async def _delete_ended(self, older_than: float) -> int:
        return await self._run(lambda: delete_ended_op(self._s, older_than))

    async def _count(self) -> StoreStats:
        return await self._run(lambda: count_op(self._s), expire=True)
