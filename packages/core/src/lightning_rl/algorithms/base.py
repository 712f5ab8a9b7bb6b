"""One interface for every way of improving an agent from its traces, and the registry that names them.

An algorithm is built from one config object and run with ``fit(agent, train_tasks, val_tasks)``.
It reads what the agent did from the store (rollouts, their spans with the exact token ids, the
resources each rollout ran with) and writes what it learnt back as new, versioned resources: new
weights published to the engine (RL, SFT, DPO: each publish is a new model version that later
rollouts record) or a new prompt template (APO). Every algorithm returns a ``TrainResult`` and
leaves the same run folder behind (``config.json``, ``metrics.jsonl``, ``store.sqlite``, ...), so the
trainer, ``lightning-rl train`` and the benchmarks treat them alike.

The weight-training algorithms share one loop (``lightning_rl.trainer.loop``: rollouts -> adapter ->
update -> publish -> validate) and differ only in the *update rule* it applies to each step's scored
rollouts (``lightning_rl.trainer.update_rules``): policy gradient for GRPO/RLOO/PPO, rejection-sampled
supervised fine-tuning for SFT, preference pairs for DPO. An algorithm that does not train weights
(APO) implements ``fit`` itself.

The registry maps a name to ``"module:attribute"`` and imports nothing until asked, so listing the
algorithms (``lightning-rl train --help``) does not import torch. ``options`` are defaults an entry
applies on top of its config class's own (``rloo`` is the RL trainer with ``estimator="rloo"``).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from lightning_rl.agent import AgentFn
from lightning_rl.types import Task

__all__ = [
    "Algorithm",
    "AlgorithmEntry",
    "TrainResult",
    "algorithm_names",
    "get_algorithm",
    "register_algorithm",
]


@dataclass
class TrainResult:
    """What a finished run reports; the full history is in ``<run_dir>/metrics.jsonl``."""

    run_dir: Path
    val_before: float | None
    """Mean held-out reward before the first update (None without held-out tasks)."""
    val_after: float | None
    """Mean held-out reward after the last update."""
    history: list[dict[str, float]]
    """Every row logged to ``metrics.jsonl``, in order."""


@runtime_checkable
class Algorithm(Protocol):
    """Anything that improves an agent from its rollouts: ``Algo(config).fit(agent, train, val)``.

    ``agent`` may be None when runner processes started separately run it (RL with ``concurrency=0``).
    """

    def fit(self, agent: AgentFn | None, train_tasks: Sequence[Task], val_tasks: Sequence[Task] = ()) -> TrainResult:
        """Run the algorithm; report held-out reward on ``val_tasks`` before and after."""
        ...


@dataclass(frozen=True)
class AlgorithmEntry:
    """A registered algorithm: where its class lives and the option defaults it starts from."""

    name: str
    target: str
    """``"package.module:Class"``; the class takes one config object (see ``config_class``)."""
    summary: str
    options: Mapping[str, Any] = field(default_factory=dict[str, Any])
    """Config defaults of this entry, applied before the user's options (nested dicts for nested configs)."""

    def load(self) -> type[Any]:
        """Import the class.

        Raises:
            ImportError: its module is not part of this install (names the missing module).
        """
        module_name, _, attribute = self.target.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and module_name.startswith(exc.name):
                raise ImportError(
                    f"algorithm {self.name!r} is not available: module {module_name} is missing from this install."
                ) from exc
            raise
        return getattr(module, attribute)

    def config_class(self) -> type[Any]:
        """The config class the algorithm's constructor takes.

        A class may name it as ``config_class``; otherwise it is read from the type of the constructor's
        first parameter (``def __init__(self, config: APOConfig | None = None)``).
        """
        cls = self.load()
        explicit = getattr(cls, "config_class", None)
        if isinstance(explicit, type):
            return explicit
        hints = typing.get_type_hints(cls.__init__)
        first = next(iter(inspect.signature(cls).parameters), None)
        if first is not None and first in hints:
            for candidate in typing.get_args(hints[first]) or (hints[first],):
                if isinstance(candidate, type) and dataclasses.is_dataclass(candidate):
                    return candidate
        raise TypeError(
            f"cannot tell the config class of {self.target}: give it a class attribute config_class "
            "or annotate its constructor's config parameter with a dataclass."
        )


_REGISTRY: dict[str, AlgorithmEntry] = {}


def register_algorithm(
    name: str, target: str, summary: str, options: Mapping[str, Any] | None = None, *, replace: bool = False
) -> AlgorithmEntry:
    """Make ``name`` available to ``get_algorithm`` and ``lightning-rl train`` (``algorithm.name = ...``).

    ``target`` is ``"module:Class"``; nothing is imported until the algorithm is used.

    Raises:
        ValueError: ``name`` is taken (pass ``replace=True`` to override it) or ``target`` has no ``:``.
    """
    if ":" not in target:
        raise ValueError(f"target {target!r} must be 'package.module:Class'.")
    if name in _REGISTRY and not replace:
        raise ValueError(f"algorithm {name!r} is already registered ({_REGISTRY[name].target}); pass replace=True.")
    entry = AlgorithmEntry(name, target, summary, dict(options or {}))
    _REGISTRY[name] = entry
    return entry


def get_algorithm(name: str) -> AlgorithmEntry:
    """The registered entry called ``name``.

    Raises:
        KeyError: no such algorithm (the message lists the known ones).
    """
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown algorithm {name!r}; known: {', '.join(algorithm_names())}.") from None


def algorithm_names() -> list[str]:
    """Every registered name, in registration order."""
    return list(_REGISTRY)


_RL = "lightning_rl.trainer.loop:Trainer"
register_algorithm("grpo", _RL, "policy gradient, group-normalised advantages (the default RL)", {"estimator": "grpo"})
register_algorithm("rloo", _RL, "policy gradient, leave-one-out baseline", {"estimator": "rloo"})
register_algorithm(
    "ppo",
    _RL,
    "PPO-clip: several epochs of mini-batches per step's rollouts (group-relative advantages, no value model)",
    {"backend": {"ppo_epochs": 4, "mini_batches": 4}},
)
register_algorithm(
    "sft",
    "lightning_rl.algorithms.sft:SFT",
    "rejection-sampling fine-tuning: supervised updates on the recorded tokens of the best attempts",
)
register_algorithm("dpo", "lightning_rl.algorithms.dpo:DPO", "direct preference optimisation on pairs within a group")
register_algorithm(
    "apo", "lightning_rl.algorithms.apo:APO", "automatic prompt optimisation: rewrites a prompt template, no weights"
)
