"""``CrewAIInstrumentor``: train chosen CrewAI roles with Lightning, the crew's code unchanged.

``instrument()`` patches CrewAI's native OpenAI provider and agent executor (:mod:`._patches`) and
registers an event-bus listener (:mod:`._listener`); ``uninstrument()`` undoes both. Everything is
process-global and idempotent, as the plugin contract requires, and inert outside a rollout.
"""

from __future__ import annotations

from typing import Any, ClassVar

from lightning_rl.plugins import Instrumentor

__all__ = ["CrewAIInstrumentor"]


class CrewAIInstrumentor(Instrumentor):
    """The CrewAI plugin. Roles are CrewAI ``Agent.role`` strings.

    Example::

        CrewAIInstrumentor().instrument(trainable=["Writer"])
    """

    name: ClassVar[str] = "crewai"
    framework: ClassVar[str] = "crewai"
    supported: ClassVar[str] = ">=1.15,<2"
    install_hint: ClassVar[str] = "pip install 'lightning-crewai[crewai]'"

    def _instrument(self, **kwargs: Any) -> None:
        if kwargs:
            raise TypeError(f"CrewAIInstrumentor.instrument() takes no options {sorted(kwargs)}; pass trainable= only.")
        # Imported here: importing crewai is slow, and the plugin registry loads this module eagerly.
        from lightning_crewai import _patches
        from lightning_crewai._listener import CrewAIListener

        _patches.install(self.patches)
        self.patches.on_restore(CrewAIListener(self.is_trainable).close)
