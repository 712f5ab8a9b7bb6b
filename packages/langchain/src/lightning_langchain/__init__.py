"""Lightning plugin for LangChain / LangGraph: train chosen roles of a graph with RL, graph unchanged.

::

    import lightning_langchain
    lightning_langchain.instrument(trainable=["writer", "rewriter"])
    graph.invoke(...)   # inside a Lightning rollout: routed to the gateway, roles and tools recorded

Importing this package imports ``langchain_core`` (the handler subclasses its callback base class);
without it the import fails with one line naming the install command (the ``langchain`` extra).
``langchain-openai`` is only needed for routing ``ChatOpenAI`` and is imported when instrumenting.
"""

from __future__ import annotations

from lightning_rl.errors import IncompatibleFrameworkError
from lightning_rl.extras import extra_import

INSTALL = "pip install 'lightning-langchain[langchain]'"
"""The command that installs the plugin with the framework it needs."""

with extra_import(INSTALL, "lightning-langchain needs LangChain", ("langchain_core",), IncompatibleFrameworkError):
    from lightning_langchain.handler import SPAN_ERROR, LightningCallbackHandler, response_id
    from lightning_langchain.instrumentor import LangChainInstrumentor, current_handler, instrument, uninstrument
    from lightning_langchain.roles import (
        ROLE_KEY,
        ROLE_TAG_PREFIX,
        TRAINABLE_KEY,
        RoleInfo,
        as_role,
        resolve_role,
        role_metadata,
    )

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
