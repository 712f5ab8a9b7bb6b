"""How one step's scored rollouts become a weight update: the seam between the loop and the algorithm.

The loop (``lightning_rl.trainer.loop``) is the same for every weight-training algorithm: publish
resources, run the rollouts, adapt their spans into transitions (exact token ids, trainable roles
only), then hand the scored rollouts to an ``UpdateRule``:

1. ``prepare(samples)`` (on the event loop, cheap): pick and shape what to train on, e.g. credit
   assignment + group advantages (policy gradient), the best attempts (SFT), chosen/rejected pairs
   (DPO). It returns an ``UpdateBatch``; an empty one skips the update.
2. ``apply(backend, batch)`` (in a worker thread, so the gateway keeps serving): run the backend's
   update and return ``train/*`` metrics.

The loop then publishes the new weights whatever the rule. A rule is chosen by name with
``TrainerConfig.update_rule``; ``register_update_rule(name, "module:factory")`` adds one, where
``factory(config: TrainerConfig) -> UpdateRule`` reads its own options from the config (a subclass
of ``TrainerConfig`` carries them, as ``SFTConfig`` does).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from lightning_rl.backends.base import PolicyBackend
from lightning_rl.credit import RolloutSample, compute_advantages
from lightning_rl.sequences import concatenate_samples
from lightning_rl.trainer.metrics import zero_advantage_frac
from lightning_rl.types import Transition

if TYPE_CHECKING:
    from lightning_rl.trainer.config import TrainerConfig

__all__ = [
    "UpdateBatch",
    "UpdateRule",
    "PolicyGradient",
    "register_update_rule",
    "update_rule_names",
    "make_update_rule",
]


@dataclass
class UpdateBatch:
    """What ``prepare`` chose for one update."""

    items: Sequence[Any]
    """What ``apply`` trains on (transitions with advantages, selected transitions, preference pairs);
    empty: no update this step."""
    n_transitions: int
    """Transitions the step's scored rollouts produced (logged as ``train/n_transitions``)."""
    n_updated: int
    """Transitions the update uses (``train/n_updated_transitions``)."""
    metrics: dict[str, float] = field(default_factory=dict[str, float])
    """``train/*`` metrics known before the update (logged with the step)."""


class UpdateRule(Protocol):
    """Turns a step's scored rollouts into one weight update (see the module docstring)."""

    def prepare(self, samples: Sequence[RolloutSample]) -> UpdateBatch:
        """Choose and shape the training data of one step; runs on the event loop, so keep it cheap."""
        ...

    def apply(self, backend: PolicyBackend, batch: UpdateBatch) -> dict[str, float]:
        """Update the backend's weights on ``batch`` (non-empty); runs in a worker thread."""
        ...


class PolicyGradient:
    """GRPO / RLOO / PPO-clip: credit assignment, per-rollout group advantages, ``backend.update``.

    Transitions with zero advantage are left out when ``skip_zero_advantage`` is set and there is no
    KL term: they carry no gradient, only cost.
    """

    def __init__(self, config: TrainerConfig) -> None:
        self.config = config

    def prepare(self, samples: Sequence[RolloutSample]) -> UpdateBatch:
        cfg = self.config
        n_calls = sum(len(s.transitions) for s in samples)
        extra: dict[str, float] = {}
        if cfg.sequence == "concatenated":  # one masked sequence per rollout instead of one sample per call
            samples, joins = concatenate_samples(samples)
            extra = joins.metrics()
        transitions = compute_advantages(samples, strategy=cfg.credit, gamma=cfg.gamma, estimator=cfg.estimator)
        skip_zero = cfg.skip_zero_advantage and cfg.backend.kl_coef == 0
        batch = [t for t in transitions if t.advantage != 0.0] if skip_zero else transitions
        return UpdateBatch(
            items=batch,
            n_transitions=n_calls,
            n_updated=len(batch),
            metrics={"train/zero_advantage_frac": zero_advantage_frac([t.advantage for t in transitions]), **extra},
        )

    def apply(self, backend: PolicyBackend, batch: UpdateBatch) -> dict[str, float]:
        items: Sequence[Transition] = batch.items
        return backend.update(items)


UpdateRuleFactory = Callable[["TrainerConfig"], UpdateRule]

_RULES: dict[str, str] = {
    "policy_gradient": "lightning_rl.trainer.update_rules:PolicyGradient",
    "sft": "lightning_rl.algorithms.sft:RejectionSampling",
    "dpo": "lightning_rl.algorithms.dpo:PreferenceUpdate",
}


def register_update_rule(name: str, target: str, *, replace: bool = False) -> None:
    """Make ``TrainerConfig(update_rule=name)`` build its rule with ``target`` (``"module:factory"``).

    Raises:
        ValueError: ``name`` is taken (pass ``replace=True``) or ``target`` has no ``:``.
    """
    if ":" not in target:
        raise ValueError(f"target {target!r} must be 'package.module:factory'.")
    if name in _RULES and not replace:
        raise ValueError(f"update rule {name!r} is already registered ({_RULES[name]}); pass replace=True.")
    _RULES[name] = target


def update_rule_names() -> list[str]:
    """Every registered update rule."""
    return list(_RULES)


def make_update_rule(config: TrainerConfig) -> UpdateRule:
    """The rule ``config.update_rule`` names, built from ``config``.

    Raises:
        ValueError: no rule has that name.
    """
    target = _RULES.get(config.update_rule)
    if target is None:
        raise ValueError(f"unknown update_rule {config.update_rule!r}; known: {', '.join(_RULES)}.")
    module, _, attribute = target.partition(":")
    factory: Any = getattr(importlib.import_module(module), attribute)
    return factory(config)
