"""Two-operation calculator questions: a task where good behaviour needs more than the demonstrations show.

"What is 7 times 12, plus 5?" takes two calculator calls in a row (``CHAINED_CALCULATOR_TOOL``: the
first call applies its operation to 7 and 12, the second to the result and 5), then the answer. The
demonstrations show only one-operation questions in the same format: one call, then the report of the
tool's result. Imitating them on a two-operation question gives a single call and the report of the
intermediate result (84): reward 0. What earns the reward, a second call with the second operation
after a tool result, appears in no demonstration; a policy can only find it by trying, which is what
RL adds over imitation (issue 41, ``benchmarks/beyond_imitation.py``, docs/beyond_imitation.md).

Why this task rather than a tool that fails transiently, or a choice of whether to call at all: the
move RL has to find is a single, well-defined one (call again, with the second operation), the
reward says exactly whether it was found, and imitation cannot reach it by construction, since the
demonstrations never show a call after a tool result. (A few more SFT steps on a few two-operation
demonstrations then beat RL on every attempt, docs/beyond_imitation.md; the second task,
``lightning_rl.demo.retry``, is the flaky tool.) The agent is the demo's unchanged
``calculator_agent``: a task that lists its ``operands`` switches it to the chained tool.

Every split is deterministic in the seed: the one-operation tasks the demonstrations are written
from (and one-operation validation tasks outside them), and disjoint two-operation training,
validation (for choosing the SFT's steps and learning rate) and held-out test tasks.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lightning_rl.demo.calculator import (
    CHAINED_CALCULATOR_TOOL,
    SYSTEM_PROMPT,
    Demonstration,
    after_tool_call,
    calculator,
    demonstrations,
    reporting_demonstrations,
    tool_call_text,
)
from lightning_rl.trainer.warm_start import ChatDemo
from lightning_rl.types import Task

__all__ = [
    "TwoStepSplits",
    "make_chained_tasks",
    "two_step_splits",
    "one_step_demonstrations",
    "two_step_demonstrations",
    "chats",
]

_WORDS = {"plus": "add", "minus": "subtract", "times": "multiply"}
_ONE = ("What is {a} {w1} {b}?", "Compute {a} {w1} {b}.", "How much is {a} {w1} {b}?")
_TWO = (
    "What is {a} {w1} {b}, {w2} {c}?",
    "Compute {a} {w1} {b}, then {w2} {c}.",
    "How much is {a} {w1} {b}, {w2} {c}?",
)


def make_chained_tasks(n: int, *, operations: int, seed: int, low: int = 2, high: int = 15) -> list[Task]:
    """``n`` distinct questions with ``operations`` (1 or 2) operations on numbers in ``[low, high]``,
    deterministic in ``seed``, each applied left to right ("7 times 12, plus 5" is (7 * 12) + 5).

    The input holds ``question``, ``operands``, ``operations`` and ``answer`` (plus ``a``, ``b`` and
    ``operation``, the first operation's, which the demo's demonstration writers read).

    Raises:
        ValueError: ``operations`` is not 1 or 2, or fewer than ``n`` distinct questions exist.
    """
    if operations not in (1, 2):
        raise ValueError(f"operations must be 1 or 2, got {operations}.")
    span = high - low + 1
    capacity = (span * len(_WORDS)) ** operations * span
    if n > capacity:
        raise ValueError(f"only {capacity} distinct {operations}-operation questions exist in [{low}, {high}].")
    rng = random.Random(seed)
    words = sorted(_WORDS)
    seen: set[tuple[object, ...]] = set()
    tasks: list[Task] = []
    while len(tasks) < n:
        numbers = [rng.randint(low, high) for _ in range(operations + 1)]
        chosen = [rng.choice(words) for _ in range(operations)]
        key = (*numbers, *chosen)
        if key in seen:
            continue
        seen.add(key)
        ops = [_WORDS[w] for w in chosen]
        value = numbers[0]
        for op, number in zip(ops, numbers[1:], strict=True):
            value = int(calculator(op, value, number))
        template = rng.choice(_ONE if operations == 1 else _TWO)
        fields = {"a": numbers[0], "b": numbers[1], "w1": chosen[0]}
        if operations == 2:
            fields |= {"c": numbers[2], "w2": chosen[1]}
        data = {
            "question": template.format(**fields),
            "operands": numbers,
            "operations": ops,
            "answer": value,
            "a": numbers[0],
            "b": numbers[1],
            "operation": ops[0],
        }
        tasks.append(Task(id="".join(f"{x}{w}" for x, w in zip(numbers, [*chosen, ""], strict=True)), input=data))
    return tasks


@dataclass(frozen=True)
class TwoStepSplits:
    """The task sets of one seed: ``demo`` (one operation, what the demonstrations are written from),
    disjoint two-operation ``train`` (RL's tasks), ``val`` (choosing the SFT's steps and learning rate)
    and ``test`` (held-out, decoded greedily before and after) sets, and ``val_one``, one-operation
    questions outside ``demo``: how well a model imitates the demonstrations, which breaks ties when no
    SFT model solves a two-operation question."""

    demo: list[Task]
    train: list[Task]
    val: list[Task]
    test: list[Task]
    val_one: list[Task]
    demo_two: list[Task] = dataclasses.field(default_factory=list[Task])
    """Two-operation tasks the (few) two-operation demonstrations are written from, outside every other
    split; empty unless ``two_step_splits(n_demo_two=...)`` asks for some."""


def two_step_splits(
    seed: int, *, n_demo: int = 300, n_train: int = 300, n_val: int = 50, n_test: int = 100, n_demo_two: int = 0
) -> TwoStepSplits:
    """The splits of ``seed`` (see ``TwoStepSplits``; ``val_one`` has ``n_val`` tasks); the same seed gives
    the same tasks, and ``n_demo_two`` leaves the other splits as they are (they are drawn first)."""
    one = make_chained_tasks(n_demo + n_val, operations=1, seed=seed)
    n_two = n_train + n_val + n_test
    two = make_chained_tasks(n_two + n_demo_two, operations=2, seed=seed + 10_000)
    return TwoStepSplits(
        one[:n_demo],
        two[:n_train],
        two[n_train : n_train + n_val],
        two[n_train + n_val : n_two],
        one[n_demo:],
        two[n_two:],
    )


def one_step_demonstrations(tasks: Sequence[Task], *, seed: int, report_per_task: int = 1) -> list[Demonstration]:
    """The expert's demonstrations of one-operation ``tasks``: call the calculator with the question's
    operation, then report the tool's result; plus ``report_per_task`` reports of a random tool result
    per task (``reporting_demonstrations``: copying the tool's message must not be replaceable by
    recalling each question's answer). Never a second call: that is what the demonstrations lack."""
    expert = demonstrations(tasks, tool_rate=1.0, seed=seed)
    reports = reporting_demonstrations(tasks, per_task=report_per_task, seed=seed) if report_per_task else []
    return [*expert, *reports]


def two_step_demonstrations(tasks: Sequence[Task]) -> list[Demonstration]:
    """The expert's demonstrations of two-operation ``tasks``, every turn of them: call the calculator
    with the first operation; after its result, call it with the second; after that result, report it.
    Benchmarks mix a few of these into the one-operation ones (``beyond_imitation.py --two-op-demos``):
    the skill is then shown, but rarely, which is how an agent's logs usually cover a harder case."""
    out: list[Demonstration] = []
    for task in tasks:
        data: dict[str, Any] = task.input
        first, second = (json.dumps({"operation": op}) for op in data["operations"])
        numbers = [int(x) for x in data["operands"]]
        middle = int(calculator(data["operations"][0], numbers[0], numbers[1]))
        base = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": data["question"]}]
        after_first = after_tool_call(base, first, middle)
        after_second = after_tool_call(after_first, second, int(data["answer"]), index=1)
        out += [
            Demonstration(base, tool_call_text(first)),
            Demonstration(after_first, tool_call_text(second)),
            Demonstration(after_second, f"The answer is {data['answer']}."),
        ]
    return out


def chats(demos: Sequence[Demonstration]) -> list[ChatDemo]:
    """``demos`` as supervised chats with the chained calculator tool (the tool the agent offers on
    these tasks), ready for ``lightning_rl.trainer.warm_start.sft_on_chats``."""
    return [(d.messages, [CHAINED_CALCULATOR_TOOL], d.completion) for d in demos]
