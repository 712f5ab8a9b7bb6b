"""Lightning: train any AI agent with reinforcement learning, with almost no change to its code.

The names below are the public surface. Anything that pulls in a heavy dependency (torch for the
trainer, FastAPI for the servers) loads on first access, so ``import lightning_rl`` stays light
enough for agent-side processes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_rl.agent import LLM, AgentFn, load_agent
from lightning_rl.capture import capture  # the function: lightning_rl.capture("openinference")
from lightning_rl.roles import RoleSelector
from lightning_rl.tracing import current_rollout, emit_reward, emit_signal, rollout_context, span
from lightning_rl.types import (
    Attempt,
    AttemptStatus,
    LLMResource,
    Resources,
    Rollout,
    RolloutConfig,
    RolloutRequest,
    RolloutStatus,
    Span,
    Task,
    Transition,
)

if TYPE_CHECKING:
    from lightning_rl.runner import Runner
    from lightning_rl.store import LightningStore, MemoryStore, open_store
    from lightning_rl.trainer import Trainer, TrainerConfig

__version__ = "0.1.0"

__all__ = [
    # the agent side
    "LLM",
    "AgentFn",
    "load_agent",
    "emit_reward",
    "emit_signal",
    "current_rollout",
    "rollout_context",
    "span",
    "RoleSelector",
    "capture",
    # data model
    "Task",
    "Rollout",
    "RolloutRequest",
    "RolloutConfig",
    "RolloutStatus",
    "Attempt",
    "AttemptStatus",
    "Span",
    "Resources",
    "LLMResource",
    "Transition",
    # services (lazy)
    "LightningStore",
    "MemoryStore",
    "open_store",
    "Runner",
    "Trainer",
    "TrainerConfig",
]

_LAZY = {
    "LightningStore": "lightning_rl.store",
    "MemoryStore": "lightning_rl.store",
    "open_store": "lightning_rl.store",
    "Runner": "lightning_rl.runner",
    "Trainer": "lightning_rl.trainer",
    "TrainerConfig": "lightning_rl.trainer",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lightning_rl' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
