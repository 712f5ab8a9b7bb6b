"""The RAG agent's tasks, warm start and session under ``module:function`` names, for
``lightning-rl train examples/rag_agent/config.toml``.

What ``train.py`` does with its defaults: the bundled corpus's questions split into training and 16
held-out ones, a 150-step supervised warm start of the tiny model, and the unchanged Agents SDK app
(``rag_agent.rag_agent``) with the plugin's ``instrument(trainable=["answerer"])`` around the run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Sequence
from pathlib import Path
from typing import Any

from rag_data import Question, load_corpus, make_questions, split

from lightning_rl.types import Task

__all__ = ["train_tasks", "val_tasks", "warm_start", "session"]

N_VAL = 16


def _task(q: Question) -> dict[str, Any]:
    return {"question": q.question, "answer": q.answer}


def train_tasks(seed: int = 0) -> list[dict[str, Any]]:
    """The training questions of ``train.py`` for ``seed``."""
    return [_task(q) for q in split(make_questions(load_corpus()), N_VAL, seed=seed)[0]]


def val_tasks(seed: int = 0) -> list[dict[str, Any]]:
    """The held-out questions of ``train.py`` for ``seed``."""
    return [_task(q) for q in split(make_questions(load_corpus()), N_VAL, seed=seed)[1]]


def warm_start(model: str, out_dir: Path, tasks: Sequence[Task], seed: int, steps: int = 150) -> Path:
    """``train.py``'s supervised warm start on demonstrations of the tasks' questions (handoff, searches, answer)."""
    from rag_warm_start import warm_start as sft_on_demonstrations

    from lightning_rl.trainer.services import resolve_model

    by_text = {q.question: q for q in make_questions(load_corpus())}
    questions = [by_text[str(t.input["question"])] for t in tasks]
    return sft_on_demonstrations(resolve_model(model), Path(out_dir), questions, steps, seed)


@contextlib.contextmanager
def session(trainable: list[str] | None) -> Generator[None]:
    """The plugin call of ``train.py`` (roles are agent names), undone when the run ends."""
    from lightning_openai_agents import instrument, uninstrument

    instrument(trainable=trainable if trainable is not None else ["answerer"])
    try:
        yield
    finally:
        uninstrument()
