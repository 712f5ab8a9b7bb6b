"""Lightning plugin for LangChain / LangGraph: train chosen roles of a graph with RL, graph unchanged (README).

Importing it needs ``langchain_core`` (the handler subclasses its callback base class); without it the
import fails naming the install command. ``langchain-openai`` is needed only to route ``ChatOpenAI``.
"""

from __future__ import annotations

from lightning_rl.errors import IncompatibleFrameworkError
from lightning_rl.extras import extra_import
from lightning_rl.langchain_runs import ROLE_KEY, ROLE_TAG_PREFIX, TRAINABLE_KEY, RoleInfo, role_metadata

INSTALL = "pip install 'lightning-langchain[langchain]'"
"""The command that installs the plugin with the framework it needs."""

with extra_import(INSTALL, "lightning-langchain needs LangChain", ("langchain_core",), IncompatibleFrameworkError):
    from lightning_langchain.handler import SPAN_ERROR, LightningCallbackHandler, response_id
    from lightning_langchain.instrumentor import LangChainInstrumentor, current_handler, instrument, uninstrument
    from lightning_langchain.roles import as_role, resolve_role

__all__ = [
    "LangChainInstrumentor",
    "instrument",
    "uninstrument",
    "current_handler",
    "LightningCallbackHandler",
    "as_role",
    "role_metadata",
    "resolve_role",
    "RoleInfo",
    "ROLE_KEY",
    "TRAINABLE_KEY",
    "ROLE_TAG_PREFIX",
    "SPAN_ERROR",
    "response_id",
    "INSTALL",
]
