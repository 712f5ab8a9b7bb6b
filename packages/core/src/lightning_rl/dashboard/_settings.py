"""The credit-assignment settings the dashboard replays, read from a run folder.

The trainer writes ``config.json`` (its ``TrainerConfig``) next to ``store.sqlite``; the transitions
view must credit a rollout exactly as that run did, so it reads the strategy, discount, estimator
and AIR policy from there instead of assuming the defaults. An AIR entry that was a Python function
cannot be read back from JSON: it is listed in ``unreadable_air`` and shown, never silently dropped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast, get_args

from lightning_rl.credit import AdvantageEstimator, CreditStrategy

__all__ = ["CreditSettings", "load_credit_settings", "find_run_dir"]

_STRATEGIES: tuple[str, ...] = get_args(CreditStrategy)
_ESTIMATORS: tuple[str, ...] = get_args(AdvantageEstimator)


@dataclass(frozen=True)
class CreditSettings:
    """How a run turned rewards into advantages (``TrainerConfig``'s credit fields)."""

    credit: CreditStrategy = "broadcast"
    gamma: float = 1.0
    estimator: AdvantageEstimator = "grpo"
    air: dict[str, float] = field(default_factory=dict[str, float])
    skip_zero_advantage: bool = True
    source: str = "defaults (no config.json found)"
    """Where the settings came from, shown on every transitions view."""
    unreadable_air: list[str] = field(default_factory=list[str])
    """AIR signal names whose weight was a function (not replayable from JSON)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "credit": self.credit,
            "gamma": self.gamma,
            "estimator": self.estimator,
            "air": self.air,
            "skip_zero_advantage": self.skip_zero_advantage,
            "source": self.source,
            "unreadable_air": self.unreadable_air,
        }


def find_run_dir(store_url: str) -> Path | None:
    """The run folder of a SQLite store path (its parent, if it holds a run's files), else None."""
    if store_url.startswith(("http://", "https://", "postgresql://", "postgres://", "memory")):
        return None
    path = Path(store_url.removeprefix("sqlite:///").removeprefix("sqlite://"))
    parent = path.parent
    if (parent / "config.json").exists() or (parent / "metrics.jsonl").exists():
        return parent
    return None


def load_credit_settings(run_dir: Path | None) -> CreditSettings:
    """Read ``run_dir/config.json``; the trainer's defaults when there is none.

    Raises:
        ValueError: the file exists but is not a trainer config (the message names the field).
    """
    if run_dir is None or not (run_dir / "config.json").exists():
        return CreditSettings()
    path = run_dir / "config.json"
    try:
        raw: Any = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); pass --run pointing at a trainer's run folder.") from exc
    if not isinstance(raw, dict):
        raise ValueError(f"{path} does not hold a TrainerConfig object; pass --run pointing at a trainer's run folder.")
    data = cast(dict[str, Any], raw)
    credit = str(data.get("credit", "broadcast"))
    estimator = str(data.get("estimator", "grpo"))
    if credit not in _STRATEGIES:
        raise ValueError(f"{path}: unknown credit strategy {credit!r} (expected one of {', '.join(_STRATEGIES)}).")
    if estimator not in _ESTIMATORS:
        raise ValueError(f"{path}: unknown estimator {estimator!r} (expected one of {', '.join(_ESTIMATORS)}).")
    air: dict[str, float] = {}
    unreadable: list[str] = []
    raw_air: Any = data.get("air") or {}
    if isinstance(raw_air, dict):
        for name, weight in cast(dict[str, Any], raw_air).items():
            if isinstance(weight, int | float) and not isinstance(weight, bool):
                air[name] = float(weight)
            else:
                unreadable.append(name)
    return CreditSettings(
        credit=cast(CreditStrategy, credit),
        gamma=float(data.get("gamma", 1.0)),
        estimator=cast(AdvantageEstimator, estimator),
        air=air,
        skip_zero_advantage=bool(data.get("skip_zero_advantage", True)),
        source=str(path),
        unreadable_air=unreadable,
    )
