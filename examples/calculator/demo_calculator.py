"""The demo's tasks and warm start, named so a run file can point at them (``module:function``).

``lightning-rl demo`` draws its questions from one seed and splits them into training, held-out and
probe tasks; these functions return the same splits, so ``lightning-rl train grpo.toml`` reproduces
the demo's run (and ``sft.toml`` runs SFT from traces on the same tasks and warm start).
"""

from __future__ import annotations

from pathlib import Path

from lightning_rl.demo.calculator import make_tasks
from lightning_rl.demo.run import DemoConfig
from lightning_rl.types import Task

_DEMO = DemoConfig()


def _split(seed: int) -> tuple[list[Task], list[Task], list[Task]]:
    tasks = make_tasks(_DEMO.n_train + _DEMO.n_val + _DEMO.n_probe, seed=seed)
    n_train, n_val = _DEMO.n_train, _DEMO.n_val
    return tasks[:n_train], tasks[n_train : n_train + n_val], tasks[n_train + n_val :]


def train_tasks(seed: int = 0) -> list[Task]:
    """The demo's 300 training questions for ``seed``."""
    return _split(seed)[0]


def val_tasks(seed: int = 0) -> list[Task]:
    """The demo's 100 held-out questions for ``seed`` (never trained on)."""
    return _split(seed)[1]


def warm_start(model: str, out_dir: Path, tasks: list[Task], seed: int) -> Path:
    """The demo's supervised warm start of ``model`` on demonstrations of ``tasks``; returns the HF folder."""
    from lightning_rl.demo.run import warm_start as demo_warm_start
    from lightning_rl.engine.models import resolve_model

    return demo_warm_start(resolve_model(model), out_dir, DemoConfig(seed=seed), tasks, _split(seed)[2])
