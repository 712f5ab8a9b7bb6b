"""Lightning plugin for AutoGen AgentChat: train chosen agents of a team with RL, unchanged.

Two ways in, same effect: ``wrap(team_or_agent, trainable=[...])`` for one object, or
``AutoGenInstrumentor().instrument(trainable=[...])`` for the whole process. Inside a rollout every
agent's model calls go to the attempt's gateway under the agent's name (its role), the chosen
agents are declared trainable, and tool results become AIR signals on the call that requested
them. Outside a rollout the agents behave exactly as before.
"""

from __future__ import annotations

from lightning_rl.errors import IncompatibleFrameworkError
from lightning_rl.extras import extra_import

INSTALL = "pip install 'lightning-autogen[autogen]'"
"""The command that installs the plugin with the framework it needs."""

# Without AutoGen the import fails with one line naming INSTALL (not a bare ModuleNotFoundError).
with extra_import(
    INSTALL,
    "lightning-autogen needs AutoGen AgentChat",
    ("autogen_agentchat", "autogen_core", "autogen_ext"),
    IncompatibleFrameworkError,
):
    from lightning_autogen.instrumentor import AutoGenInstrumentor
    from lightning_autogen.wrap import is_wrapped, unwrap, wrap

__all__ = ["AutoGenInstrumentor", "wrap", "unwrap", "is_wrapped", "INSTALL"]
