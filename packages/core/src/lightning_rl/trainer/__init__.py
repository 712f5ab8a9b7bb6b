"""The LightningRL trainer: the loop, its config, metrics. Importing it loads torch."""

from __future__ import annotations

from lightning_rl.trainer.config import TrainerConfig
from lightning_rl.trainer.loop import Trainer, TrainResult

__all__ = ["Trainer", "TrainerConfig", "TrainResult"]
