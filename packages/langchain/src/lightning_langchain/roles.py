"""Which role made a chat-model call, read from the run's LangChain metadata.

Training a multi-agent graph means deciding, for every model call, which agent ("role") made it:
only some roles are trained, and each role's calls form its own transitions. LangChain hands
every callback the run's inherited ``metadata`` and ``tags``, which already say a lot:

* an explicit label the user set (:func:`as_role` / :func:`role_metadata`, or a
  ``lightning_role:<name>`` tag) — the user knows best, so it wins;
* ``lc_agent_name``: the ``name=`` of a ``langchain.agents.create_agent`` agent;
* ``checkpoint_ns``: inside a subgraph it starts with the parent graph's node that runs the
  subgraph (``"researcher:<id>"``), so every call inside one subgraph gets one role;
* ``langgraph_node``: the node of the graph the call was made in.

That is the precedence (explicit > agent name > subgraph > node). Labels are plain metadata, so
they flow to every call made inside the labelled runnable, and nothing here needs the framework
to be patched.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, overload

from langchain_core.runnables import Runnable, RunnableLambda

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

ROLE_KEY = "lightning_role"
"""Metadata key naming the role of every model call inside a runnable."""

TRAINABLE_KEY = "lightning_trainable"
"""Metadata key declaring whether that role is trained (a bool); absent: ``instrument(trainable=...)`` decides."""

ROLE_TAG_PREFIX = "lightning_role:"
"""A tag ``lightning_role:<name>`` labels a runnable like the ``lightning_role`` metadata key."""

RoleSource = Literal["explicit", "agent_name", "subgraph", "node", "none"]
"""Where a role came from, recorded on the role span (``lightning.role.source``)."""

InputT = TypeVar("InputT")
OutputT = TypeVar("OutputT")


@dataclass(frozen=True)
class RoleInfo:
    """The role of one run and how it was found."""

    role: str | None
    source: RoleSource
    trainable: bool | None = None
    """The explicit ``lightning_trainable`` flag, if the user set one."""
    agent_name: str | None = None
    """``lc_agent_name`` or the graph node, for the role span's ``gen_ai.agent.name``."""


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _subgraph_head(namespace: Any) -> str | None:
    """``"researcher:<id>|model:<id>"`` -> ``"researcher"``: the top-level node running the subgraph."""
    text = _text(namespace)
    if text is None:
        return None
    head = text.split("|", 1)[0].split(":", 1)[0]
    return head or None


def resolve_role(metadata: Mapping[str, Any] | None, tags: Sequence[str] | None = None) -> RoleInfo:
    """The role of a run from its callback ``metadata`` and ``tags`` (see the module docstring)."""
    md: Mapping[str, Any] = metadata or {}
    flag = md.get(TRAINABLE_KEY)
    trainable = flag if isinstance(flag, bool) else None
    node = _text(md.get("langgraph_node"))
    agent = _text(md.get("lc_agent_name"))
    explicit = _text(md.get(ROLE_KEY))
    if explicit is None:
        tagged = [t[len(ROLE_TAG_PREFIX) :] for t in tags or () if t.startswith(ROLE_TAG_PREFIX)]
        explicit = tagged[-1] if tagged and tagged[-1] else None
    if explicit is not None:
        return RoleInfo(explicit, "explicit", trainable, agent or node)
    if agent is not None:
        return RoleInfo(agent, "agent_name", trainable, agent)
    head = _subgraph_head(md.get("checkpoint_ns"))
    if head is not None and head != node:
        return RoleInfo(head, "subgraph", trainable, node)
    if node is not None:
        return RoleInfo(node, "node", trainable, node)
    return RoleInfo(head, "subgraph" if head else "none", trainable, None)


def role_metadata(role: str, *, trainable: bool | None = None) -> dict[str, Any]:
    """The metadata that labels a runnable as ``role``: for ``with_config(metadata=...)`` or
    ``StateGraph.add_node(..., metadata=...)``.

    Args:
        role: The role name every model call inside the runnable gets.
        trainable: Whether the role is trained; None leaves it to ``instrument(trainable=...)``.
    """
    if not role:
        raise ValueError("role_metadata() needs a non-empty role name, e.g. role_metadata('writer').")
    out: dict[str, Any] = {ROLE_KEY: role}
    if trainable is not None:
        out[TRAINABLE_KEY] = trainable
    return out


@overload
def as_role(
    runnable: Runnable[InputT, OutputT], role: str, *, trainable: bool | None = None
) -> Runnable[InputT, OutputT]: ...
@overload
def as_role(
    runnable: Callable[[InputT], OutputT], role: str, *, trainable: bool | None = None
) -> Runnable[InputT, OutputT]: ...
def as_role(
    runnable: Runnable[InputT, OutputT] | Callable[[InputT], OutputT], role: str, *, trainable: bool | None = None
) -> Runnable[InputT, OutputT]:
    """Label ``runnable`` (a node, a chain, a chat model, or a plain function) as ``role``.

    Every model call made inside it is attributed to ``role``, whatever node or agent it runs in::

        graph.add_node("writer", as_role(write_query, "writer", trainable=True))

    A plain function is wrapped in a ``RunnableLambda``; if the node needs LangGraph's injected
    arguments (``runtime``, ``store``), keep the function and pass
    ``metadata=role_metadata("writer", trainable=True)`` to ``add_node`` instead.
    """
    metadata = role_metadata(role, trainable=trainable)
    base: Runnable[InputT, OutputT] = runnable if isinstance(runnable, Runnable) else RunnableLambda(runnable)
    return base.with_config(metadata=metadata)
