"""The crew's tasks, warm start and session under ``module:function`` names, for
``lightning-rl train examples/crew_agent/config.toml``.

What ``train.py`` does with its defaults: the catalogue's items dealt out by ``seed`` to 180
training questions, 100 held-out questions (one per held-out item) and 40 probe items, the staged
warm start of the tiny model on demonstrations captured from the real crew (``crew_warm_start.py``),
and ``CrewAIInstrumentor().instrument(trainable=...)`` around the run. The session is entered
before the warm start because that capture runs the instrumented crew.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Generator, Sequence
from pathlib import Path

from crew_agent import RESEARCHER
from crew_tasks import make_tasks, split_items

from lightning_rl.types import Task

__all__ = ["N_TRAIN", "N_VAL", "N_PROBE", "train_tasks", "val_tasks", "probe_tasks", "warm_start", "session"]

N_TRAIN, N_VAL, N_PROBE = 180, 100, 40


def train_tasks(seed: int = 0, n: int = N_TRAIN) -> list[Task]:
    """The training questions of ``train.py`` for ``seed`` (the first ``n``)."""
    return make_tasks(split_items(seed=seed, n_val=N_VAL, n_probe=N_PROBE).train, n, seed=seed)


def val_tasks(seed: int = 0) -> list[Task]:
    """The held-out questions of ``train.py`` for ``seed``: one per held-out item."""
    return make_tasks(split_items(seed=seed, n_val=N_VAL, n_probe=N_PROBE).val, seed=seed + 1)


def probe_tasks(seed: int = 0) -> list[Task]:
    """The questions the warm start's skill probes use: items neither trained on nor held out."""
    return make_tasks(split_items(seed=seed, n_val=N_VAL, n_probe=N_PROBE).probe, seed=seed + 2)


def warm_start(
    model: str,
    out_dir: Path,
    tasks: Sequence[Task],
    seed: int,
    steps: int = 1500,
    habit_tool_rate: float = 0.3,
    n_probe: int = N_PROBE,
) -> Path:
    """``train.py``'s staged warm start: demonstrations captured from the instrumented crew (at most
    ``steps`` skill steps, then polish and habit), probed on the first ``n_probe`` probe items."""
    from crew_warm_start import WarmStartSettings, crew_tiny_model, staged_config
    from crew_warm_start import warm_start as staged_on_captured_demonstrations

    from lightning_rl.trainer.services import resolve_model

    done = staged_on_captured_demonstrations(
        crew_tiny_model() if model == "tiny" else resolve_model(model),
        Path(out_dir),
        tasks,
        probe_tasks(seed)[:n_probe],
        config=staged_config(seed=seed, expert_steps=steps),
        settings=WarmStartSettings(habit_tool_rate=habit_tool_rate),
    )
    return done.model_dir


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
