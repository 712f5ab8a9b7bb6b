"""One install handle per plugin: what it patched, which clients it routes, and how to undo both.

Every plugin changes a framework in the same three ways: it replaces attributes (a class method, an
instance's method), it puts the routing hook on the httpx clients the framework sends through, and
it registers something with the framework (a callback, a listener, a trace processor). Written by
hand in each plugin, that bookkeeping drifts: one restores in the wrong order, another takes the
routing hook off a client a second plugin still routes. :class:`Patches` keeps it once:

* :meth:`Patches.patch` replaces ``owner.name`` and remembers the original the first time only, so
  a second patch of the same attribute never records a wrapper as the "original";
* :meth:`Patches.hook_client` makes this handle a user of the client's routing hook, with its own
  role source: the hook is shared, added by its first user and removed with its last, so two
  plugins on one client each keep their roles until each lets go;
* :meth:`Patches.on_restore` records any other undo step;
* :meth:`Patches.restore` undoes everything in reverse order, every step even if one fails, and is
  idempotent. :meth:`Patches.applying` restores what a failed install had done so far.

Every method takes the handle's lock, so rollouts in worker threads may hook clients concurrently.
``Instrumentor`` gives each plugin one (``self.patches``) and restores it on ``uninstrument()``.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Generator
from contextlib import contextmanager
from typing import Any

import httpx

from lightning_rl.plugins.routing import RoleSource, add_route_user, remove_route_user

__all__ = ["Patches", "http_client_of"]

_log = logging.getLogger("lightning_rl.plugins")

_MISSING: Any = object()
"""Marks an attribute the owner did not hold itself (inherited or absent): restoring deletes it."""


def http_client_of(obj: object) -> httpx.Client | httpx.AsyncClient | None:
    """The httpx (or httpx2) client that sends ``obj``'s requests: ``obj`` itself, the one of an
    ``openai`` client (``obj._client``), or of a wrapper around one (``obj._client._client``); else None."""
    for _ in range(3):
        if hasattr(obj, "event_hooks") and hasattr(obj, "build_request"):
            return obj  # pyright: ignore[reportReturnType]
        obj = getattr(obj, "_client", None)
        if obj is None:
            return None
    return None


class Patches:
    """The record of one plugin's changes to a framework, and their undo (see the module docstring).

    Args:
        role: The default role source of the clients this handle routes (a name, a function asked
            at request time, or None: the role set by :func:`~lightning_rl.plugins.acting_as`).
    """

    def __init__(self, role: RoleSource = None) -> None:
        self.role = role
        self._lock = threading.RLock()
        self._originals: dict[tuple[int, str], tuple[Any, str, Any]] = {}
        self._clients: weakref.WeakSet[Any] = weakref.WeakSet()
        self._undo: list[Callable[[], object]] = []

    @property
    def hooked_clients(self) -> int:
        """How many httpx clients this handle routes now."""
        return len(self._clients)

    def clients(self) -> list[httpx.Client | httpx.AsyncClient]:
        """The httpx clients this handle routes now (for tests and debugging)."""
        return list(self._clients)

    def is_patched(self, owner: object, name: str) -> bool:
        """Whether this handle replaced ``owner.name``."""
        return (id(owner), name) in self._originals

    def original(self, owner: object, name: str) -> Any:
        """What ``owner.name`` was before this handle patched it (its current value if not patched)."""
        entry = self._originals.get((id(owner), name))
        if entry is None:
            own = vars(owner) if hasattr(owner, "__dict__") else {}
            return own[name] if name in own else getattr(owner, name)
        return getattr(owner, name) if entry[2] is _MISSING else entry[2]

    def patch(self, owner: object, name: str, new: Any) -> Any:
        """Set ``owner.name = new``, remembering the original the first time; returns the original.

        The original is what ``owner`` holds itself (``vars(owner)``): restoring an attribute the
        owner inherited or did not have deletes it again, so a class method or an instance
        attribute comes back exactly as it was.
        """
        with self._lock:
            key = (id(owner), name)
            if key not in self._originals:
                own = vars(owner).get(name, _MISSING) if hasattr(owner, "__dict__") else _MISSING
                self._originals[key] = (owner, name, own)
                self._undo.append(lambda: self._unpatch(key))
            setattr(owner, name, new)
            return self.original(owner, name)

    def wrap(self, owner: object, name: str, wrapper: Callable[[Any], Any]) -> Any:
        """``patch(owner, name, wrapper(original))``; returns the original."""
        with self._lock:
            return self.patch(owner, name, wrapper(self.original(owner, name)))

    def _unpatch(self, key: tuple[int, str]) -> None:
        owner, name, original = self._originals.pop(key)
        if original is _MISSING:
            if name in vars(owner):
                delattr(owner, name)
        else:
            setattr(owner, name, original)

    def hook_client(self, obj: object, role: RoleSource = None) -> bool:
        """Route the requests of ``obj`` (an httpx client, or an ``openai`` client holding one) to the
        current attempt, with ``role`` (default: the handle's) as this handle's role source.

        Returns True when this call added the client; False when this handle routes it already
        (the first role source stays) or ``obj`` has no httpx client.
        """
        http = http_client_of(obj)
        if http is None:
            return False
        with self._lock:
            if http in self._clients:
                return False
            add_route_user(http, self, role if role is not None else self.role)
            self._clients.add(http)
            ref = weakref.ref(http)
            self._undo.append(lambda: self._unhook(ref))
        return True

    def _unhook(self, ref: weakref.ref[Any]) -> None:
        http = ref()
        if http is not None:
            self._clients.discard(http)
            remove_route_user(http, self)

    def on_restore(self, undo: Callable[[], object]) -> None:
        """Run ``undo`` on :meth:`restore` (after every step recorded later, before earlier ones)."""
        with self._lock:
            self._undo.append(undo)

    def restore(self) -> list[Exception]:
        """Undo everything, last change first; idempotent. A step that fails is logged and the others
        still run; returns the failures (empty when the framework is back as it was)."""
        with self._lock:
            steps, self._undo = self._undo, []
            failures: list[Exception] = []
            for step in reversed(steps):
                try:
                    step()
                except Exception as exc:  # the remaining steps must still run
                    failures.append(exc)
                    _log.warning("a plugin could not undo one of its changes: %r", exc, exc_info=True)
            self._originals.clear()
            self._clients = weakref.WeakSet()
            return failures

    @contextmanager
    def applying(self) -> Generator[Patches]:
        """Install inside this block: if it raises, everything recorded so far is restored first."""
        try:
            yield self
        except BaseException:
            self.restore()
            raise

    def __len__(self) -> int:
        """How many undo steps are recorded (0: nothing to restore)."""
        return len(self._undo)

    def __bool__(self) -> bool:
        return True
