"""The built-in demo agent: a multi-turn, tool-using calculator agent on the plain ``openai`` client.

The task is an arithmetic question in words ("What is 17 times 12?"). The agent holds the two
numbers and offers the model one tool, ``calculator(operation)``: the model chooses the operation
(``add``, ``subtract`` or ``multiply``), the agent applies it and sends the result back, and the
model's final message must state the number. Reward: 1 if the last integer in the final answer is
right. (The model routes and reports; it never has to copy the operands, which a model of a million
parameters learns only slowly.)

A *chained* task (``lightning_rl.demo.two_step``) lists its numbers under ``operands`` and offers
``CHAINED_CALCULATOR_TOOL`` instead: the first call applies its operation to the first two numbers,
each later call to the previous result and the next number, so "What is 7 times 12, plus 5?" takes two
calls in a row. A task without ``operands`` runs exactly as before. A task with ``failures: n``
(``lightning_rl.demo.retry``) has a tool that fails transiently: its first ``n`` calls answer an error
that says to call again, and only then the result.

The demonstrations used to warm-start the tiny model reproduce a failure common to real agents:
the demonstrator often answers "from memory" instead of calling its tool, and those answers are
wrong. After the warm-start the model therefore knows the format but calls the tool only part of
the time, so its reward is clearly imperfect; RL has to discover from reward alone that calling the
tool (and copying its result) pays.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from lightning_rl.agent import LLM
from lightning_rl.tracing import emit_signal
from lightning_rl.types import Task

__all__ = [
    "CALCULATOR_TOOL",
    "CHAINED_CALCULATOR_TOOL",
    "SYSTEM_PROMPT",
    "calculator",
    "calculator_agent",
    "make_tasks",
    "split_tasks",
    "demonstrations",
    "reporting_demonstrations",
    "Demonstration",
    "after_tool_call",
    "tool_call_text",
    "score_answer",
    "TransientToolError",
]

SYSTEM_PROMPT = "Use the calculator tool, then answer."
MAX_TURNS = 3
CALCULATOR_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Apply add, subtract or multiply to the two numbers.",
        "parameters": {
            "type": "object",
            "properties": {"operation": {"type": "string", "enum": ["add", "subtract", "multiply"]}},
            "required": ["operation"],
        },
    },
}
CHAINED_CALCULATOR_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Apply add, subtract or multiply: the first call to the question's first two numbers, "
        "each later call to the previous result and the question's next number.",
        "parameters": CALCULATOR_TOOL["function"]["parameters"],
    },
}
_OPERATIONS = {"plus": "add", "minus": "subtract", "times": "multiply"}
_QUESTIONS = ("What is {a} {word} {b}?", "Compute {a} {word} {b}.", "How much is {a} {word} {b}?")


def calculator(operation: str, a: int, b: int) -> str:
    """Apply ``operation`` (add, subtract, multiply) to ``a`` and ``b``; ``ValueError`` otherwise."""
    if operation == "add":
        return str(a + b)
    if operation == "subtract":
        return str(a - b)
    if operation == "multiply":
        return str(a * b)
    raise ValueError(f"unknown operation {operation!r}: use add, subtract or multiply")


def score_answer(text: str | None, answer: int) -> float:
    """1.0 if the last integer in ``text`` equals ``answer``, else 0.0."""
    numbers = re.findall(r"-?\d+", text or "")
    return 1.0 if numbers and int(numbers[-1]) == answer else 0.0


class TransientToolError(RuntimeError):
    """The calculator failed for a reason of its own (busy, unreachable): the same call, made again,
    can succeed. Not the model's mistake, so it emits no ``tool_error`` signal."""


class _Operands:
    """What each calculator call applies its operation to: the task's ``a`` and ``b`` every time, or, for a
    chained task (``operands``), the first two numbers, then the previous result and the next number.
    The first ``failures`` calls of a task fail transiently, whatever they ask."""

    def __init__(self, task: dict[str, Any]) -> None:
        listed = task.get("operands")
        self.chained = listed is not None
        self.numbers = [int(x) for x in listed] if listed is not None else [int(task["a"]), int(task["b"])]
        self.value, self.used = self.numbers[0], 1
        self.failures = int(task.get("failures", 0))

    def apply(self, operation: str) -> str:
        """The tool's result; ``ValueError`` for an unknown operation or a call past the last number,
        ``TransientToolError`` while the task's transient failures last."""
        if self.failures > 0:
            self.failures -= 1
            raise TransientToolError("the calculator is busy right now (a transient failure); call it again")
        if not self.chained:
            return calculator(operation, self.numbers[0], self.numbers[1])
        if self.used >= len(self.numbers):
            raise ValueError("every number of the question is used; give the answer")
        result = calculator(operation, self.value, self.numbers[self.used])
        self.value, self.used = int(result), self.used + 1
        return result


async def calculator_agent(task: dict[str, Any], llm: LLM) -> float:
    """Answer ``task["question"]`` using the calculator tool; returns the reward."""
    client = llm.async_openai_client(max_retries=0, timeout=120.0)
    messages: list[Any] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": task["question"]},
    ]
    operands = _Operands(task)
    tool = CHAINED_CALCULATOR_TOOL if operands.chained else CALCULATOR_TOOL
    # a chained task: one call per operation, the answer, and one turn to spare for a failed call
    # (and one more for each transient failure of the tool)
    turns = (len(operands.numbers) + 1 if operands.chained else MAX_TURNS) + operands.failures
    try:
        for _ in range(turns):
            response = await client.chat.completions.create(
                model=llm.model, messages=messages, tools=[cast(Any, tool)], **dict(llm.sampling)
            )
            message = response.choices[0].message
            if not message.tool_calls:
                return score_answer(message.content, int(task["answer"]))
            messages.append(message.model_dump(include={"role", "content", "tool_calls"}, exclude_none=True))
            for call in message.tool_calls:
                name = getattr(call, "function", None)
                try:
                    if name is None or call.function.name != "calculator":
                        raise ValueError("unknown tool; the only tool is 'calculator'")
                    operation = str(json.loads(call.function.arguments).get("operation", ""))
                    result = operands.apply(operation)
                except TransientToolError as exc:  # the tool's failure, not the model's: no AIR signal
                    result = f"error: {exc}"
                except (ValueError, TypeError, AttributeError, json.JSONDecodeError) as exc:
                    emit_signal("tool_error", 1.0, tool_call_id=call.id)
                    result = f"error: {exc}"
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        return 0.0  # ran out of turns without answering
    finally:
        await client.close()


def make_tasks(n: int, *, seed: int, low: int = 2, high: int = 15) -> list[Task]:
    """``n`` distinct questions ``a <word> b`` with ``a, b`` in ``[low, high]``, deterministic in ``seed``."""
    rng = random.Random(seed)
    seen: set[tuple[int, str, int]] = set()
    tasks: list[Task] = []
    capacity = (high - low + 1) ** 2 * len(_OPERATIONS)
    if n > capacity:
        raise ValueError(f"only {capacity} distinct questions exist in [{low}, {high}]; ask for fewer.")
    words = sorted(_OPERATIONS)
    while len(tasks) < n:
        a, b, word = rng.randint(low, high), rng.randint(low, high), rng.choice(words)
        if (a, word, b) in seen:
            continue
        seen.add((a, word, b))
        operation = _OPERATIONS[word]
        data = {
            "question": rng.choice(_QUESTIONS).format(a=a, word=word, b=b),
            "a": a,
            "b": b,
            "operation": operation,
            "answer": int(calculator(operation, a, b)),
        }
        tasks.append(Task(id=f"{a}{word}{b}", input=data))
    return tasks


def split_tasks(n_train: int, n_val: int, *, seed: int) -> tuple[list[Task], list[Task]]:
    """Disjoint training and held-out tasks."""
    tasks = make_tasks(n_train + n_val, seed=seed)
    return tasks[:n_train], tasks[n_train:]


@dataclass(frozen=True)
class Demonstration:
    """One supervised example: the chat so far and the assistant text to produce next."""

    messages: list[dict[str, Any]]
    completion: str


def demonstrations(tasks: Sequence[Task], *, tool_rate: float, seed: int) -> list[Demonstration]:
    """Synthetic demonstrations: with probability ``tool_rate`` the demonstrator calls the tool and
    copies its result; otherwise it answers from memory, off by a few (the failure RL must fix)."""
    rng = random.Random(seed)
    out: list[Demonstration] = []
    for task in tasks:
        data: dict[str, Any] = task.input
        base = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": data["question"]}]
        answer = int(data["answer"])
        if rng.random() < tool_rate:
            arguments = json.dumps({"operation": data["operation"]})
            out.append(Demonstration(base, tool_call_text(arguments)))
            out.append(Demonstration(after_tool_call(base, arguments, answer), f"The answer is {answer}."))
        else:
            guess = answer + rng.choice([-1, 1]) * rng.randint(1, 9)
            out.append(Demonstration(base, f"I think it is {guess}."))
    return out


def reporting_demonstrations(
    tasks: Sequence[Task], *, per_task: int, seed: int, max_digits: int = 6
) -> list[Demonstration]:
    """Second-turn demonstrations in which the tool returned a random number and the expert reports it.

    Why not the true result: with ~300 training questions repeated for hundreds of steps, a small model
    can lower its loss by recalling each question's answer instead of reading the tool's message, and
    that does not carry over to unseen questions. A tool result unrelated to the question leaves copying
    as the only way to predict the answer. Why long numbers (1 to ``max_digits`` digits, a quarter of them
    negative): the tokenizer splits numbers into digits, so reporting one is an induction-style copy, and
    a skill that forms suddenly after a plateau whose length varies from run to run; more digits per
    example is more copying signal per step, which shortens and steadies the plateau (docs/learning.md).
    """
    rng = random.Random(seed)
    out: list[Demonstration] = []
    for task in tasks:
        data: dict[str, Any] = task.input
        arguments = json.dumps({"operation": data["operation"]})
        for _ in range(per_task):
            result = rng.choice((-1, 1, 1, 1)) * rng.randint(0, 10 ** rng.randint(1, max_digits))
            base = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": data["question"]}]
            history = after_tool_call(base, arguments, result)
            out.append(Demonstration(history, f"The answer is {result}."))
    return out


def tool_call_text(arguments: str) -> str:
    """A calculator call as the demonstrations write it (``sft_on_chats(canonical=True)`` re-renders it
    the way the chat template writes tool calls back)."""
    return f'<tool_call>{{"name": "calculator", "arguments": {arguments}}}</tool_call>'


def after_tool_call(base: list[dict[str, Any]], arguments: str, result: int, *, index: int = 0) -> list[dict[str, Any]]:
    """``base`` followed by the assistant's calculator call (id ``call_<index>``) and the tool's ``result``."""
    call_id = f"call_{index}"
    call = {"id": call_id, "type": "function", "function": {"name": "calculator", "arguments": arguments}}
    return [
        *base,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": str(result)},
    ]
