"""Lightning plugin for the OpenAI Agents SDK: train chosen agents with RL, handoffs included.

Three lines integrate an existing app::

    from lightning_openai_agents import instrument
    instrument(trainable=["answerer"])   # roles are agent names
    # ...run agents with Runner.run / run_streamed as before

Inside a rollout every model call goes to the rollout's gateway on the calling agent's role URL
(both the chat-completions and the responses API, streaming included), and every function-tool
call becomes a tool span (an AIR ``tool_success`` / ``tool_error`` signal) joined by tool-call id.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning_openai_agents.instrumentor import OpenAIAgentsInstrumentor
from lightning_rl.roles import RoleSelector, RoleSpec

if TYPE_CHECKING:
    from lightning_openai_agents._processor import LightningTracingProcessor

__all__ = ["OpenAIAgentsInstrumentor", "LightningTracingProcessor", "instrument", "uninstrument"]


def instrument(
    *, trainable: RoleSpec | RoleSelector = None, check_version: bool = True, **kwargs: Any
) -> OpenAIAgentsInstrumentor:
    """Instrument the Agents SDK (idempotent); see :meth:`OpenAIAgentsInstrumentor.instrument`."""
    return OpenAIAgentsInstrumentor().instrument(trainable=trainable, check_version=check_version, **kwargs)


def uninstrument() -> None:
    """Undo :func:`instrument` (idempotent): the SDK behaves exactly as before."""
    OpenAIAgentsInstrumentor().uninstrument()


def __getattr__(name: str) -> Any:
    # The processor imports the SDK: load it on first use, so this package imports (and reports a
    # missing or unsupported SDK through instrument()) without it.
    if name == "LightningTracingProcessor":
        from lightning_rl.errors import IncompatibleFrameworkError
        from lightning_rl.extras import extra_import

        with extra_import(
            OpenAIAgentsInstrumentor.install_hint,
            "LightningTracingProcessor needs the OpenAI Agents SDK",
            ("agents",),
            IncompatibleFrameworkError,
        ):
            from lightning_openai_agents._processor import LightningTracingProcessor

        return LightningTracingProcessor
    raise AttributeError(f"module 'lightning_openai_agents' has no attribute {name!r}")
