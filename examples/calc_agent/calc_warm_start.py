"""The calc agent's warm start: demonstrations in AutoGen's own requests, fed to the core staged warm start.

A random tiny model gets no reward, so GRPO has nothing to climb; a model fine-tuned on perfect
demonstrations leaves RL nothing to show. ``staged_warm_start`` (lightning_rl.trainer) makes the base
in between: it first learns the skill from an expert (call the calculator with the question's
expression, report the tool's result) until greedy decoding reproduces held-out probe demonstrations,
then picks up a sloppy demonstrator's habit of answering from memory (wrong). RL must discover from
reward alone that the calculator pays.

Every demonstration is the request ``AssistantAgent`` really sends (``requests``), so what the model
learns is what the gateway will render during training:

- the first call: the system message, the user's question (AutoGen adds ``"name": "user"``) and the
  calculator's schema;
- after a calculator call, ``reflect_on_tool_use=True`` makes a second call with the assistant's tool
  call (``content`` null) and the tool's result appended, and **no tools** (AutoGen passes
  ``tool_choice="none"`` and an empty tool list, so the system turn has no ``<tools>`` block).

``tests/autogen/test_calc_agent_example.py`` checks this by rendering both against the requests a real
agent sends through the gateway.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calc_autogen_agent import SYSTEM_PROMPT, calculator
from calc_tasks import ITEMS, NAMES, PROBLEMS, operands, problem_key

from lightning_rl.trainer.staged_warm_start import StagedWarmStartConfig, staged_warm_start
from lightning_rl.trainer.warm_start import ChatDemo
from lightning_rl.types import Task

__all__ = [
    "WarmStartSettings",
    "tool_schema",
    "first_request",
    "reflection_request",
    "tool_call_text",
    "expert_calls",
    "copy_calls",
    "reports",
    "true_reports",
    "sloppy",
    "warm_start",
]


@dataclass(frozen=True)
class WarmStartSettings:
    """The warm start's knobs (the defaults are the measured configuration; see the README)."""

    seed: int = 0
    expert_steps: int = 2000
    """Phase 1 runs at most this many steps; it stops once both probes pass ``skill_target``."""
    skill_target: float = 0.6
    copy_calls_per_task: int = 2
    """Extra calculator-call demonstrations per training task, on the same wording with fresh operands of
    1-3 digits: copying the operands into the expression is a slow skill, and numbers unrelated to any
    task leave copying (not recalling a training question's expression) as the only way to predict them."""
    reports_per_task: int = 3
    """Report demonstrations per training task, each with a random tool result (1-6 digits): reporting is
    the other slow copying skill, and a random result cannot be recalled from the question."""
    polish_steps: int = 150
    habit_steps: int = 200
    habit_target: float = 0.25
    habit_greedy_target: float = 0.1
    habit_tool_rate: float = 0.3
    """How often the sloppy demonstrator uses the calculator (otherwise it answers from memory, wrong)."""
    batch_size: int = 32
    lr: float = 1e-3
    progress: bool = True


def tool_schema() -> dict[str, Any]:
    """The calculator as AutoGen's OpenAI client sends it (``FunctionTool`` schema, OpenAI function format)."""
    from autogen_core.tools import FunctionTool

    schema = FunctionTool(calculator, description=calculator.__doc__ or "").schema
    function: dict[str, Any] = {"name": schema["name"], "description": schema.get("description", "")}
    function["parameters"] = schema.get("parameters", {})
    function["strict"] = schema.get("strict", False)
    return {"type": "function", "function": function}


def first_request(question: str) -> list[dict[str, Any]]:
    """The messages of AssistantAgent's first call for ``question`` (sent with the calculator's schema)."""
    return [{"content": SYSTEM_PROMPT, "role": "system"}, {"role": "user", "name": "user", "content": question}]


def reflection_request(question: str, expression: str, result: str) -> list[dict[str, Any]]:
    """The messages of the reflection call after the calculator computed ``expression`` (sent without tools)."""
    arguments = json.dumps({"expression": expression})
    call = {"id": "call_0", "function": {"arguments": arguments, "name": "calculator"}, "type": "function"}
    return [
        *first_request(question),
        {"role": "assistant", "tool_calls": [call], "content": None},
        {"content": result, "role": "tool", "tool_call_id": "call_0"},
    ]


def tool_call_text(expression: str) -> str:
    """The tiny model's tool-call syntax for a calculator call (what the gateway parses back into a call)."""
    return f'<tool_call>{{"name": "calculator", "arguments": {json.dumps({"expression": expression})}}}</tool_call>'


def _report(answer: float | str) -> str:
    return f"The answer is {answer}."


def expert_calls(tasks: Sequence[Task], tools: list[dict[str, Any]]) -> list[ChatDemo]:
    """First calls of an expert: the calculator with the question's expression."""
    return [(first_request(t.input["question"]), tools, tool_call_text(t.input["expression"])) for t in tasks]


def copy_calls(
    tasks: Sequence[Task], tools: list[dict[str, Any]], *, per_task: int, exclude: set[str], seed: int
) -> list[ChatDemo]:
    """Expert first calls on each task's wording with fresh operands of 1-3 digits (never a problem in
    ``exclude``: the held-out and probe problems stay unseen)."""
    rng = random.Random(seed)
    out: list[ChatDemo] = []
    for task in tasks:
        problem = PROBLEMS[int(task.input["problem"])]
        made = 0
        while made < per_task:
            high = 10 ** rng.randint(1, 3) - 1
            a, b = operands(problem, rng, low=1 if problem.operator in "+*" else 2, high=max(high, 12))
            expression = problem.expression(a, b)
            if problem_key(expression) in exclude:
                continue
            question = problem.question(a, b, name=rng.choice(NAMES), item=rng.choice(ITEMS))
            out.append((first_request(question), tools, tool_call_text(expression)))
            made += 1
    return out


def reports(tasks: Sequence[Task], *, per_task: int, seed: int, max_digits: int = 6) -> list[ChatDemo]:
    """Reflection calls in which the calculator returned a random number (a quarter negative) and the
    expert reports it: nothing but copying the tool's message predicts the answer."""
    rng = random.Random(seed)
    out: list[ChatDemo] = []
    for task in tasks:
        for _ in range(per_task):
            result = rng.choice((-1, 1, 1, 1)) * rng.randint(0, 10 ** rng.randint(1, max_digits))
            messages = reflection_request(task.input["question"], task.input["expression"], str(result))
            out.append((messages, None, _report(result)))
    return out


def true_reports(tasks: Sequence[Task]) -> list[ChatDemo]:
    """Reflection calls with the calculator's real result, reported (the probe of the report skill)."""
    out: list[ChatDemo] = []
    for task in tasks:
        question, expression = task.input["question"], task.input["expression"]
        result = calculator(expression)
        out.append((reflection_request(question, expression, result), None, _report(result)))
    return out


def sloppy(tasks: Sequence[Task], tools: list[dict[str, Any]], *, tool_rate: float, seed: int) -> list[ChatDemo]:
    """A demonstrator who uses the calculator ``tool_rate`` of the time and otherwise answers from memory,
    off by 1-9 (the failure RL has to fix)."""
    rng = random.Random(seed)
    out: list[ChatDemo] = []
    for task in tasks:
        if rng.random() < tool_rate:
            out += expert_calls([task], tools) + true_reports([task])
        else:
            guess = int(task.input["answer"]) + rng.choice([-1, 1]) * rng.randint(1, 9)
            out.append((first_request(task.input["question"]), tools, _report(guess)))
    return out


def warm_start(
    model_dir: Path,
    out_dir: Path,
    train: Sequence[Task],
    probe: Sequence[Task],
    *,
    exclude: set[str],
    settings: WarmStartSettings,
) -> Path:
    """Skill, polish, habit (``staged_warm_start``) on demonstrations of ``train``; probes on ``probe``.

    ``exclude`` holds the problem keys the copy demonstrations must avoid (held-out and probe
    problems). Saves an HF folder and ``warm_start.json`` at ``out_dir`` and returns it.
    """
    s = settings
    tools = [tool_schema()]
    expert = [
        *expert_calls(train, tools),
        *copy_calls(train, tools, per_task=s.copy_calls_per_task, exclude=exclude, seed=s.seed),
        *reports(train, per_task=s.reports_per_task, seed=s.seed),
    ]
    probe_calls = expert_calls(probe, tools)
    staged_warm_start(
        model_dir,
        out_dir,
        expert=expert,
        sloppy=sloppy(train, tools, tool_rate=s.habit_tool_rate, seed=s.seed + 1),
        probes={"tool_call": probe_calls, "report": true_reports(probe)},
        habit_prompts=probe_calls,
        config=StagedWarmStartConfig(
            seed=s.seed,
            expert_steps=s.expert_steps,
            skill_target=s.skill_target,
            polish_steps=s.polish_steps,
            habit_steps=s.habit_steps,
            habit_target=s.habit_target,
            habit_greedy_target=s.habit_greedy_target,
            batch_size=s.batch_size,
            lr=s.lr,
            habit_lr=s.lr,
            progress=s.progress,
        ),
    )
    return out_dir
