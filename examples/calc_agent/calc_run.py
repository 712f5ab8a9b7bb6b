"""The calc agent's tasks and warm start under ``module:function`` names, for ``lightning-rl train config.toml``.

The same splits and warm start as ``train.py`` with its defaults (200 generated training problems,
32 held-out, 300 warm-start steps on demonstrations that use the tool 60% of the time).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from calc_tasks import make_tasks

from lightning_rl.types import Task

HERE = Path(__file__).resolve().parent
N_TRAIN, N_VAL = 200, 32


def train_tasks(seed: int = 0) -> list[Task]:
    """The generated training problems of ``train.py`` for ``seed``."""
    return make_tasks(N_TRAIN + N_VAL, seed=seed)[:N_TRAIN]


def val_tasks(seed: int = 0) -> list[Task]:
    """The held-out problems of ``train.py`` for ``seed``."""
    return make_tasks(N_TRAIN + N_VAL, seed=seed)[N_TRAIN:]


def warm_start(model: str, out_dir: Path, tasks: list[Task], seed: int) -> Path:
    """``train.py``'s supervised warm start (loaded under its own module name: other examples have a train.py)."""
    spec = importlib.util.spec_from_file_location("calc_agent_train", HERE / "train.py")
    assert spec is not None and spec.loader is not None
    module: Any = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("calc_agent_train", module)
    spec.loader.exec_module(module)
    return module.warm_start(model, out_dir, tasks, steps=300, tool_rate=0.6, seed=seed)
