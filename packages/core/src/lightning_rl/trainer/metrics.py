"""Where training metrics go: ``metrics.jsonl`` always, TensorBoard when installed, a reward curve PNG.

One line of JSON per step keeps runs greppable and diffable; the PNG is drawn at the end (and on
every validation) so a run folder shows at a glance whether the reward rose.

Also the rollout-level diagnostics the loop logs each step, computed from what any agent leaves in
the store (the gateway's ``llm.call`` spans), so they work without knowing the agent: how often the
policy calls a tool and what that is worth, and how much of the batch carries no learning signal.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from lightning_rl import semconv
from lightning_rl.types import Span

__all__ = [
    "MetricsLogger",
    "plot_reward_curve",
    "has_tool_call",
    "tool_call_metrics",
    "zero_advantage_frac",
    "ZERO_ADVANTAGE_TOL",
]

ZERO_ADVANTAGE_TOL = 1e-6
"""|advantage| below this counts as zero: a group of equal rewards like 0.9 gives a mean that differs
from them by rounding, hence advantages of about 1e-10 after GRPO's division, not exactly 0."""

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


def has_tool_call(spans: Iterable[Span]) -> bool:
    """Whether any ``llm.call`` span among ``spans`` recorded at least one parsed tool call.

    The gateway writes the parsed calls of each response as a JSON list (``lightning.tool_calls``,
    ``"[]"`` when none); a tool call the gateway could not parse was returned as plain content and
    does not count. Every call of the attempt counts, whichever role made it."""
    for span in spans:
        if span.name != semconv.SPAN_LLM_CALL:
            continue
        raw = span.attributes.get(semconv.TOOL_CALLS)
        if not raw:
            continue
        try:
            calls: Any = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            continue
        if isinstance(calls, list) and calls:
            return True
    return False


def tool_call_metrics(prefix: str, rewards: Sequence[float], used_tool: Sequence[bool]) -> dict[str, float]:
    """``{prefix}/tool_call_rate`` (fraction of rollouts that called a tool) and the mean reward of
    the rollouts that did / did not (``reward_with_tool`` / ``reward_without_tool``; NaN when
    there are none): together they show whether the policy has learned that its tool pays off."""
    if len(rewards) != len(used_tool):
        raise ValueError(f"{len(rewards)} rewards but {len(used_tool)} tool flags.")
    with_tool = [r for r, u in zip(rewards, used_tool, strict=True) if u]
    without = [r for r, u in zip(rewards, used_tool, strict=True) if not u]
    return {
        f"{prefix}/tool_call_rate": len(with_tool) / len(rewards) if rewards else math.nan,
        f"{prefix}/reward_with_tool": statistics.fmean(with_tool) if with_tool else math.nan,
        f"{prefix}/reward_without_tool": statistics.fmean(without) if without else math.nan,
    }


def zero_advantage_frac(advantages: Sequence[float]) -> float:
    """Fraction of transitions whose advantage is zero (see ``ZERO_ADVANTAGE_TOL``); NaN when none.

    Those transitions teach nothing (a group whose rollouts all scored the same): a fraction near 1
    means the tasks are too easy or too hard for the policy, whatever the loss says."""
    if not advantages:
        return math.nan
    return sum(abs(a) < ZERO_ADVANTAGE_TOL for a in advantages) / len(advantages)
