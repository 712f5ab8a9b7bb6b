"""Where training metrics go: ``metrics.jsonl`` always, TensorBoard when installed, a reward curve PNG.

One line of JSON per step keeps runs greppable and diffable; the PNG is drawn at the end (and on
every validation) so a run folder shows at a glance whether the reward rose.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

__all__ = ["MetricsLogger", "plot_reward_curve"]

log = logging.getLogger(__name__)


class MetricsLogger:
    """Appends metric dicts to ``<run>/metrics.jsonl`` and mirrors them to TensorBoard if available."""

    def __init__(self, run_dir: Path, *, tensorboard: bool = True) -> None:
        self.path = run_dir / "metrics.jsonl"
        self.run_dir = run_dir
        self.history: list[dict[str, float]] = []
        self._tb: Any = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter  # pyright: ignore[reportMissingImports]

                self._tb = SummaryWriter(str(run_dir / "tensorboard"))
            except Exception:  # tensorboard is optional; its absence is not an error
                log.debug("tensorboard not available; logging to metrics.jsonl only")

    def log(self, metrics: dict[str, float]) -> None:
        row = {k: float(v) for k, v in metrics.items()}
        self.history.append(row)
        with self.path.open("a") as fh:
            fh.write(json.dumps(row, allow_nan=True) + "\n")
        if self._tb is not None:
            step = int(row.get("step", len(self.history)))
            for key, value in row.items():
                if key != "step" and isinstance(value, float) and math.isfinite(value):
                    self._tb.add_scalar(key, value, step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def plot_reward_curve(history: list[dict[str, float]], path: Path) -> Path | None:
    """Draw train and validation mean reward against the step; returns the file, or None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.info("matplotlib not installed; skipping %s", path.name)
        return None
    train = [(r["step"], r["train/reward_mean"]) for r in history if "train/reward_mean" in r]
    val = [(r["step"], r["val/reward_mean"]) for r in history if "val/reward_mean" in r]
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    if train:
        ax.plot(*zip(*train, strict=True), label="train reward (mean)", color="tab:blue", alpha=0.8)
    if val:
        ax.plot(*zip(*val, strict=True), "o-", label="held-out reward (mean)", color="tab:orange")
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
