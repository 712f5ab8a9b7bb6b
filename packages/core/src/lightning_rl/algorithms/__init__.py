"""Algorithms that improve an agent from its traces: RL (GRPO/RLOO/PPO), SFT from traces, DPO, APO.

All share one interface (``Algorithm``: built from one config, ``fit(agent, train_tasks, val_tasks)
-> TrainResult``) and one registry (``get_algorithm(name)``), which ``lightning-rl train`` uses. See
``lightning_rl.algorithms.base`` and docs/algorithms.md.

``SFT``, ``SFTConfig``, ``DPO`` and ``DPOConfig`` load on first access (they need torch); the interface does not.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from lightning_rl.algorithms.base import (
    Algorithm,
    AlgorithmEntry,
    TrainResult,
    algorithm_names,
    get_algorithm,
    register_algorithm,
)

if TYPE_CHECKING:
    from lightning_rl.algorithms.dpo import DPO, DPOConfig
    from lightning_rl.algorithms.sft import SFT, SFTConfig

__all__ = [
    # the interface
    "Algorithm",
    "TrainResult",
    # the registry
    "AlgorithmEntry",
    "algorithm_names",
    "get_algorithm",
    "register_algorithm",
    # SFT from traces
    "SFT",
    "SFTConfig",
    # DPO from groups
    "DPO",
    "DPOConfig",
]

_LAZY = {
    "SFT": "lightning_rl.algorithms.sft",
    "SFTConfig": "lightning_rl.algorithms.sft",
    "DPO": "lightning_rl.algorithms.dpo",
    "DPOConfig": "lightning_rl.algorithms.dpo",
}


def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(f"module 'lightning_rl.algorithms' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
