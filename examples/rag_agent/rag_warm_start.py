"""The staged warm start of the tiny model: it learns to search and copy, then the habit of guessing.

A randomly initialised tiny model never emits a well-formed tool call, so RL alone would have no
signal; a model fine-tuned on perfect demonstrations leaves RL nothing to show. The core's
``staged_warm_start`` makes the base in between (see its docstring): the model *can* search for
the person it is asked about and copy the fact found, but usually answers from memory (wrong).
RL must then discover from reward alone that searching pays.

Every demonstration is the exact request the Agents SDK sends, rendered by the model's chat
template: the planner's turn (system prompt, handoff tool) and the answerer's turns after the
handoff (its system prompt, the search tool, the handoff's tool message, the search results).

- **expert**: the planner hands off; the answerer searches for the person's full name and, given
  the two paragraphs found, answers with the fact the question asks for. Copying is the slow skill,
  so most examples are copying ones: search calls for new names too, and answers from random facts
  (recalling a training person's town would lower the loss too, but only copying carries over).
- **sloppy**: the planner hands off; the answerer answers from memory (a wrong town or company)
  70% of the time and does the expert's search otherwise.
- **probes**: the expert's search call and answer on probe questions (people in neither the training
  nor the held-out questions); the habit phase watches the search call's first token on them.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents import handoff
from rag_agent import ANSWERER_PROMPT, PLANNER_PROMPT, build_agents, search, search_corpus
from rag_data import COMPANIES, RELATIONS, TOWNS, Question, load_corpus, person_names

from lightning_rl.trainer.staged_warm_start import StagedWarmStartConfig, staged_warm_start
from lightning_rl.trainer.warm_start import ChatDemo

__all__ = ["WarmStartConfig", "demonstrations", "warm_start"]

Demo = tuple[list[dict[str, Any]], list[dict[str, Any]], str]
"""(messages, tools, completion)."""


@dataclass(frozen=True)
class WarmStartConfig:
    """The example's warm-start knobs (the phases' own knobs are ``StagedWarmStartConfig``'s)."""

    seed: int = 0
    expert_steps: int = 1500
    """At most this many expert steps; the phase ends once both probes pass (``skill_target``)."""
    skill_target: float = 0.6
    report_per_task: int = 3
    """Answer (copying) demonstrations per training question, each with random facts found: recalling a
    training person's town would lower the loss too, but only copying carries over to held-out people."""
    new_names_per_task: int = 2
    """Extra search-call demonstrations per training question, about new random names. Copying the name
    from the question into the query is as slow to learn as copying the answer (alone, ~250 steps at batch
    32 for either), so the two get about equal shares of each batch."""
    habit_tool_rate: float = 0.3
    """How often the sloppy demonstrator searches (else it guesses)."""
    polish_steps: int = 150
    habit_steps: int = 200
    batch_size: int = 32
    lr: float = 1e-3
    shared_prefix: int = 40
    """The answerer's system prompt and search tool (44 tokens in the tiny model's template) run once per
    micro-batch; the planner's requests go to micro-batches of their own (``TorchBackendConfig.shared_prefix``)."""
    progress: bool = True


def _schemas() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The planner's and the answerer's tools as the SDK sends them (chat-completions format)."""
    _planner, answerer = build_agents()
    h = handoff(answerer)
    planner_tools = [
        {
            "type": "function",
            "function": {
                "name": h.tool_name,
                "description": h.tool_description,
                "parameters": h.input_json_schema,
                "strict": h.strict_json_schema,
            },
        }
    ]
    answerer_tools = [
        {
            "type": "function",
            "function": {
                "name": search.name,
                "description": search.description,
                "parameters": search.params_json_schema,
                "strict": search.strict_json_schema,
            },
        }
    ]
    return planner_tools, answerer_tools


def _call(name: str, arguments: dict[str, Any]) -> str:
    """A tool call in the tiny model's syntax (what its chat template renders for an assistant call)."""
    return f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(arguments)}}}</tool_call>'


def _assistant_call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    function = {"name": name, "arguments": json.dumps(arguments)}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call_id, "type": "function", "function": function}],
    }


class _Renderer:
    """Builds the SDK's requests for one question: the planner's, the answerer's before and after a search."""

    def __init__(self) -> None:
        self.planner_tools, self.answerer_tools = _schemas()
        self.handoff = str(self.planner_tools[0]["function"]["name"])

    def planner(self, question: str) -> Demo:
        messages = [{"role": "system", "content": PLANNER_PROMPT}, {"role": "user", "content": question}]
        return messages, self.planner_tools, _call(self.handoff, {})

    def _after_handoff(self, question: str) -> list[dict[str, Any]]:
        return [
            {"role": "system", "content": ANSWERER_PROMPT},
            {"role": "user", "content": question},
            _assistant_call("call_h", self.handoff, {}),
            {"role": "tool", "tool_call_id": "call_h", "content": json.dumps({"assistant": "answerer"})},
        ]

    def search_call(self, question: str, person: str) -> Demo:
        return self._after_handoff(question), self.answerer_tools, _call("search", {"query": person})

    def guess(self, question: str, answer: str) -> Demo:
        return self._after_handoff(question), self.answerer_tools, f"Answer: {answer}"

    def report(self, question: str, person: str, found: str, answer: str) -> Demo:
        history = [
            *self._after_handoff(question),
            _assistant_call("call_s", "search", {"query": person}),
            {"role": "tool", "tool_call_id": "call_s", "content": found},
        ]
        return history, self.answerer_tools, f"Answer: {answer}"


def _random_facts(person: str, relation: str, rng: random.Random) -> tuple[str, str]:
    """What a search for ``person`` returns (their two facts, in the index's order), with random
    values: (the text found, the answer to a ``relation`` question)."""
    town, company = rng.choice(TOWNS), rng.choice(COMPANIES)
    lines = [f"{person} was born in {town}.", f"{person} works for {company}."]  # BM25's order: a tie, by id
    return "\n".join(lines), town if relation == "born_in" else company


def _wrong(answer: str, rng: random.Random) -> str:
    pool = TOWNS if answer in TOWNS else COMPANIES
    return rng.choice([x for x in pool if x != answer])


def demonstrations(train: Sequence[Question], probe: Sequence[Question], cfg: WarmStartConfig) -> dict[str, list[Demo]]:
    """The staged warm start's data: ``expert``, ``sloppy``, ``probe_call``, ``probe_report``."""
    rng = random.Random(cfg.seed)
    r = _Renderer()
    expert: list[Demo] = [r.planner(q.question) for q in train[0::4]]
    expert += [r.search_call(q.question, q.person) for q in train]
    templates = list(RELATIONS.items())
    known = {d["subject"] for d in load_corpus()}  # new names only: no held-out person appears here
    n_new = len(train) * cfg.new_names_per_task
    new_names = [p for p in person_names(2 * n_new + len(known), seed=10_000 + cfg.seed) if p not in known][:n_new]
    for person in new_names:
        _relation, template = rng.choice(templates)
        expert.append(r.search_call(template.format(person=person), person))
    for q in train:
        for _ in range(cfg.report_per_task):
            found, answer = _random_facts(q.person, q.relation, rng)
            expert.append(r.report(q.question, q.person, found, answer))

    sloppy: list[Demo] = [r.planner(q.question) for q in train[0::4]]
    for q in train:
        if rng.random() < cfg.habit_tool_rate:
            sloppy.append(r.search_call(q.question, q.person))
            sloppy.append(r.report(q.question, q.person, search_corpus(q.person), q.answer))
        else:
            sloppy.append(r.guess(q.question, _wrong(q.answer, rng)))
    return {
        "expert": expert,
        "sloppy": sloppy,
        "probe_call": [r.search_call(q.question, q.person) for q in probe],
        "probe_report": [r.report(q.question, q.person, search_corpus(q.person), q.answer) for q in probe],
    }


def warm_start(
    model_dir: Path, out_dir: Path, train: Sequence[Question], probe: Sequence[Question], cfg: WarmStartConfig
) -> Path:
    """Skill, polish, habit on the demonstrations; saves an HF folder (and ``warm_start.json``) at ``out_dir``."""
    demos = demonstrations(train, probe, cfg)

    def chats(key: str) -> list[ChatDemo]:
        return list(demos[key])

    staged_warm_start(
        model_dir,
        out_dir,
        expert=chats("expert"),
        sloppy=chats("sloppy"),
        probes={"search_call": chats("probe_call"), "answer": chats("probe_report")},
        habit_prompts=chats("probe_call"),
        config=StagedWarmStartConfig(
            seed=cfg.seed,
            expert_steps=cfg.expert_steps,
            skill_target=cfg.skill_target,
            polish_steps=cfg.polish_steps,
            habit_steps=cfg.habit_steps,
            batch_size=cfg.batch_size,
            lr=cfg.lr,
            habit_lr=cfg.lr,
            shared_prefix=cfg.shared_prefix,
            progress=cfg.progress,
        ),
    )
    return out_dir
