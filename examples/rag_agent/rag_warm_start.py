"""Supervised warm start of the tiny model on demonstrations of the whole RAG flow.

A randomly initialised tiny model never emits a well-formed tool call, so RL alone would have no
signal to climb. A few hundred supervised steps on an expert's demonstrations teach it the format:
the planner's handoff, the answerer's searches (with the real BM25 results in the conversation),
and the final ``Answer:`` line. The prompts are the exact chat messages and tool schemas the Agents
SDK sends (system prompt, handoff turn, tool results), rendered with the model's chat template.
A real instruction-tuned model (``--model Qwen/...``) skips this step.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agents import handoff
from rag_agent import ANSWERER_PROMPT, PLANNER_PROMPT, build_agents, search, search_corpus
from rag_data import Question, load_corpus

__all__ = ["demonstrations", "warm_start"]

Demo = tuple[list[dict[str, Any]], list[dict[str, Any]], str]  # (messages, tools, completion)


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
    return f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(arguments)}}}</tool_call>'


def _queries(q: Question) -> list[str]:
    """The expert's searches: one per hop, named by what the previous hop found."""
    docs = load_corpus()
    chain = [docs[i] for i in q.support]
    queries = [f"{chain[0]['subject']} {'born' if chain[0]['relation'] == 'born_in' else 'works for'}"]
    for fact in chain[1:]:
        queries.append(f"{fact['subject']} {'country' if fact['relation'] == 'country' else 'head office'}")
    return queries


def demonstrations(questions: Sequence[Question]) -> list[Demo]:
    """Every model turn of the expert on ``questions``, with the SDK's conversation before it."""
    planner_tools, answerer_tools = _schemas()
    handoff_name = str(planner_tools[0]["function"]["name"])
    out: list[Demo] = []
    for n, q in enumerate(questions):
        user = {"role": "user", "content": q.question}
        out.append(([{"role": "system", "content": PLANNER_PROMPT}, user], planner_tools, _call(handoff_name, {})))
        history: list[dict[str, Any]] = [
            {"role": "system", "content": ANSWERER_PROMPT},
            user,
            _assistant_call(f"call_{n}_h", handoff_name, {}),
            {"role": "tool", "tool_call_id": f"call_{n}_h", "content": json.dumps({"assistant": "answerer"})},
        ]
        for hop, query in enumerate(_queries(q)):
            out.append((list(history), answerer_tools, _call("search", {"query": query})))
            call_id = f"call_{n}_{hop}"
            history += [
                _assistant_call(call_id, "search", {"query": query}),
                {"role": "tool", "tool_call_id": call_id, "content": search_corpus(query)},
            ]
        out.append((history, answerer_tools, f"Answer: {q.answer}"))
    return out


def _assistant_call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    function = {"name": name, "arguments": json.dumps(arguments)}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call_id, "type": "function", "function": function}],
    }


def warm_start(model_dir: Path, out_dir: Path, questions: Sequence[Question], steps: int, seed: int = 0) -> Path:
    """Fine-tune ``model_dir`` on the demonstrations for ``steps`` steps; saves an HF folder at ``out_dir``."""
    from lightning_rl.trainer.warm_start import sft_on_chats

    done = sft_on_chats(model_dir, out_dir, demonstrations(questions), steps=steps, seed=seed)
    (out_dir / "warm_start.json").write_text(
        json.dumps({"final_losses": done.losses[-10:], "examples": done.n_examples})
    )
    return out_dir
