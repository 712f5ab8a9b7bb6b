"""The crew under training: a researcher with a price-lookup tool, and a writer who answers.

This is ordinary CrewAI code. Nothing in it knows about Lightning: ``train.py`` adds the one
plugin call (``CrewAIInstrumentor().instrument(trainable=["Researcher"])``), and the plugin routes
each rollout's model calls to the trainer's gateway, records which role made each call, and turns
the tool's errors into AIR signals. The crew's ``LLM`` points at whatever OpenAI-compatible server
it would use in production (``OPENAI_BASE_URL``); during training its calls never go there.
"""

from __future__ import annotations

import os

for _name, _value in {
    "CREWAI_DISABLE_TELEMETRY": "true",
    "CREWAI_TRACING_ENABLED": "false",
    "CREWAI_DISABLE_VERSION_CHECK": "true",
    "ANONYMIZED_TELEMETRY": "False",
}.items():
    os.environ.setdefault(_name, _value)

import difflib  # noqa: E402
import functools  # noqa: E402
from typing import Any  # noqa: E402

from crew_tasks import CATALOGUE, score  # noqa: E402
from crewai import LLM, Agent, Crew, CrewOutput, Process, Task  # noqa: E402
from crewai.tools import tool  # noqa: E402

from lightning_rl.agent import LLM as LightningLLM  # noqa: E402

__all__ = ["RESEARCHER", "WRITER", "lookup_price", "build_crew", "crew_llm", "crew_agent"]

RESEARCHER = "Researcher"
WRITER = "Writer"


@tool("lookup_price")
def lookup_price(item: str) -> str:
    """Price of the catalogue item with exactly this name."""
    if item not in CATALOGUE:
        close = difflib.get_close_matches(item, CATALOGUE, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"no catalogue item named {item!r}{hint}")
    return f"{CATALOGUE[item]} euros"


def build_crew(llm: LLM) -> Crew:
    """Researcher (tool) -> writer; ``{item}`` is filled in by ``kickoff(inputs=...)``.

    The prompts are short on purpose: CrewAI wraps them in its own instructions, and every token of
    the request is processed on every call (the tiny model's training cost is mostly prompt)."""
    researcher = Agent(
        role=RESEARCHER,
        goal="Find prices",
        backstory="You never guess.",
        tools=[lookup_price],
        llm=llm,
        max_iter=3,
    )
    writer = Agent(role=WRITER, goal="Answer", backstory="You are brief.", llm=llm, max_iter=2)
    # the name in quotes: the model then sees it in the same tokens as it writes it in its tool call
    research = Task(description='Look up: "{item}".', expected_output="The price.", agent=researcher)
    answer = Task(
        description="Price of {item}?",
        expected_output="A number.",
        agent=writer,
        context=[research],
    )
    return Crew(agents=[researcher, writer], tasks=[research, answer], process=Process.sequential, verbose=False)


@functools.lru_cache(maxsize=8)
def crew_llm(base_url: str, api_key: str, temperature: float | None, max_tokens: int | None) -> LLM:
    """One CrewAI ``LLM`` per server and sampling settings, built once and shared by every crew.

    Building an ``LLM`` builds two OpenAI clients, each loading the system's CA certificates (about
    0.1 s of CPU per ``LLM`` on a laptop core): per crew, that was a third of a rollout's cost. A
    production app builds its LLM once too; the clients are safe to share between concurrent crews.
    """
    return LLM(
        model="openai/crew-model",
        base_url=base_url,
        api_key=api_key,
        temperature=temperature,
        max_tokens=max_tokens,
        max_retries=0,
    )


async def crew_agent(task: dict[str, Any], llm: LightningLLM) -> float:
    """One rollout: run a fresh crew on the question and score the writer's answer.

    ``llm`` is the trainer's handle; only its sampling settings are used (the plugin does the
    routing), so this is the same function you would run against a production server.
    """
    sampling = dict(llm.sampling)
    shared = crew_llm(
        os.environ.get("OPENAI_BASE_URL", "http://localhost:8000/v1"),
        os.environ.get("OPENAI_API_KEY", "unused"),
        sampling.get("temperature"),
        sampling.get("max_tokens"),
    )
    out = await build_crew(shared).kickoff_async(inputs={"item": task["asked_as"]})
    return score(out.raw if isinstance(out, CrewOutput) else None, task["answer"])
