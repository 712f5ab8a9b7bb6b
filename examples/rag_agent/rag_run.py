"""The RAG agent's tasks, warm start and session under ``module:function`` names, for
``lightning-rl train examples/rag_agent/config.toml``.

What ``train.py`` does with its defaults: the bundled corpus's questions split, by person, into
training, 100 held-out and 100 probe questions; the staged warm start of the tiny model; and the
unchanged Agents SDK app (``rag_agent.rag_agent``) with the plugin's ``instrument(trainable=["answerer"])``
around the run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Sequence
from pathlib import Path
from typing import Any

from rag_data import Question, load_corpus, make_questions, split

from lightning_rl.types import Task

__all__ = ["train_tasks", "val_tasks", "warm_start", "session"]

N_VAL = 100
N_PROBE = 100


def _split(seed: int) -> tuple[list[Question], list[Question], list[Question]]:
    return split(make_questions(load_corpus()), N_VAL, seed=seed, n_probe=N_PROBE)


def _task(q: Question) -> dict[str, Any]:
    return {"question": q.question, "answer": q.answer}


def train_tasks(seed: int = 0) -> list[dict[str, Any]]:
    """The training questions of ``train.py`` for ``seed``."""
    return [_task(q) for q in _split(seed)[0]]


def val_tasks(seed: int = 0) -> list[dict[str, Any]]:
    """The held-out questions of ``train.py`` for ``seed``."""
    return [_task(q) for q in _split(seed)[1]]


def warm_start(
    model: str,
    out_dir: Path,
    tasks: Sequence[Task],
    seed: int,
    expert_steps: int = 1500,
    polish_steps: int = 150,
    habit_steps: int = 200,
) -> Path:
    """``train.py``'s staged warm start on the tasks' questions, probed on the seed's probe questions.

    ``expert_steps`` caps the expert phase (it ends earlier once the probes pass)."""
    from rag_warm_start import WarmStartConfig
    from rag_warm_start import warm_start as staged

    from lightning_rl.engine.models import resolve_model

    by_text = {q.question: q for q in make_questions(load_corpus())}
    questions = [by_text[str(t.input["question"])] for t in tasks]
    cfg = WarmStartConfig(
        seed=seed, expert_steps=expert_steps, polish_steps=polish_steps, habit_steps=habit_steps, progress=False
    )
    return staged(resolve_model(model), Path(out_dir), questions, _split(seed)[2], cfg)


@contextlib.contextmanager
def session(trainable: list[str] | None) -> Generator[None]:
    """The plugin call of ``train.py`` (roles are agent names), undone when the run ends."""
    from lightning_openai_agents import instrument, uninstrument

    instrument(trainable=trainable if trainable is not None else ["answerer"])
    try:
        yield
    finally:
        uninstrument()
