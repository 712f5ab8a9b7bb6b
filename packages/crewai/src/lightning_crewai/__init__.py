"""Lightning plugin for CrewAI: train chosen crew roles with RL, the crew's code unchanged.

::

    from lightning_crewai import CrewAIInstrumentor
    CrewAIInstrumentor().instrument(trainable=["Writer"])
    # build and kickoff the crew as usual; lightning_rl's Trainer runs it in rollouts

Importing this package does not import CrewAI; ``instrument()`` does.
"""

from __future__ import annotations

from lightning_crewai.instrumentor import CrewAIInstrumentor
from lightning_rl.roles import RoleSelector, RoleSpec

__all__ = ["CrewAIInstrumentor", "instrument", "uninstrument"]


def instrument(*, trainable: RoleSpec | RoleSelector = None, check_version: bool = True) -> CrewAIInstrumentor:
    """``CrewAIInstrumentor().instrument(...)``: route and record CrewAI; idempotent."""
    return CrewAIInstrumentor().instrument(trainable=trainable, check_version=check_version)


def uninstrument() -> None:
    """``CrewAIInstrumentor().uninstrument()``: CrewAI behaves exactly as before; idempotent."""
    CrewAIInstrumentor().uninstrument()
