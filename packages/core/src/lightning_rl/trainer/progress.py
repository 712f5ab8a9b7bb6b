"""The terminal view of a run: a rich progress bar over steps, with one line per step above it.

The bar shows how far the run is and how long it has left; the lines keep the history (reward,
transitions used, failures, loss, tool-call rate, entropy, KL to the start, time) scrollable
after the run. Disabled, it prints nothing, so tests and library use stay quiet.
"""

from __future__ import annotations

import math
from types import TracebackType
from typing import Self

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

__all__ = ["StepProgress", "step_line"]


_DIAGNOSTICS = (
    ("train/tool_call_rate", "tool", ".2f"),
    ("train/entropy", "ent", ".2f"),
    ("train/kl_to_start", "kl", ".4f"),
)
"""Shown after the loss when the row has them (finite): tool use, policy entropy, KL to the start."""


def step_line(row: dict[str, float]) -> str:
    """One step's summary as printed above the bar.

    The learning diagnostics are printed only when present, so rows from a backend that does not
    measure them (or a step without an update) still read cleanly."""
    failed = int(row.get("train/failed_rollouts", 0) + row.get("train/timed_out_rollouts", 0))
    loss = row.get("train/loss", math.nan)
    diagnostics = "".join(
        f"{label} {row[key]:{fmt}}  " for key, label, fmt in _DIAGNOSTICS if math.isfinite(row.get(key, math.nan))
    )
    return (
        f"step {int(row['step']):>3}  reward {row['train/reward_mean']:.3f}  "
        f"transitions {int(row.get('train/n_updated_transitions', 0))}/{int(row.get('train/n_transitions', 0))}  "
        f"failed {failed}  loss {loss:+.4f}  {diagnostics}{row.get('train/step_s', 0.0):.1f}s"
    )


class StepProgress:
    """``with StepProgress(steps) as bar: ... bar.step_done(row)``; ``enabled=False`` is silent."""

    def __init__(self, steps: int, *, enabled: bool = True, console: Console | None = None) -> None:
        self.enabled = enabled
        self._progress = Progress(
            TextColumn("[bold blue]training"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("reward {task.fields[reward]}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=console,
            transient=False,
            disable=not enabled,
        )
        self._task = self._progress.add_task("steps", total=steps, reward="-")

    def __enter__(self) -> Self:
        self._progress.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._progress.stop()

    def advance_to(self, step: int) -> None:
        """Mark ``step`` steps as done (a resumed run starts part-way)."""
        self._progress.update(self._task, completed=step)

    def step_done(self, row: dict[str, float]) -> None:
        """Print the step's line and move the bar."""
        self.note(step_line(row))
        self._progress.update(self._task, advance=1, reward=f"{row['train/reward_mean']:.3f}")

    def note(self, message: str) -> None:
        """Print a line above the bar (rich markup allowed)."""
        if self.enabled:
            self._progress.console.print(message, soft_wrap=True)  # one line per step, also in logs
