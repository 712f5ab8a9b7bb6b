"""What a query builder would cost the SQL store per statement: SQLAlchemy Core against ``store._sql``.

The SQL stores (SQLite, PostgreSQL) share one hand-written statement layer, ``store._sql``, that
builds every statement once per dialect at import; a call only picks a prebuilt string. Issue 46
allowed SQLAlchemy Core instead if it kept the store's throughput. This measures the part that
decides it: building (and compiling) the claim's ``SELECT … FOR UPDATE SKIP LOCKED`` with SQLAlchemy
Core on every call, next to reading the prebuilt string. A rollout costs the server 1-3 ms of CPU in
total (``store_throughput.py``) and runs 6-10 statements, so a builder's per-statement cost matters.

    uv run python benchmarks/sql_builder_cost.py

Needs ``sqlalchemy`` (it comes with the ``mlflow`` extra; the store itself does not use it).
"""

from __future__ import annotations

import timeit

__all__ = ["main"]


def main() -> None:
    import sqlalchemy as sa
    from sqlalchemy.dialects import postgresql, sqlite

    from lightning_rl.store import _sql

    rollouts = sa.Table("rollouts", sa.MetaData(), *(sa.Column(c) for c in _sql.ROLLOUT_COLUMNS))

    def build() -> sa.Select[tuple[object, ...]]:
        waiting = rollouts.c.status.in_(["queued", "requeued"])
        return sa.select(*rollouts.c).where(waiting).order_by(rollouts.c.seq).limit(1)

    n = 2000
    print(f"sqlalchemy {sa.__version__}; per call, median of 5 rounds of {n}:")
    rows = [("SQLAlchemy Core: build the claim's select", build)]
    for name, dialect in (("sqlite", sqlite.dialect()), ("postgresql", postgresql.dialect())):
        locked = name == "postgresql"

        def compiled(dialect: sa.Dialect = dialect, locked: bool = locked) -> str:
            query = build().with_for_update(skip_locked=True) if locked else build()
            return str(query.compile(dialect=dialect))

        rows.append((f"SQLAlchemy Core: build and compile it ({name})", compiled))
    statements = _sql.Statements(_sql.POSTGRES)
    rows.append(("store._sql: the prebuilt statement", lambda: statements.waiting))
    for label, fn in rows:
        times = sorted(timeit.repeat(fn, number=n, repeat=5))
        print(f"  {label}: {times[2] / n * 1e6:.2f} us")


if __name__ == "__main__":
    main()
