"""Calc-X-style tasks: arithmetic word problems, generated locally or read from the real Calc-X files.

Calc-X (the task of the Agent Lightning paper) pairs a word problem with its numeric result; the
agent must turn the words into arithmetic, compute it with a calculator tool and state the number.
``make_tasks`` generates problems of the same shape offline (one- and two-step, integer answers),
so the example needs no download; ``load_calcx`` reads the real files (JSON lines with at least a
``question`` and a ``result``) when you have them. Reward: the stated number equals the result.
"""

from __future__ import annotations

import ast
import json
import math
import operator
import random
import re
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

from lightning_rl.types import Task

__all__ = ["make_tasks", "load_calcx", "evaluate", "parse_number", "final_number", "score_answer"]

_NAMES = ("Ann", "Ben", "Mia", "Tom", "Zoe", "Sam")
_ITEMS = ("apples", "books", "coins", "cards", "pens", "eggs")

# (template, expression template, sampler of the numbers): every answer is a whole number.
_Problem = tuple[str, str, Callable[[random.Random], dict[str, int]]]
_PROBLEMS: tuple[_Problem, ...] = (
    (
        "{name} has {a} {item} and buys {b} more. How many {item} does {name} have now?",
        "{a} + {b}",
        lambda r: {"a": r.randint(2, 60), "b": r.randint(2, 60)},
    ),
    (
        "{name} had {a} {item} and gave away {b}. How many {item} are left?",
        "{a} - {b}",
        lambda r: (lambda b: {"a": b + r.randint(1, 50), "b": b})(r.randint(2, 40)),
    ),
    (
        "There are {a} boxes with {b} {item} in each. How many {item} are there in total?",
        "{a} * {b}",
        lambda r: {"a": r.randint(2, 12), "b": r.randint(2, 12)},
    ),
    (
        "{name} shares {a} {item} equally among {b} friends. How many {item} does each friend get?",
        "{a} / {b}",
        lambda r: (lambda b: {"a": b * r.randint(2, 12), "b": b})(r.randint(2, 9)),
    ),
    (
        "{name} buys {a} packs of {b} {item} and loses {c}. How many {item} are left?",
        "{a} * {b} - {c}",
        lambda r: (lambda a, b: {"a": a, "b": b, "c": r.randint(1, a * b - 1)})(r.randint(2, 9), r.randint(2, 9)),
    ),
)


def make_tasks(n: int, *, seed: int) -> list[Task]:
    """``n`` distinct generated word problems, deterministic in ``seed``.

    Each task's input has ``question``, ``expression`` (what a calculator call should compute,
    used only by the warm-start demonstrations) and ``answer``.
    """
    rng = random.Random(seed)
    seen: set[str] = set()
    tasks: list[Task] = []
    for _ in range(n * 50):
        if len(tasks) == n:
            break
        template, expression, sample = rng.choice(_PROBLEMS)
        numbers = sample(rng)
        question = template.format(name=rng.choice(_NAMES), item=rng.choice(_ITEMS), **numbers)
        if question in seen:
            continue
        seen.add(question)
        expr = expression.format(**numbers)
        answer = int(evaluate(expr))
        tasks.append(Task(id=f"gen-{len(tasks)}", input={"question": question, "expression": expr, "answer": answer}))
    if len(tasks) < n:
        raise ValueError(f"could only generate {len(tasks)} distinct problems; ask for fewer than {n}.")
    return tasks


_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}


def evaluate(expression: str) -> float:
    """The value of an arithmetic expression (numbers, + - * / // % ** and parentheses).

    Raises:
        ValueError: Anything else (names, calls, huge powers), or a syntax error.
        ZeroDivisionError: Division by zero.
    """

    def walk(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError("exponent too large; keep powers at most 64")
            return _BINARY[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](walk(node.operand))
        raise ValueError(f"not arithmetic: {ast.unparse(node)!r}; use numbers, + - * / and parentheses")

    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"cannot read {expression!r} as arithmetic: {exc.msg}") from exc
    return float(walk(tree))


def parse_number(text: str) -> float | None:
    """A number as Calc-X writes results: ``42``, ``-3.5``, ``1_000``, ``1,000``, ``3/4``, ``50%``; else None."""
    cleaned = text.strip().replace("_", "").replace(",", "").rstrip(".")
    percent = cleaned.endswith("%")
    cleaned = cleaned.rstrip("%").strip()
    try:
        value = float(Fraction(cleaned))
    except (ValueError, ZeroDivisionError):
        return None
    return value / 100 if percent else value


def load_calcx(path: str | Path, *, limit: int | None = None) -> list[Task]:
    """Tasks from a Calc-X JSON-lines file (one problem per line).

    A line needs ``question`` and ``result`` (``result_float`` is preferred when present, as it
    is already numeric); ``id`` names the task. Lines whose result is not a number are skipped.

    Raises:
        ValueError: A line is not JSON or lacks ``question``/``result``; the message names the line.
    """
    tasks: list[Task] = []
    with Path(path).open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                row: dict[str, Any] = json.loads(line)
                question = str(row["question"])
                raw = row.get("result_float", row["result"])
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise ValueError(
                    f"{path}:{number} is not a Calc-X row (JSON with 'question' and 'result'): {exc}"
                ) from exc
            answer = float(raw) if isinstance(raw, int | float) else parse_number(str(raw))
            if answer is None or not math.isfinite(answer):
                continue
            tasks.append(Task(id=str(row.get("id", f"calcx-{number}")), input={"question": question, "answer": answer}))
            if limit is not None and len(tasks) >= limit:
                break
    return tasks


def final_number(text: str | None) -> float | None:
    """The number the agent states last (``Answer: 12`` or just the last number in its text)."""
    found = re.findall(r"-?\d[\d,_]*(?:\.\d+)?(?:/\d+)?%?", text or "")
    for candidate in reversed(found):
        value = parse_number(candidate)
        if value is not None:
            return value
    return None


def score_answer(text: str | None, answer: float) -> float:
    """1.0 if the last number in ``text`` equals ``answer`` (relative tolerance 1e-4), else 0.0."""
    value = final_number(text)
    return 1.0 if value is not None and math.isclose(value, answer, rel_tol=1e-4, abs_tol=1e-6) else 0.0
