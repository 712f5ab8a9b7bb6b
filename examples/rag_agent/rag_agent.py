"""The RAG agent: a planner that hands the question to an answerer, which searches and answers.

Plain OpenAI Agents SDK code, as it would run against any OpenAI-compatible server (a local vLLM,
say): nothing in this file knows about Lightning. ``train.py`` adds the one plugin call, which
routes every model call made during a rollout to the trainer's gateway and records which agent
(planner or answerer) made it, so that only the answerer is trained.

Reward (as in the paper's MuSiQue task): token F1 between the final answer and the gold answer,
plus a small bonus for answering in the expected format (a final line ``Answer: <answer>``). The
facts are fictional one-word names, so a guess from memory earns the bonus (0.1) and little else;
searching for the person and copying the fact found earns 1.0.

The search fails (a tool error, which the plugin records as an AIR ``tool_error`` signal) on an
empty query or on one that matches no note at all, e.g. a misspelt name.
"""

from __future__ import annotations

import os
import re
import string
from collections import Counter
from functools import cache
from typing import Any

from agents import Agent, ModelSettings, RunConfig, Runner, function_tool
from agents.exceptions import AgentsException
from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
from openai import AsyncOpenAI
from rag_data import load_corpus
from rag_search import BM25

__all__ = ["PLANNER_PROMPT", "ANSWERER_PROMPT", "build_agents", "rag_agent", "reward", "f1_score", "search_corpus"]

PLANNER_PROMPT = "Hand the question to the answerer."
ANSWERER_PROMPT = "Search, then reply 'Answer: <answer>'."
FORMAT_BONUS = 0.1
MAX_TURNS = 6

# Where the app's model lives outside training (the trainer's gateway replaces it during rollouts).
BASE_URL = os.environ.get("RAG_AGENT_BASE_URL", "http://localhost:8000/v1")
MODEL = os.environ.get("RAG_AGENT_MODEL", "Qwen/Qwen2.5-0.5B-Instruct")


@cache
def _index() -> BM25:
    return BM25([str(d["text"]) for d in load_corpus()])


def search_corpus(query: str) -> str:
    """The two best paragraphs for ``query``, one per line.

    Raises:
        ValueError: the query is empty, or no note shares a word with it (search for a full name).
    """
    if not query.strip():
        raise ValueError("the search query is empty; pass the words to look for")
    hits = _index().search(query, k=2)
    if not hits:
        raise ValueError(f"no note mentions {query!r}; search for the person's full name")
    return "\n".join(hits)


@function_tool
def search(query: str) -> str:
    """Find notes on a name."""
    return search_corpus(query)


def _normalize(text: str) -> list[str]:
    text = "".join(ch for ch in text.lower() if ch not in string.punctuation)
    return [w for w in text.split() if w not in {"a", "an", "the"}]


def f1_score(prediction: str, gold: str) -> float:
    """SQuAD-style token F1."""
    pred, ref = _normalize(prediction), _normalize(gold)
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def reward(final_output: str, gold: str) -> float:
    """F1 of the answer (the text after the last ``Answer:``, else everything) plus the format bonus."""
    matches = re.findall(r"Answer:\s*(.+)", final_output)
    answer = matches[-1].strip() if matches else final_output
    return (1 - FORMAT_BONUS) * f1_score(answer, gold) + (FORMAT_BONUS if matches else 0.0)


def _client() -> AsyncOpenAI:
    """The app's client. ``timeout`` covers connecting too: the openai default allows 5 s to connect, which a
    busy local server (a hundred rollouts at once on two cores) can miss."""
    api_key = os.environ.get("RAG_AGENT_API_KEY", "EMPTY")
    return AsyncOpenAI(base_url=BASE_URL, api_key=api_key, max_retries=0, timeout=120.0)


def build_agents(
    settings: ModelSettings | None = None, client: AsyncOpenAI | None = None
) -> tuple[Agent[Any], Agent[Any]]:
    """(planner, answerer): the planner's only move is the handoff; the answerer has the search tool.

    ``client`` is the rollout's OpenAI client; without one the agents get a new client (enough to read
    their tool schemas, which opens no connection).
    """
    model = OpenAIChatCompletionsModel(model=MODEL, openai_client=client or _client())
    settings = settings or ModelSettings()
    answerer = Agent[Any](
        name="answerer", instructions=ANSWERER_PROMPT, tools=[search], model=model, model_settings=settings
    )
    planner = Agent[Any](
        name="planner", instructions=PLANNER_PROMPT, handoffs=[answerer], model=model, model_settings=settings
    )
    return planner, answerer


async def rag_agent(task: dict[str, Any], llm: Any = None) -> float:
    """Answer ``task["question"]``; returns the reward against ``task["answer"]``.

    ``llm`` (the trainer's ``LLM``) only supplies sampling settings; where calls go is the plugin's job.
    """
    sampling = dict(getattr(llm, "sampling", {}) or {})
    settings = ModelSettings(temperature=sampling.get("temperature"), max_tokens=sampling.get("max_tokens"))
    config = RunConfig(workflow_name="rag_agent")
    # One client per rollout, closed with it: its pooled connections belong to this event loop. A
    # process-wide client would keep them open after the loop (and the server) are gone, and a second
    # asyncio.run in the same process would be handed connections of the first one.
    async with _client() as client:
        planner, answerer = build_agents(settings, client)
        try:
            result = await Runner.run(planner, task["question"], max_turns=MAX_TURNS, run_config=config)
            if result.last_agent.name != answerer.name:  # the planner answered itself: the answerer decides
                result = await Runner.run(answerer, result.to_input_list(), max_turns=MAX_TURNS, run_config=config)
        except AgentsException:  # ran out of turns, called an unknown tool, ...: no answer
            return 0.0
    return reward(str(result.final_output or ""), str(task["answer"]))
