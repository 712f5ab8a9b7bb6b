"""The agent APO optimises: a plain OpenAI client whose system prompt is the template under study.

The only Lightning line is ``prompt_template("system", DEFAULT_PROMPT)``: under APO each rollout
runs with one candidate prompt (a resources version in the store), and the agent reads it from
there; outside a training run it falls back to ``DEFAULT_PROMPT``. The reward compares the first
line of the answer with the expected one (1.0 when equal, partial credit by character similarity),
so a prompt that gets bare, correct answers scores best.
"""

from __future__ import annotations

import difflib

from lightning_rl.agent import LLM
from lightning_rl.algorithms.apo import prompt_template

__all__ = ["DEFAULT_PROMPT", "answer_agent", "score"]

DEFAULT_PROMPT = "You are a helpful assistant."


def _normal(text: str) -> str:
    return " ".join(text.strip().strip(".!\"'").lower().split())


def score(answer: str, expected: str) -> float:
    """1.0 for the expected answer on the first line, else the character similarity (0..1) of the two."""
    lines = answer.strip().splitlines()
    first = _normal(lines[0]) if lines else ""
    want = _normal(expected)
    if first == want:
        return 1.0
    return round(difflib.SequenceMatcher(None, first, want).ratio(), 4)


async def answer_agent(task: dict[str, str], llm: LLM) -> float:
    """Ask the model ``task["question"]`` with the current prompt as the system message; score the reply
    against ``task["answer"]`` (the model never sees it)."""
    client = llm.async_openai_client(max_retries=0)
    try:
        reply = await client.chat.completions.create(
            model=llm.model,
            messages=[
                {"role": "system", "content": prompt_template("system", DEFAULT_PROMPT)},
                {"role": "user", "content": task["question"]},
            ],
            **dict(llm.sampling),
        )
    finally:
        await client.close()
    return score(reply.choices[0].message.content or "", task["answer"])
