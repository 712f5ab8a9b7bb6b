"""Text-to-SQL tasks: a generated company database with templated questions, or the real Spider files.

The Agent Lightning paper trains its SQL agent on Spider. Spider is not shipped here (no downloads),
so :func:`build_database` and :func:`all_tasks` make a Spider-shaped stand-in locally: one SQLite
database of 100 employees in 12 departments over 8 cities, and every question that nine templates
ask about it (about 330 distinct questions), each with its gold query. Users who have Spider pass
its folder to :func:`load_spider` and get tasks of the same shape.

Why the queries are short and lower case: the tiny CPU model writes them token by token, and its
tokenizer (trained on ordinary lower-case English) spells upper-case SQL letter by letter. A lower
case query of a template is about 20 tokens, of which only the entity (a name, a department, a
city, an amount) changes from question to question: the model must *copy* it from the question,
which is the skill that transfers to held-out questions. Why the answers live in the database: a
question's answer (a salary, a count) depends on the seeded data, so a model cannot know it from
memory, only by running a query.

A task input is a dict: ``question``, ``db_path`` (a SQLite file), ``schema`` (the table
definitions the prompts show), ``gold_sql``, and for the generated questions ``template`` (the kind
of entity and the template's index in :data:`TEMPLATES`).
"""

from __future__ import annotations

import json
import random
import sqlite3
from pathlib import Path
from typing import Any

__all__ = [
    "TEMPLATES",
    "build_database",
    "all_tasks",
    "make_tasks",
    "split_tasks",
    "fake_entity",
    "variant",
    "load_spider",
    "schema_of",
    "execution_match",
    "run_query",
]

_CITIES = ["paris", "berlin", "madrid", "rome", "vienna", "lisbon", "oslo", "prague"]
_DEPARTMENTS = [
    "sales",
    "research",
    "support",
    "finance",
    "legal",
    "design",
    "marketing",
    "security",
    "training",
    "logistics",
    "quality",
    "planning",
]
_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
N_EMPLOYEES = 100

TEMPLATES: dict[str, list[tuple[str, str]]] = {
    "name": [
        ("What is the salary of {name}?", "select salary from emp where name = '{name}'"),
        ("Which department does {name} work in?", "select dept from emp where name = '{name}'"),
    ],
    "dept": [
        ("How many employees work in {dept}?", "select count(*) from emp where dept = '{dept}'"),
        ("List the employees of {dept}.", "select name from emp where dept = '{dept}'"),
        ("What is the highest salary in {dept}?", "select max(salary) from emp where dept = '{dept}'"),
        ("What is the lowest salary in {dept}?", "select min(salary) from emp where dept = '{dept}'"),
        ("In which city is the {dept} department?", "select city from dept where name = '{dept}'"),
    ],
    "amount": [
        ("How many employees earn more than {amount}?", "select count(*) from emp where salary > {amount}"),
    ],
    "city": [
        ("Which departments are in {city}?", "select name from dept where city = '{city}'"),
    ],
}
"""Question and gold query templates, by the entity they ask about."""


def _names(rng: random.Random, n: int) -> list[str]:
    """``n`` distinct two-syllable names (``bako``, ``ruzi``...): many entities, each a few tokens."""
    names: set[str] = set()
    while len(names) < n:
        names.add("".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(2)))
    return sorted(names)


def build_database(path: Path, *, seed: int = 0) -> Path:
    """Create (or replace) the example database at ``path``: tables ``emp`` and ``dept``.

    Every department has employees and a city, every city a department, and salaries run from
    30000 to 99000, so every templated question has a non-empty answer."""
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    cities = [_CITIES[i % len(_CITIES)] for i in range(len(_DEPARTMENTS))]
    rng.shuffle(cities)
    with sqlite3.connect(path) as db:
        # lower case on purpose: the prompts show this text (see the module docstring)
        db.execute("create table dept (name text, city text)")
        db.execute("create table emp (name text, dept text, salary integer)")
        db.executemany("insert into dept values (?, ?)", list(zip(_DEPARTMENTS, cities, strict=True)))
        for i, name in enumerate(_names(rng, N_EMPLOYEES)):
            dept = _DEPARTMENTS[i % len(_DEPARTMENTS)]
            db.execute("insert into emp values (?, ?, ?)", (name, dept, rng.randrange(30, 100) * 1000))
    return path


def schema_of(db_path: str | Path) -> str:
    """The database's table definitions, one per line (what the prompts show)."""
    with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND sql IS NOT NULL").fetchall()
    return "\n".join(" ".join(str(r[0]).split()) for r in rows)


def all_tasks(db_path: Path, *, seed: int = 0) -> list[dict[str, Any]]:
    """Every templated question about the database at ``db_path`` (built if missing), shuffled by ``seed``.

    Each (template, entity) pair appears once, so any split of this list has disjoint questions."""
    if not db_path.exists():
        build_database(db_path, seed=seed)
    # "CREATE TABLE" is spelt letter by letter by the tiny tokenizer: the prompts say "table"
    schema = schema_of(db_path).replace("CREATE TABLE ", "table ")
    with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as db:
        entities: dict[str, list[str]] = {
            "name": [str(r[0]) for r in db.execute("SELECT name FROM emp ORDER BY name")],
            "dept": [str(r[0]) for r in db.execute("SELECT name FROM dept ORDER BY name")],
            "city": [str(r[0]) for r in db.execute("SELECT DISTINCT city FROM dept ORDER BY city")],
            "amount": [str(a * 1000) for a in range(30, 90)],
        }
    tasks: list[dict[str, Any]] = []
    for kind, templates in TEMPLATES.items():
        for entity in entities[kind]:
            for index, (question, sql) in enumerate(templates):
                tasks.append(
                    {
                        "question": question.format(**{kind: entity}),
                        "gold_sql": sql.format(**{kind: entity}),
                        "db_path": str(db_path),
                        "schema": schema,
                        "template": [kind, index],
                    }
                )
    random.Random(seed).shuffle(tasks)
    return tasks


def fake_entity(kind: str, rng: random.Random) -> str:
    """A random entity of ``kind`` that need not be in the database (for demonstrations of copying)."""
    if kind == "amount":
        return str(rng.randrange(10, 100) * 1000)
    syllables = 2 if kind == "name" else rng.randint(2, 3)
    return "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(syllables))


def variant(task: dict[str, Any], entity: str) -> tuple[str, str]:
    """``task``'s question and gold query with ``entity`` in place of its own (templated tasks only)."""
    kind, index = task["template"]
    question, sql = TEMPLATES[kind][index]
    return question.format(**{kind: entity}), sql.format(**{kind: entity})


def make_tasks(n: int, db_path: Path, *, seed: int = 0) -> list[dict[str, Any]]:
    """The first ``n`` of :func:`all_tasks` (distinct questions).

    Raises:
        ValueError: more questions asked for than the templates make; ask for fewer.
    """
    tasks = all_tasks(db_path, seed=seed)
    if n > len(tasks):
        raise ValueError(f"only {len(tasks)} distinct questions exist; ask for at most that many.")
    return tasks[:n]


def split_tasks(
    db_path: Path, n_train: int, n_val: int, n_probe: int, *, seed: int = 0
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Disjoint training, held-out and probe questions (the probe ones only check the warm start)."""
    tasks = make_tasks(n_train + n_val + n_probe, db_path, seed=seed)
    return tasks[:n_train], tasks[n_train : n_train + n_val], tasks[n_train + n_val :]


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
