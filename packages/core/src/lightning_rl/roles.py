"""Which agent roles are trainable.

Every plugin and the adapter accept the same selector: ``None``/``"all"`` (every role), a role
name, a list of names, a compiled regex, or a predicate ``(role) -> bool``. ``RoleSelector``
normalises them once so the check on the hot path is a cheap call.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

__all__ = ["RoleSpec", "RoleSelector", "adapter_name"]

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")

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


def adapter_name(role: str) -> str:
    """The name of ``role``'s LoRA adapter under per-role adapters (``TrainerConfig.adapters="per_role"``).

    PEFT keeps adapters in ``ModuleDict``s, whose keys may not contain ``.``, and the exported
    adapters become folder names; so every character outside ``[A-Za-z0-9_-]`` becomes ``_``
    (``team/writer`` -> ``team_writer``); a name inside ``lora_`` (PEFT's parameter prefix, which it
    would confuse with the adapter on loading) gets a ``role_`` prefix. The trainer refuses two roles
    that map to one name."""
    if not role:
        raise ValueError("a per-role adapter needs a role name; calls without a role are served by the base weights.")
    name = _UNSAFE.sub("_", role)
    return f"role_{name}" if name in "lora_" else name
