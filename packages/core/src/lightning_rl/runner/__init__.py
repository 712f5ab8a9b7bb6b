"""Workers that run the agent on rollouts claimed from the store.

``Runner`` is the in-process form (the trainer uses it); ``lightning-rl runner`` starts one or more
worker processes around it. See ``lightning_rl.runner.worker`` for how failures are handled.

The names below load on first access, so importing the CLI module ``lightning_rl.runner._cli``
(which ``lightning-rl --help`` does) stays instant.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lightning_rl.runner.worker import AgentBlockedError, Runner, RunnerStats, default_worker_id

__all__ = ["Runner", "RunnerStats", "AgentBlockedError", "default_worker_id"]


def __getattr__(name: str) -> object:
    if name in __all__:
        from lightning_rl.runner import worker

        return getattr(worker, name)
    raise AttributeError(f"module 'lightning_rl.runner' has no attribute {name!r}")
