"""Progress of a warm start (the demo's, the examples'): a bar on a terminal, periodic lines anywhere else.

The warm start is the longest silent phase of the demo (minutes on 2 cores). On a terminal a rich bar
shows steps, loss and time left; when output goes to a file or a CI log (no terminal, so a bar would be
noise or nothing), one plain line every ``every_s`` seconds carries the same facts, flushed at once so
``| tee`` and CI logs show them live.
"""

from __future__ import annotations

import math
import sys
import time
from types import TracebackType
from typing import Self

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

__all__ = ["WarmStartProgress"]


class WarmStartProgress:
    """``with WarmStartProgress(total) as bar: backend.sft(..., on_step=bar.on_step)``.

    ``enabled=False`` prints nothing. ``console`` decides terminal or not (default: stdout's).
    """

    def __init__(
        self, total: int, *, enabled: bool = True, console: Console | None = None, every_s: float = 10.0
    ) -> None:
        self.total = total
        self.enabled = enabled
        self.console = console or Console()
        self.every_s = every_s
        self.done = 0
        self.loss = math.nan
        self._started = time.perf_counter()
        self._last_line = self._started
        self._skills = ""
        self._bar: Progress | None = None
        if enabled and self.console.is_terminal:
            self._bar = Progress(
                TextColumn("[bold blue]warm-start"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("loss {task.fields[loss]} {task.fields[skills]}"),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                console=self.console,
            )
            self._task = self._bar.add_task("warm-start", total=total, loss="-", skills="")

    def __enter__(self) -> Self:
        if self._bar is not None:
            self._bar.start()
        elif self.enabled:
            self._line("warm-start: supervised steps on demonstrations")
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._bar is not None:
            self._bar.stop()
        elif self.enabled and exc_type is None:
            self._line(self._status())

    def on_step(self, step: int, loss: float, lr: float) -> None:
        """``TorchBackend.sft``'s callback: one optimizer step finished with ``loss``."""
        del step, lr
        self.done += 1
        self.loss = loss
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, loss=f"{loss:.4f}", skills=self._skills)
        elif self.enabled and time.perf_counter() - self._last_line >= self.every_s:
            self._line(self._status())

    def note_skills(self, skills: dict[str, float]) -> None:
        """Show the latest skill probe (fraction of probe demonstrations reproduced greedily)."""
        self._skills = " ".join(f"{k} {v:.2f}" for k, v in skills.items())
        if self._bar is not None:
            self._bar.update(self._task, skills=self._skills)

    def skip(self, steps: int) -> None:
        """Steps planned but not needed (the probe passed early): the bar's total shrinks."""
        if steps <= 0:
            return
        self.total -= steps
        if self._bar is not None:
            self._bar.update(self._task, total=self.total)

    def _status(self) -> str:
        elapsed = time.perf_counter() - self._started
        skills = f"  {self._skills}" if self._skills else ""
        return f"warm-start step {self.done}/{self.total}  loss {self.loss:.4f}{skills}  {elapsed:.0f}s"

    def _line(self, text: str) -> None:
        self._last_line = time.perf_counter()
        print(text, file=sys.stdout, flush=True)
