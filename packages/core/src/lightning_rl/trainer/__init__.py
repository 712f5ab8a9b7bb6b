"""The LightningRL trainer: the loop, its config, metrics.

Exports load on first access: the config pulls in the torch backend, and ``lightning-rl --help``
(which imports ``lightning_rl.trainer._cli``) must not pay for torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lightning_rl.trainer.config import TrainerConfig
    from lightning_rl.trainer.loop import Trainer, TrainResult

__all__ = ["Trainer", "TrainerConfig", "TrainResult"]

_WHERE = {"Trainer": "loop", "TrainResult": "loop", "TrainerConfig": "config"}


def __getattr__(name: str) -> object:
    if name not in _WHERE:
        raise AttributeError(f"module 'lightning_rl.trainer' has no attribute {name!r}")
    from lightning_rl.extras import CORE_EXTRAS, extra_import, install_command

    # On an agent-side install (no torch) say which extra to install, not "No module named 'torch'".
    modules = CORE_EXTRAS["train"] + CORE_EXTRAS["server"]
    with extra_import(install_command(["train"]), f"{name} needs the train extra", modules):
        return getattr(importlib.import_module(f"lightning_rl.trainer.{_WHERE[name]}"), name)
