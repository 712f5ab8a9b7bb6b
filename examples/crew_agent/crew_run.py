"""The crew's tasks, warm start and session under ``module:function`` names, for
``lightning-rl train examples/crew_agent/config.toml``.

What ``train.py`` does with its defaults: 64 training questions and 8 held-out ones, an 800-step
supervised warm start of the tiny model on demonstrations captured from the real crew (the
demonstrator looks the price up half the time), and ``CrewAIInstrumentor().instrument(trainable=...)``
around the run. The session is entered before the warm start because that capture runs the
instrumented crew.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Generator, Sequence
from pathlib import Path

from crew_agent import RESEARCHER
from crew_tasks import make_tasks

from lightning_rl.types import Task

__all__ = ["train_tasks", "val_tasks", "warm_start", "session"]

N_TRAIN, N_VAL = 64, 8


def train_tasks(seed: int = 0) -> list[Task]:
    """The training questions of ``train.py`` for ``seed``."""
    return make_tasks(N_TRAIN + N_VAL, seed=seed)[:N_TRAIN]


def val_tasks(seed: int = 0) -> list[Task]:
    """The held-out questions of ``train.py`` for ``seed``."""
    return make_tasks(N_TRAIN + N_VAL, seed=seed)[N_TRAIN:]


def warm_start(
    model: str, out_dir: Path, tasks: Sequence[Task], seed: int, steps: int = 800, tool_rate: float = 0.5
) -> Path:
    """``train.py``'s warm start: demonstrations captured from the instrumented crew, then supervised steps."""
    from crew_warm_start import warm_start as sft_on_captured_demonstrations

    from lightning_rl.trainer.services import resolve_model

    return sft_on_captured_demonstrations(
        resolve_model(model), Path(out_dir), tasks, steps=steps, tool_rate=tool_rate, seed=seed
    )


@contextlib.contextmanager
def session(trainable: list[str] | None) -> Generator[None]:
    """The plugin call of ``train.py`` (only the researcher trains), undone when the run ends."""
    from lightning_crewai import CrewAIInstrumentor

    # CrewAI warns on every call to a server it cannot count tokens for (the gateway); once is enough.
    logging.getLogger("crewai.llms.base_llm").setLevel(logging.ERROR)
    instrumentor = CrewAIInstrumentor()
    instrumentor.instrument(trainable=trainable if trainable is not None else [RESEARCHER])
    try:
        yield
    finally:
        instrumentor.uninstrument()
