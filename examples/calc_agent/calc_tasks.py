"""Calc-X-style tasks: arithmetic word problems, generated locally or read from the real Calc-X files.

Calc-X (the task of the Agent Lightning paper) pairs a word problem with its numeric result; the
agent must turn the words into arithmetic, compute it with a calculator tool and state the number.
``make_tasks`` generates problems of the same shape offline, so the example needs no download;
``load_calcx`` reads the real files (JSON lines with at least a ``question`` and a ``result``) when
you have them. Reward: the stated number equals the result.

The generated problems are one-step with small operands (2-20) on purpose: the calculator takes an
``expression`` string, so the model must copy the operands from the question into its call and then
copy the tool's result into its answer. A model of a million parameters learns such copying slowly;
short numbers keep it learnable in a CPU warm start, while the answers (up to 400) are still not
something it can get right from memory.
"""

from __future__ import annotations

import ast
import json
import math
import operator
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from lightning_rl.types import Task

__all__ = [
    "LOW",
    "HIGH",
    "NAMES",
    "ITEMS",
    "PROBLEMS",
    "Problem",
    "operands",
    "problem_key",
    "make_tasks",
    "split_tasks",
    "load_calcx",
    "evaluate",
    "parse_number",
    "final_number",
    "score_answer",
]

NAMES = ("Ann", "Ben", "Mia", "Tom", "Zoe", "Sam")
ITEMS = ("apples", "books", "coins", "cards", "pens", "eggs")
LOW, HIGH = 2, 20
"""The operands of generated problems (a quotient's divisor and quotient: 2-12)."""


@dataclass(frozen=True)
class Problem:
    """One kind of one-step word problem: its wording and the operator that solves it."""

    template: str
    operator: str

    def question(self, a: int, b: int, *, name: str, item: str) -> str:
        """The problem's text for operands ``a`` and ``b``."""
        return self.template.format(a=a, b=b, name=name, item=item)

    def expression(self, a: int, b: int) -> str:
        """What a calculator call should compute, e.g. ``7 + 5``."""
        return f"{a} {self.operator} {b}"


PROBLEMS: tuple[Problem, ...] = (
    Problem("{name} has {a} {item} and buys {b} more. How many {item} does {name} have now?", "+"),
    Problem("{name} had {a} {item} and gave away {b}. How many {item} are left?", "-"),
    Problem("There are {a} boxes with {b} {item} in each. How many {item} are there in total?", "*"),
    Problem("{name} shares {a} {item} equally among {b} friends. How many {item} does each friend get?", "/"),
)


def operands(problem: Problem, rng: random.Random, low: int = LOW, high: int = HIGH) -> tuple[int, int]:
    """Operands for ``problem`` in ``[low, high]`` with a whole, positive answer (a difference has a > b,
    a quotient divides exactly: divisor and quotient drawn from ``[low, min(high, 12)]``)."""
    if problem.operator == "-":
        b = rng.randint(low, high - 1)
        return rng.randint(b + 1, high), b
    if problem.operator == "/":
        b, quotient = rng.randint(low, min(high, 12)), rng.randint(low, min(high, 12))
        return b * quotient, b
    return rng.randint(low, high), rng.randint(low, high)


def problem_key(expression: str) -> str:
    """What makes two generated problems the same problem: their expression (names and items aside)."""
    return " ".join(expression.split())


def make_tasks(n: int, *, seed: int) -> list[Task]:
    """``n`` distinct generated one-step word problems, deterministic in ``seed``.

    Distinct means distinct expressions: two tasks never differ only in a name or an item, so
    splitting the list gives held-out problems the training set does not contain. Each task's
    input has ``question``, ``expression`` (what a calculator call should compute, used only by the
    warm-start demonstrations), ``answer`` and ``problem`` (the index into ``PROBLEMS``).

    Raises:
        ValueError: Fewer than ``n`` distinct problems exist (about 950 do).
    """
    rng = random.Random(seed)
    seen: set[str] = set()
    tasks: list[Task] = []
    for _ in range(n * 50):
        if len(tasks) == n:
            break
        index = rng.randrange(len(PROBLEMS))
        problem = PROBLEMS[index]
        a, b = operands(problem, rng)
        name, item = rng.choice(NAMES), rng.choice(ITEMS)
        expr = problem.expression(a, b)
        if problem_key(expr) in seen:
            continue
        seen.add(problem_key(expr))
        data = {
            "question": problem.question(a, b, name=name, item=item),
            "expression": expr,
            "answer": int(evaluate(expr)),
            "problem": index,
        }
        tasks.append(Task(id=f"gen-{len(tasks)}", input=data))
    if len(tasks) < n:
        raise ValueError(f"could only generate {len(tasks)} distinct problems; ask for fewer than {n}.")
    return tasks


def split_tasks(n_train: int, n_val: int, n_probe: int, *, seed: int) -> tuple[list[Task], list[Task], list[Task]]:
    """Disjoint training, held-out and probe problems from one draw.

    The probe problems are neither trained on nor validated on: the warm start decodes them to
    check that a skill has formed (``calc_warm_start``), so the held-out score stays unseen."""
    tasks = make_tasks(n_train + n_val + n_probe, seed=seed)
    return tasks[:n_train], tasks[n_train : n_train + n_val], tasks[n_train + n_val :]


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
