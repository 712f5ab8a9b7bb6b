"""Text-to-SQL tasks: a small company database with templated questions, or the real Spider files.

The Agent Lightning paper trains its SQL agent on Spider. Spider is not shipped here (no downloads),
so :func:`make_tasks` builds a Spider-shaped stand-in locally: one SQLite database and questions
generated from templates, each with its gold query. Users who have Spider pass its folder to
:func:`load_spider` and get tasks of the same shape.

A task input is a dict: ``question``, ``db_path`` (a SQLite file), ``schema`` (the ``CREATE TABLE``
lines the prompts show), ``gold_sql``.
"""

from __future__ import annotations

import json
import random
import sqlite3
from pathlib import Path
from typing import Any

__all__ = ["build_database", "make_tasks", "load_spider", "schema_of", "execution_match", "run_query"]

_DEPARTMENTS = [("sales", "paris"), ("research", "berlin"), ("support", "madrid"), ("finance", "rome")]
_FIRST = ["ana", "ben", "cleo", "dan", "eva", "finn", "gia", "hugo", "ines", "jon", "kai", "lea"]

_TEMPLATES: list[tuple[str, str]] = [
    ("How many employees work in {dept}?", "SELECT COUNT(*) FROM employees WHERE dept = '{dept}'"),
    ("List the names of employees in {dept}.", "SELECT name FROM employees WHERE dept = '{dept}'"),
    ("What is the highest salary in {dept}?", "SELECT MAX(salary) FROM employees WHERE dept = '{dept}'"),
    ("Which employees earn more than {amount}?", "SELECT name FROM employees WHERE salary > {amount}"),
    ("In which city is the {dept} department?", "SELECT city FROM departments WHERE name = '{dept}'"),
    (
        "How many employees work in {city}?",
        "SELECT COUNT(*) FROM employees JOIN departments ON employees.dept = departments.name "
        "WHERE departments.city = '{city}'",
    ),
]


def build_database(path: Path, *, seed: int = 0) -> Path:
    """Create (or replace) the example database at ``path``: ``employees`` and ``departments``."""
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE departments (name TEXT PRIMARY KEY, city TEXT)")
        db.execute("CREATE TABLE employees (id INTEGER PRIMARY KEY, name TEXT, dept TEXT, salary INTEGER)")
        db.executemany("INSERT INTO departments VALUES (?, ?)", _DEPARTMENTS)
        for i, name in enumerate(_FIRST):
            dept = _DEPARTMENTS[i % len(_DEPARTMENTS)][0]
            db.execute("INSERT INTO employees VALUES (?, ?, ?, ?)", (i + 1, name, dept, rng.randrange(30, 90) * 1000))
    return path


def schema_of(db_path: str | Path) -> str:
    """The database's ``CREATE TABLE`` statements, one per line (what the prompts show)."""
    with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND sql IS NOT NULL").fetchall()
    return "\n".join(" ".join(str(r[0]).split()) for r in rows)


def make_tasks(n: int, db_path: Path, *, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` templated questions over the database at ``db_path`` (built if missing)."""
    if not db_path.exists():
        build_database(db_path, seed=seed)
    rng = random.Random(seed)
    schema = schema_of(db_path)
    tasks: list[dict[str, Any]] = []
    for _ in range(n):
        question, sql = rng.choice(_TEMPLATES)
        dept, city = rng.choice(_DEPARTMENTS)
        fill = {"dept": dept, "city": city, "amount": rng.randrange(4, 9) * 10_000}
        tasks.append(
            {
                "question": question.format(**fill),
                "gold_sql": sql.format(**fill),
                "db_path": str(db_path),
                "schema": schema,
            }
        )
    return tasks


def load_spider(spider_dir: str | Path, split: str = "dev", *, limit: int | None = None) -> list[dict[str, Any]]:
    """Tasks from a Spider download: ``<dir>/<split>.json`` and ``<dir>/database/<db_id>/<db_id>.sqlite``.

    ``split`` is ``dev`` or ``train_spider`` (the file names Spider uses). Entries whose database
    file is missing are skipped.

    Raises:
        FileNotFoundError: ``<dir>/<split>.json`` does not exist (point ``--spider-dir`` at the
            folder that holds ``dev.json`` and ``database/``).
    """
    root = Path(spider_dir)
    questions_file = root / f"{split}.json"
    if not questions_file.exists():
        raise FileNotFoundError(f"{questions_file} not found; --spider-dir must hold {split}.json and database/")
    entries: list[dict[str, Any]] = json.loads(questions_file.read_text())
    schemas: dict[str, str] = {}
    tasks: list[dict[str, Any]] = []
    for entry in entries:
        db_id = str(entry["db_id"])
        db_path = root / "database" / db_id / f"{db_id}.sqlite"
        if not db_path.exists():
            continue
        if db_id not in schemas:
            schemas[db_id] = schema_of(db_path)
        tasks.append(
            {
                "question": entry["question"],
                "gold_sql": entry["query"],
                "db_path": str(db_path),
                "schema": schemas[db_id],
            }
        )
        if limit is not None and len(tasks) >= limit:
            break
    return tasks


def run_query(db_path: str | Path, sql: str, *, max_rows: int = 50) -> list[tuple[Any, ...]]:
    """Run ``sql`` read-only on the database; raises ``sqlite3.Error`` (or ``ValueError`` if empty)."""
    if not sql.strip():
        raise ValueError("empty query: write one SELECT statement")
    with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as db:
        return db.execute(sql).fetchmany(max_rows)


def execution_match(db_path: str | Path, predicted: str | None, gold: str) -> bool:
    """Spider's execution accuracy: both queries return the same rows (order ignored)."""
    if not predicted:
        return False
    try:
        got = run_query(db_path, predicted, max_rows=10_000)
    except (sqlite3.Error, ValueError):
        return False
    want = run_query(db_path, gold, max_rows=10_000)
    return sorted(map(repr, got)) == sorted(map(repr, want))
