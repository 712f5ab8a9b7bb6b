"""Supervised warm start of the tiny model on demonstrations captured from the real crew.

A randomly initialised tiny model never emits a well-formed tool call, so every rollout scores 0
and GRPO has no advantage to follow. A short supervised pass first teaches it the crew's format.

The demonstrations are not written by hand: the unchanged crew (``crew_agent.build_crew``) runs on
the training questions inside a ``GatewayHarness``, whose scripted upstream plays a demonstrator.
Each request the upstream receives is exactly what CrewAI sends during training (its system and
task prompts, the tool schema, the tool's real results and error messages, the writer's context),
and the demonstrator's reply to it becomes the target completion. The demonstrator is deliberately
sloppy: on a ``tool_rate`` share of the questions the researcher looks the price up (retrying a
misspelt name with spaces), otherwise it reports a guessed price. The warm-started model therefore
knows how to use its tool but often does not, which is what RL then improves. The writer always
repeats the last number of the researcher's report. A real instruction-tuned model skips this step.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crew_agent import crew_agent
from crew_tasks import CATALOGUE

from lightning_rl.testing import FakeReply, FakeToolCall, GatewayHarness
from lightning_rl.types import Task

__all__ = ["Demo", "demonstrations", "warm_start"]

Demo = tuple[list[dict[str, Any]], list[dict[str, Any]], str]
"""(messages, tools, completion): one model turn, as the chat the crew sent and the text to produce."""

_ASKED = re.compile(r"Look up the price of: (.+?)\.\n")


@dataclass
class _Demonstrator:
    """Answers each upstream request as the sloppy expert would, and keeps (request, answer) pairs."""

    rng: random.Random
    demos: list[Demo]
    use_tool: bool = True

    def reply(self, body: dict[str, Any]) -> FakeReply | str:
        messages: list[dict[str, Any]] = body["messages"]
        tools: list[dict[str, Any]] = body.get("tools") or []
        answer = self._researcher(messages) if tools else self._writer(messages)
        completion = answer if isinstance(answer, str) else _render_call(answer)
        self.demos.append((messages, tools, completion))
        return answer

    def _researcher(self, messages: list[dict[str, Any]]) -> FakeReply | str:
        found = _ASKED.search(str(messages[1].get("content") or ""))
        asked = found.group(1) if found else ""
        if not self.use_tool:
            return f"{asked}: {self.rng.randint(5, 95)} euros"
        last = messages[-1]
        if last["role"] != "tool":
            return FakeReply(tool_calls=[FakeToolCall("lookup_price", {"item": asked})])
        if str(last.get("content") or "").startswith("Error") and " " not in asked:
            return FakeReply(tool_calls=[FakeToolCall("lookup_price", {"item": asked.replace("-", " ")})])
        return str(last.get("content") or "")

    def _writer(self, messages: list[dict[str, Any]]) -> str:
        context = str(messages[-1].get("content") or "").rpartition("context you're working with:")[2]
        numbers = re.findall(r"\d+", context)
        return numbers[-1] if numbers else "0"


def _render_call(reply: FakeReply) -> str:
    """A tool-call reply as the model writes it (the chat template's ``<tool_call>`` form)."""
    return "".join(
        f'<tool_call>{{"name": "{c.name}", "arguments": {json.dumps(c.arguments)}}}</tool_call>'
        for c in reply.tool_calls
    )


async def demonstrations(tasks: Sequence[Task], *, tool_rate: float, rounds: int = 2, seed: int = 0) -> list[Demo]:
    """Every model turn of the demonstrator's crews, ``rounds`` times on each task (the crew must be instrumented).

    Guessed prices are random, so the writer's demonstrations teach it to copy the report's number
    rather than to remember a price per item."""
    rng = random.Random(seed)
    demonstrator = _Demonstrator(rng, [])
    async with GatewayHarness(responder=demonstrator.reply) as h:
        for task in [t for _ in range(rounds) for t in tasks]:  # one crew at a time: one coin flip per crew
            demonstrator.use_tool = rng.random() < tool_rate
            async with h.attempt(task.input) as claim:
                await crew_agent(task.input, h.llm(claim))
    return demonstrator.demos


def warm_start(
    model_dir: Path, out_dir: Path, tasks: Sequence[Task], *, steps: int, tool_rate: float = 0.5, seed: int = 0
) -> Path:
    """Fine-tune ``model_dir`` for ``steps`` steps on demonstrations of ``tasks``; saves an HF folder at ``out_dir``."""
    from lightning_rl.trainer.warm_start import sft_on_chats

    demos = asyncio.run(demonstrations(tasks, tool_rate=tool_rate, seed=seed))
    done = sft_on_chats(model_dir, out_dir, demos, steps=steps, seed=seed)
    summary = {"final_losses": done.losses[-10:], "examples": done.n_examples, "catalogue": len(CATALOGUE)}
    (out_dir / "warm_start.json").write_text(json.dumps(summary))
    return out_dir
