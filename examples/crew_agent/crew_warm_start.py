"""Staged warm start of the tiny model on demonstrations captured from the real crew.

A randomly initialised tiny model never emits a well-formed tool call, so every rollout scores 0
and GRPO has no advantage to follow; a model fine-tuned on perfect demonstrations leaves RL nothing
to show. ``lightning_rl.trainer.staged_warm_start`` builds the base in between: it *can* look prices
up (skill, until greedy decoding passes probes on items outside training and validation) but has
the habit of answering from memory (a short pass on a sloppy demonstrator), so RL must discover from
reward alone that the tool pays.

The demonstrations are not written by hand: the unchanged crew (``crew_agent.build_crew``) runs on
the questions inside a ``GatewayHarness``, whose scripted upstream plays a demonstrator. Each request
the upstream receives is exactly what CrewAI sends during training (its system and task prompts,
the tool schema, the tool's real results, the writer's context with the researcher's report), and
the demonstrator's reply becomes the target completion:

* the **expert** researcher looks the item up as asked; when the name is misspelt (``pink-desk``)
  the tool's error suggests the catalogue name and the expert looks that up (``pink desk``); then it
  reports the tool's result verbatim (``"26 euros"``);
* the **sloppy** researcher does that on only ``habit_tool_rate`` of the questions and otherwise
  reports a price from memory (a random one: wrong);
* the **writer**, in both, answers with the last number of the researcher's report. The writer is
  frozen during RL but shares the model, so its copying skill is formed here and probed like the
  researcher's.

Copying is the slow skill for a model this small: the item's name into the lookup, the price into
the report and the writer's answer. With the true names and prices it could instead memorise the
180 training items, which is useless on held-out ones. So, as in the demo
(``lightning_rl.demo.calculator.reporting_demonstrations``), most expert examples are turns of
captured crews with the item swapped for a made-up name (``"vok trisa"``, misspelt ``"vok-trisa"``)
or the price for a random number of 1 to 4 digits: the same rendered requests, in which copying is
the only way to predict the answer.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crew_agent import crew_agent
from crew_tasks import CATALOGUE, make_tasks, misspell

from lightning_rl.engine.tiny import default_tiny_model
from lightning_rl.testing import FakeReply, FakeToolCall, GatewayHarness
from lightning_rl.trainer.staged_warm_start import StagedWarmStart, StagedWarmStartConfig, staged_warm_start
from lightning_rl.types import Task

__all__ = [
    "Demo",
    "Crewed",
    "WarmStartSettings",
    "capture",
    "repriced",
    "renamed",
    "tokenizer_corpus",
    "crew_tiny_model",
    "staged_config",
    "warm_start",
]

Demo = tuple[list[dict[str, Any]], list[dict[str, Any]], str]
"""(messages, tools, completion): one model turn, as the chat the crew sent and the text to produce."""

_ASKED = re.compile(r'Look up: "(.+?)"\.\n')
_SUGGESTED = re.compile(r"did you mean '(.+?)'\?")
_PRICE = re.compile(r"(\d+) euros")


@dataclass
class Crewed:
    """The model turns of one captured crew, by kind: the researcher's tool call(s) and final report
    (with the request it answered), and the writer's answer; ``price`` is the number the report gave."""

    calls: list[Demo] = field(default_factory=list[Demo])
    report: Demo | None = None
    writer: Demo | None = None
    price: int | None = None


@dataclass
class _Demonstrator:
    """Answers each upstream request as the expert or the sloppy demonstrator would, and files the pair."""

    rng: random.Random
    use_tool: bool = True
    crew: Crewed = field(default_factory=Crewed)

    def reply(self, body: dict[str, Any]) -> FakeReply | str:
        messages: list[dict[str, Any]] = body["messages"]
        tools: list[dict[str, Any]] = body.get("tools") or []
        if not tools:  # the writer: the last number of the researcher's report
            numbers = re.findall(r"\d+", _context(messages))
            answer = numbers[-1] if numbers else "0"
            self.crew.writer = (messages, tools, answer)
            return answer
        last = messages[-1]
        content = str(last.get("content") or "")
        suggested = _SUGGESTED.search(content) if last["role"] == "tool" else None
        if self.use_tool and (last["role"] != "tool" or suggested):
            if suggested:  # the lookup failed: look up the item the error suggests
                item = suggested.group(1)
            else:  # the first turn: look the item up as asked
                question = next((str(m.get("content") or "") for m in messages if m["role"] == "user"), "")
                found = _ASKED.search(question)
                item = found.group(1) if found else ""
            call = FakeReply(tool_calls=[FakeToolCall("lookup_price", {"item": item})])
            self.crew.calls.append((messages, tools, _render_call(call)))
            return call
        report = str(last.get("content") or "") if self.use_tool else f"{self.rng.randint(10, 99)} euros"
        self.crew.report = (messages, tools, report)
        price = _PRICE.search(report)
        self.crew.price = int(price.group(1)) if price else None
        return report


def _context(messages: Sequence[Mapping[str, Any]]) -> str:
    """The researcher's report as CrewAI hands it to the writer (the end of the writer's task prompt)."""
    return str(messages[-1].get("content") or "").rpartition("context you're working with:")[2]


def _render_call(reply: FakeReply) -> str:
    """A tool-call reply as the model writes it (the chat template's ``<tool_call>`` form)."""
    return "".join(
        f'<tool_call>{{"name": "{c.name}", "arguments": {json.dumps(c.arguments)}}}</tool_call>'
        for c in reply.tool_calls
    )


async def capture(tasks: Sequence[Task], *, tool_rate: float, seed: int) -> list[Crewed]:
    """Run the crew once per task with the demonstrator (the crew must be instrumented); one ``Crewed`` per task.

    The demonstrator looks the price up on a ``tool_rate`` share of the crews (one coin flip per
    crew, so crews run one at a time) and answers from memory on the others."""
    rng = random.Random(seed)
    demonstrator = _Demonstrator(rng)
    crews: list[Crewed] = []
    async with GatewayHarness(responder=demonstrator.reply) as h:
        for task in tasks:
            demonstrator.use_tool = rng.random() < tool_rate
            demonstrator.crew = Crewed()
            async with h.attempt(task.input) as claim:
                await crew_agent(task.input, h.llm(claim))
            crews.append(demonstrator.crew)
    return crews


def tokenizer_corpus(crews: Sequence[Crewed], tasks: Sequence[Task]) -> list[str]:
    """The text of the captured crews' requests and replies with the item names and numbers taken out:
    CrewAI's wrapping (its system and task prompts, the tool's description and errors, the tool-call
    syntax), which the tiny tokenizer should spend words on, not characters. Names and prices stay out
    so the model keeps reading and writing them in the small pieces it learns to copy with."""
    texts: list[str] = []
    for crew, task in zip(crews, tasks, strict=True):
        names = sorted({str(task.input["asked_as"]), str(task.input["item"])}, key=len, reverse=True)
        for messages, tools, completion in _all_turns([crew]):
            for text in [*(str(m.get("content") or "") for m in messages), *map(json.dumps, tools), completion]:
                for name in names:
                    text = text.replace(name, "")
                texts.append(re.sub(r"\d", "", text))
    return texts


def crew_tiny_model(n_questions: int = 40) -> Path:
    """The tiny model (``lightning_rl.engine.tiny``) with a tokenizer that also learnt CrewAI's prompt text.

    With the kit's built-in vocabulary a CrewAI request is about 200 tokens, most of them single letters
    of CrewAI's instructions; a pretrained model's tokenizer would spend one per word. Every token is
    computed on every call, in the warm start and in RL, so this halves the crew's training cost. The
    text comes from crews captured on fixed questions (the crew must be instrumented) and holds no item
    name, so every seed gets the same model, built once and cached."""
    tasks = make_tasks(sorted(CATALOGUE)[:n_questions], seed=0)
    crews = asyncio.run(capture(tasks, tool_rate=1.0, seed=0))
    return default_tiny_model(extra_corpus=tuple(tokenizer_corpus(crews, tasks)))


def repriced(demo: Demo, old: int, new: int) -> Demo:
    """``demo`` with the price ``old`` replaced by ``new`` wherever CrewAI carried it: the tool's result,
    the researcher's report in the writer's context, and the completion."""
    before, after = f"{old} euros", f"{new} euros"
    messages, tools, completion = demo
    swapped = [
        {**m, "content": m["content"].replace(before, after)} if isinstance(m.get("content"), str) else m
        for m in messages
    ]
    return swapped, tools, str(new) if completion == str(old) else completion.replace(before, after)


def renamed(demo: Demo, names: Mapping[str, str]) -> Demo:
    """``demo`` with each name in ``names`` (e.g. ``{"pink-desk": "vok-trisa", "pink desk": "vok trisa"}``)
    swapped wherever CrewAI carried it: the question, earlier tool calls, the tool's error, the completion."""

    def swap(text: str) -> str:
        for old, new in names.items():
            text = text.replace(f'"{old}"', f'"{new}"').replace(f"'{old}'", f"'{new}'")
        return text

    def message(m: dict[str, Any]) -> dict[str, Any]:
        out = {**m, "content": swap(m["content"])} if isinstance(m.get("content"), str) else {**m}
        if m.get("tool_calls"):
            out["tool_calls"] = [
                {**c, "function": {**c["function"], "arguments": swap(c["function"]["arguments"])}}
                for c in m["tool_calls"]
            ]
        return out

    messages, tools, completion = demo
    return [message(m) for m in messages], tools, swap(completion)


def _made_up_name(rng: random.Random) -> str:
    return " ".join("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 6))) for _ in "ab")


def _random_price(rng: random.Random) -> int:
    return rng.randint(0, 10 ** rng.randint(1, 4) - 1)


def _all_turns(crews: Sequence[Crewed]) -> list[Demo]:
    return [d for c in crews for d in (*c.calls, c.report, c.writer) if d is not None]


@dataclass(frozen=True)
class WarmStartSettings:
    """What the demonstrations look like; the phases' knobs are ``StagedWarmStartConfig``'s."""

    report_per_task: int = 3
    """Report and writer demonstrations per training question, each with a random price (see the module
    docstring): copying is the slow skill, so it gets most of each batch."""
    renamed_per_task: int = 2
    """Copies of each training question's tool calls with a made-up item name, beside the real ones."""
    habit_tool_rate: float = 0.3
    """How often the sloppy demonstrator of the habit phase looks the price up."""


def staged_config(
    *,
    seed: int,
    expert_steps: int = 1500,
    shared_prefix: int = 16,
    micro_batch_tokens: int = 2048,
    progress: bool = True,
) -> StagedWarmStartConfig:
    """The staged warm start's phases (the core defaults, the demo's) for at most ``expert_steps`` skill
    steps; fewer than the polish and habit defaults shortens those phases too, so a smoke test stays short.

    The habit phase is checked every 2 steps and stops once the researcher starts with a tool call
    with mean probability in [0.1, 0.25] (greedy on at most 0.3 of the probes), after at most 60
    steps. Supervised steps on the sloppy demonstrator move that probability in jumps, up and down,
    between checks. The earlier rule (every 10 steps, at most 0.25, no floor) stopped seed 0 at 0.03
    on one machine (docs/learning.md), and GRPO then saw too few tool calls to learn from. A greedy
    share up to 0.3 lets a few held-out questions start right (seed 0's base scored 0.15 in the README's
    table), and the gain is measured from there."""
    return StagedWarmStartConfig(
        seed=seed,
        expert_steps=expert_steps,
        polish_steps=min(100, expert_steps),
        habit_steps=min(60, max(expert_steps, 1)),
        habit_min_steps=min(20, expert_steps),
        habit_every=2,
        habit_floor=0.1,
        habit_greedy_target=0.3,
        probe_every=max(1, min(50, expert_steps)),
        shared_prefix=shared_prefix,
        micro_batch_tokens=micro_batch_tokens,
        progress=progress,
    )


def warm_start(
    model_dir: Path,
    out_dir: Path,
    tasks: Sequence[Task],
    probe_tasks: Sequence[Task],
    *,
    config: StagedWarmStartConfig,
    settings: WarmStartSettings | None = None,
) -> StagedWarmStart:
    """Skill, polish and habit on demonstrations captured from the crew (must be instrumented); saves an HF
    folder and ``warm_start.json`` at ``out_dir``. ``probe_tasks`` ask about items outside ``tasks`` and
    the held-out set: the skill phase ends once greedy decoding reproduces the expert there."""
    s = settings or WarmStartSettings()
    rng = random.Random(config.seed)
    experts = asyncio.run(capture(tasks, tool_rate=1.0, seed=config.seed))
    # the habit phase is short (tens of steps): half the questions give it plenty of examples
    sloppy = asyncio.run(capture(tasks[::2], tool_rate=s.habit_tool_rate, seed=config.seed + 1))
    probes = asyncio.run(capture(probe_tasks, tool_rate=1.0, seed=config.seed + 2))
    expert: list[Demo] = []
    for crew, task in zip(experts, tasks, strict=True):
        expert += crew.calls
        item, asked = str(task.input["item"]), str(task.input["asked_as"])
        for _ in range(s.renamed_per_task):
            new_item = _made_up_name(rng)
            names = {item: new_item} if asked == item else {asked: misspell(new_item), item: new_item}
            expert += [renamed(call, names) for call in crew.calls]
        for _ in range(s.report_per_task):
            if crew.report is not None and crew.writer is not None and crew.price is not None:
                new = _random_price(rng)
                expert += [repriced(crew.report, crew.price, new), repriced(crew.writer, crew.price, new)]
    first_calls = [c.calls[0] for c in probes if c.calls]
    return staged_warm_start(
        model_dir,
        out_dir,
        expert=expert,
        sloppy=_all_turns(sloppy),
        probes={
            "tool_call": first_calls,
            "report": [c.report for c in probes if c.report is not None],
            "writer": [c.writer for c in probes if c.writer is not None],
        },
        habit_prompts=first_calls,
        config=config,
    )
