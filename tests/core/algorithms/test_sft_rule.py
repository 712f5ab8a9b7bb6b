"""SFT from traces, the update rule alone: which attempts are kept and what the backend is trained on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

pytest.importorskip("torch")

from lightning_rl.algorithms.sft import RejectionSampling, SFTConfig, select_attempts  # noqa: E402
from lightning_rl.credit import RolloutSample  # noqa: E402
from lightning_rl.trainer import TrainerConfig  # noqa: E402
from lightning_rl.types import Transition  # noqa: E402


def _sample(rollout: str, group: str, reward: float, calls: int = 1) -> RolloutSample:
    transitions = [
        Transition(
            prompt_ids=[1, 2, 3 + k], response_ids=[10 + k, 11], rollout_id=rollout, attempt_id=rollout, step_index=k
        )
        for k in range(calls)
    ]
    return RolloutSample(rollout, group, reward, transitions)


SAMPLES = [
    _sample("a1", "a", 0.0),
    _sample("a2", "a", 1.0, calls=2),
    _sample("a3", "a", 0.5),
    _sample("b1", "b", 0.2),
    _sample("b2", "b", 0.9),
]


def test_threshold_keeps_every_attempt_at_or_above_it() -> None:
    kept = select_attempts(SAMPLES, min_reward=0.5, top_k=None)
    assert [s.rollout_id for s in kept] == ["a2", "a3", "b2"]


def test_top_k_keeps_the_best_per_task_whatever_their_reward() -> None:
    kept = select_attempts(SAMPLES, min_reward=None, top_k=1)
    assert [s.rollout_id for s in kept] == ["a2", "b2"]


def test_threshold_and_top_k_compose() -> None:
    assert [s.rollout_id for s in select_attempts(SAMPLES, min_reward=0.95, top_k=1)] == ["a2"]


def test_config_needs_a_selection_and_sane_values() -> None:
    with pytest.raises(ValueError, match="min_reward, top_k or both"):
        SFTConfig(min_reward=None, top_k=None)
    with pytest.raises(ValueError, match="top_k must be >= 1"):
        SFTConfig(top_k=0)


def test_the_rule_refuses_a_plain_trainer_config() -> None:
    with pytest.raises(ValueError, match="needs an SFTConfig"):
        RejectionSampling(TrainerConfig())


class RecordingBackend:
    """A test double of the layer below (the torch backend): records what sft() was given."""

    version = 1
    step = 0

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def sft(
        self, examples: Sequence[tuple[Sequence[int], Sequence[int]]], *, steps: int, batch_size: int
    ) -> list[float]:
        self.calls.append({"examples": list(examples), "steps": steps, "batch_size": batch_size})
        return [2.0] * (steps - 1) + [1.0]


def test_the_rule_trains_on_the_recorded_tokens_of_the_kept_attempts() -> None:
    rule = RejectionSampling(SFTConfig(min_reward=0.9, sft_epochs=2.0, sft_batch_size=2))
    batch = rule.prepare(SAMPLES)
    assert batch.n_transitions == 6 and batch.n_updated == 3  # a2 (two calls) and b2
    assert batch.metrics["train/selected_rollouts"] == 2
    backend = RecordingBackend()
    metrics = rule.apply(backend, batch)  # pyright: ignore[reportArgumentType]
    (call,) = backend.calls
    assert call["examples"] == [([1, 2, 3], [10, 11]), ([1, 2, 4], [11, 11]), ([1, 2, 3], [10, 11])]
    assert call["steps"] == 3 and call["batch_size"] == 2  # ceil(2 epochs * 3 / 2)
    assert metrics["train/loss_last"] == 1.0 and metrics["train/optimizer_steps"] == 3


def test_the_rule_names_what_is_missing_on_a_backend_without_sft() -> None:
    rule = RejectionSampling(SFTConfig())
    batch = rule.prepare(SAMPLES)

    class NoSFT:
        version = 1
        step = 0

    with pytest.raises(TypeError, match="NoSFT has no sft"):
        rule.apply(NoSFT(), batch)  # pyright: ignore[reportArgumentType]
