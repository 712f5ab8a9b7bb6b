"""What core reads from a LangChain run: the role that made a model call, and the call's response id.

The LangChain plugin reads them from its callbacks, core's capture from the spans OpenInference
records (the same run metadata, the ``LLMResult`` as JSON); both go through here so a call is
attributed the same way on either path. A role is, in this order: an explicit label
(``lightning_role`` or a ``lightning_role:<name>`` tag; the user knows best) > ``lc_agent_name``
(``create_agent(name=)``) > the subgraph (the head of ``checkpoint_ns``: the parent graph's node
running it) > ``langgraph_node``. Only the standard library is used: ``import lightning_rl`` stays light.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "ROLE_KEY",
    "TRAINABLE_KEY",
    "ROLE_TAG_PREFIX",
    "RoleOrigin",
    "RoleInfo",
    "role_from_metadata",
    "role_metadata",
    "response_id_of",
]


ROLE_KEY = "lightning_role"
"""Run-metadata key naming the role of every model call inside a runnable."""

TRAINABLE_KEY = "lightning_trainable"
"""Run-metadata key declaring whether that role is trained (a bool); absent: ``instrument(trainable=...)`` decides."""

ROLE_TAG_PREFIX = "lightning_role:"
"""A tag ``lightning_role:<name>`` labels a runnable like the ``lightning_role`` metadata key."""

RoleOrigin = Literal["explicit", "agent_name", "subgraph", "node", "none"]
"""Where a role came from, recorded on the role span (``lightning.role.source``)."""


@dataclass(frozen=True)
class RoleInfo:
    """The role of one run and how it was found."""

    role: str | None
    source: RoleOrigin
    trainable: bool | None = None
    """The explicit ``lightning_trainable`` flag, if the user set one."""
    agent_name: str | None = None
    """``lc_agent_name`` or the graph node, for the role span's ``gen_ai.agent.name``."""


def role_metadata(role: str, *, trainable: bool | None = None) -> dict[str, Any]:
    """The run metadata labelling a runnable as ``role`` (``trainable`` None: ``instrument(trainable=)`` decides)."""
    if not role:
        raise ValueError("role_metadata() needs a non-empty role name, e.g. role_metadata('writer').")
    out: dict[str, Any] = {ROLE_KEY: role}
    if trainable is not None:
        out[TRAINABLE_KEY] = trainable
    return out


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def role_from_metadata(metadata: Mapping[str, Any] | None, tags: Sequence[str] | None = None) -> RoleInfo:
    """The role of a LangChain run from its ``metadata`` and ``tags``, in the module docstring's order."""
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
    # "researcher:<id>|model:<id>" -> "researcher": the top-level node running the subgraph
    namespace = _text(md.get("checkpoint_ns")) or _text(md.get("langgraph_checkpoint_ns"))
    head = _text(namespace.split("|", 1)[0].split(":", 1)[0]) if namespace else None
    if head is not None and head != node:
        return RoleInfo(head, "subgraph", trainable, node)
    if node is not None:
        return RoleInfo(node, "node", trainable, node)
    return RoleInfo(None, "none", trainable, None)


_LC_GENERATED_ID_PREFIXES = ("lc_run-", "run-")


def _field(obj: Any, name: str) -> Any:
    """``obj.name`` or ``obj[name]``: a result comes as LangChain's objects or as their JSON."""
    return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)


def response_id_of(result: Any) -> str | None:
    """The provider's id (``chatcmpl-…`` / ``resp_…``) of a LangChain ``LLMResult``, as the object or as
    tracers record it; None when LangChain kept none (a streamed chat completion)."""
    for generations in _field(result, "generations") or ():
        for generation in generations or ():
            message = _field(generation, "message")
            if isinstance(message, Mapping) and isinstance(message.get("kwargs"), Mapping):
                message = message["kwargs"]  # LangChain's dumpd form
            rid = _field(_field(message, "response_metadata"), "id")
            if isinstance(rid, str) and rid:
                return rid
            mid = _field(message, "id")
            if isinstance(mid, str) and mid and not mid.startswith(_LC_GENERATED_ID_PREFIXES):
                return mid
    rid = _field(_field(result, "llm_output"), "id")
    return rid if isinstance(rid, str) and rid else None
