"""Labels that name the role of a runnable's model calls; core resolves them (:mod:`lightning_rl.langchain_runs`).

The order roles are found in (explicit label > agent name > subgraph > node) lives in core, because
core's capture reads the same LangChain metadata from OpenInference spans; see the README's "Roles".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from langchain_core.runnables import Runnable, RunnableLambda

from lightning_rl.langchain_runs import ROLE_KEY, ROLE_TAG_PREFIX, TRAINABLE_KEY, RoleInfo, role_metadata
from lightning_rl.langchain_runs import RoleOrigin as RoleSource
from lightning_rl.langchain_runs import role_from_metadata as resolve_role

__all__ = [
    "ROLE_KEY",
    "TRAINABLE_KEY",
    "ROLE_TAG_PREFIX",
    "RoleSource",
    "RoleInfo",
    "resolve_role",
    "role_metadata",
    "as_role",
]

InputT = TypeVar("InputT")
OutputT = TypeVar("OutputT")


def as_role(
    runnable: Runnable[InputT, OutputT] | Callable[[InputT], OutputT], role: str, *, trainable: bool | None = None
) -> Runnable[InputT, OutputT]:
    """Label ``runnable`` (a node, a chain, a chat model, or a plain function) as ``role``: every model call
    made inside it gets ``role``. A function is wrapped in a ``RunnableLambda``, which hides LangGraph's injected
    arguments (``runtime``, ``store``) from it: for such a node pass ``metadata=role_metadata(...)`` to ``add_node``.
    """
    metadata = role_metadata(role, trainable=trainable)
    base: Runnable[InputT, OutputT] = runnable if isinstance(runnable, Runnable) else RunnableLambda(runnable)
    return base.with_config(metadata=metadata)
