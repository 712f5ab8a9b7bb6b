"""The calc agent's tasks and warm start under ``module:function`` names, for ``lightning-rl train config.toml``.

The same splits and warm start as ``train.py`` with its defaults: 300 generated training problems,
100 held-out, 100 that only probe the warm start, and the staged warm start of ``calc_warm_start``.
"""

from __future__ import annotations

from pathlib import Path

from calc_tasks import problem_key, split_tasks
from calc_warm_start import WarmStartSettings
from calc_warm_start import warm_start as staged

from lightning_rl.types import Task

__all__ = ["N_TRAIN", "N_VAL", "N_PROBE", "train_tasks", "val_tasks", "warm_start"]

N_TRAIN, N_VAL, N_PROBE = 300, 100, 100


def train_tasks(seed: int = 0) -> list[Task]:
    """The generated training problems of ``train.py`` for ``seed``."""
    return split_tasks(N_TRAIN, N_VAL, N_PROBE, seed=seed)[0]


def val_tasks(seed: int = 0) -> list[Task]:
    """The held-out problems of ``train.py`` for ``seed``."""
    return split_tasks(N_TRAIN, N_VAL, N_PROBE, seed=seed)[1]


def warm_start(
    model: str,
    out_dir: Path,
    tasks: list[Task],
    seed: int,
    *,
    expert_steps: int = 2000,
    polish_steps: int = 150,
    habit_steps: int = 200,
) -> Path:
    """``train.py``'s staged warm start on ``tasks``, probed on the seed's probe problems.

    The probe and held-out problems come from the same draw as ``train_tasks``/``val_tasks``, so the
    copy demonstrations avoid them whichever tasks the file trains on."""
    from lightning_rl.trainer.services import resolve_model

    _, val, probe = split_tasks(N_TRAIN, N_VAL, N_PROBE, seed=seed)
    exclude = {problem_key(t.input["expression"]) for t in (*val, *probe)}
    settings = WarmStartSettings(
        seed=seed, expert_steps=expert_steps, polish_steps=polish_steps, habit_steps=habit_steps
    )
    return staged(resolve_model(model), Path(out_dir), tasks, probe, exclude=exclude, settings=settings)
