"""What the judge tests share: a judge config against a scripted judge, fast retries and no cache."""

from __future__ import annotations

from typing import Any

from lightning_rl.rewards import JudgeConfig


def judge_config(url: str, **overrides: Any) -> JudgeConfig:
    """A ``JudgeConfig`` for the scripted judge at ``url``: millisecond backoff, 2 s timeout, no cache."""
    settings: dict[str, Any] = {
        "model": "fake-judge",
        "base_url": url,
        "backoff_s": 0.001,
        "max_backoff_s": 0.05,
        "timeout_s": 2.0,
        "cache": False,
    }
    return JudgeConfig(**{**settings, **overrides})


def by_content(text: str) -> float:
    """The scripted judge's taste: a trajectory saying 'right' is good."""
    return 1.0 if "right" in text else 0.1
