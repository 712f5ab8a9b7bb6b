"""What the trainer needs from a policy backend, whatever trains the weights.

The LightningRL loop only ever talks to a backend through this protocol: it hands over
transitions that already carry advantages, asks for metrics back, publishes the new weights to
whatever serves the rollouts, and saves/restores checkpoints. ``TorchBackend`` (one process) and
``VerlBackend`` (VeRL worker groups on Ray) both satisfy it structurally, so the trainer can take
either without knowing which one it has.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from lightning_rl.types import Transition

__all__ = ["PolicyBackend"]


@runtime_checkable
class PolicyBackend(Protocol):
    """A trainable policy plus the means to push its weights to the inference side.

    ``version`` is the model version the inference side serves after the last ``publish()``;
    ``step`` counts completed ``update()`` calls (both are restored by ``load_checkpoint``).
    """

    version: int
    step: int

    def update(self, transitions: Sequence[Transition]) -> dict[str, float]:
        """One policy update on transitions carrying advantages; returns ``train/*`` metrics.

        Runs in a worker thread (the trainer's event loop keeps serving the gateway meanwhile)."""
        ...

    def logprobs(self, transitions: Sequence[Transition]) -> list[list[float]]:
        """The current policy's logprobs of each transition's response tokens (no gradient)."""
        ...

    async def publish(self) -> int:
        """Send the current weights to the inference side; returns the new model version."""
        ...

    def save_checkpoint(self, directory: str | Path) -> Path:
        """Save everything needed to resume exactly into ``directory``; returns the main file's path."""
        ...

    def load_checkpoint(self, directory: str | Path) -> None:
        """Restore what ``save_checkpoint`` wrote into ``directory``."""
        ...
