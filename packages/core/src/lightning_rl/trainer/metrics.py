"""Where training metrics go: ``metrics.jsonl`` always, the chosen sinks (TensorBoard, W&B, MLflow), a PNG.

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
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning_rl import semconv
from lightning_rl.trainer.sinks import MetricSink, TensorBoardSink, open_sinks
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
    """Appends metric dicts to ``<run>/metrics.jsonl`` and mirrors them to the chosen sinks.

    Args:
        run_dir: The run folder.
        tensorboard: With ``loggers=None``, mirror to TensorBoard when it is installed (silently
            skipped otherwise: the historical default).
        loggers: Sinks to mirror to (``tensorboard``, ``wandb``, ``mlflow``); each must be installed
            (``MissingExtraError`` names the pip command). None: TensorBoard as above.
        config: The run's configuration, recorded by W&B and MLflow.
        logger_options: Per-sink settings (see :mod:`lightning_rl.trainer.sinks`).
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        tensorboard: bool = True,
        loggers: Sequence[str] | None = None,
        config: Mapping[str, Any] | None = None,
        logger_options: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        self.path = run_dir / "metrics.jsonl"
        self.run_dir = run_dir
        self.history: list[dict[str, float]] = []
        self.sinks: list[MetricSink] = []
        if loggers is not None:
            self.sinks = open_sinks(loggers, run_dir, config=config, options=logger_options)
        elif tensorboard:
            try:
                self.sinks = [TensorBoardSink(run_dir)]
            except Exception:  # tensorboard is optional by default; its absence is not an error
                log.debug("tensorboard not available; logging to metrics.jsonl only")

    def log(self, metrics: dict[str, float]) -> None:
        row = {k: float(v) for k, v in metrics.items()}
        self.history.append(row)
        with self.path.open("a") as fh:
            fh.write(json.dumps(row, allow_nan=True) + "\n")
        step = int(row.get("step", len(self.history)))
        for sink in self.sinks:
            sink.log(row, step)

    def close(self) -> None:
        sinks, self.sinks = self.sinks, []
        for sink in sinks:
            sink.close()


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
