"""Agent roles: which are trainable, and which one made a call according to LangChain's run metadata.

Every plugin and the adapter accept the same selector: ``None``/``"all"`` (every role), a role
name, a list of names, a compiled regex, or a predicate ``(role) -> bool``. ``RoleSelector``
normalises them once so the check on the hot path is a cheap call.

LangChain hands a run's inherited ``metadata`` (and ``tags``) to its callbacks, and OpenInference
records the same metadata on its spans, so the LangChain plugin (from callbacks) and core's capture
(from spans) name a role the same way, here: an explicit label (``lightning_role`` or a
``lightning_role:<name>`` tag; the user knows best) > ``lc_agent_name`` (``create_agent(name=)``) >
the subgraph (the head of ``checkpoint_ns``: the parent graph's node running it) > ``langgraph_node``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "RoleSpec",
    "RoleSelector",
    "ROLE_KEY",
    "TRAINABLE_KEY",
    "ROLE_TAG_PREFIX",
    "RoleOrigin",
    "RoleInfo",
    "role_from_metadata",
    "role_metadata",
]

RoleSpec = str | Iterable[str] | re.Pattern[str] | Callable[[str | None], bool] | Literal["all"] | None
"""What users pass as ``trainable=``: see the module docstring."""


@dataclass(frozen=True)
class RoleSelector:
    """A normalised trainable-role selection. ``RoleSelector.of(spec)`` builds one from any ``RoleSpec``."""

    predicate: Callable[[str | None], bool]
    description: str

    @classmethod
    def of(cls, spec: RoleSpec | RoleSelector) -> RoleSelector:
        if isinstance(spec, RoleSelector):
            return spec
        if spec is None or spec == "all":
            return cls(lambda _role: True, "all roles")
        if isinstance(spec, re.Pattern):
            pattern = spec
            return cls(
                lambda role: role is not None and pattern.fullmatch(role) is not None,
                f"roles matching {pattern.pattern!r}",
            )
        if isinstance(spec, str):
            name = spec
            return cls(lambda role: role == name, f"role {name!r}")
        if callable(spec):
            fn = spec
            return cls(lambda role: bool(fn(role)), getattr(fn, "__name__", "a predicate"))
        names = frozenset(spec)
        bad = [n for n in names if not isinstance(n, str)]  # pyright: ignore[reportUnnecessaryIsInstance]
        if bad:
            raise TypeError(f"trainable roles must be strings, got {bad!r}; pass names, a regex or a predicate.")
        return cls(lambda role: role in names, f"roles {sorted(names)}")

    def __call__(self, role: str | None) -> bool:
        return self.predicate(role)


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
