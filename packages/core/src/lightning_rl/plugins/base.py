"""The plugin contract: what every framework plugin (LangChain, AutoGen, ...) implements.

Modelled on OpenTelemetry's ``BaseInstrumentor``: one instance per plugin class, ``instrument()``
and ``uninstrument()`` are idempotent (a second call is a no-op that logs at debug level, so a
library and its user can both call it), and the plugin declares the framework distribution and the
version range it was verified against, checked before any patching happens. What a plugin patches
is its own business (``_instrument``), recorded on its install handle (``self.patches``, a
:class:`~lightning_rl.plugins.Patches`), which ``uninstrument()`` restores, as it does when
``_instrument`` fails half-way; what is common to all plugins (routing to the rollout's gateway
URL, role and tool spans, trainable roles) lives next to this module.
"""

from __future__ import annotations

import logging
import re
import threading
from abc import ABC, abstractmethod
from importlib import metadata
from typing import Any, ClassVar, Self

from lightning_rl.errors import IncompatibleFrameworkError
from lightning_rl.plugins.patches import Patches
from lightning_rl.roles import RoleSelector, RoleSpec

__all__ = ["Instrumentor", "declared_trainable", "framework_version", "version_in_range"]

_log = logging.getLogger(__name__)

_RANGE = re.compile(r"^\s*(>=|<=|==|!=|>|<)\s*([0-9][0-9A-Za-z.+-]*)\s*$")


def _release(version: str) -> tuple[int, ...]:
    """The numeric release part of a PEP 440 version (``"1.7.2rc1"`` -> ``(1, 7, 2)``)."""
    parts: list[int] = []
    for piece in version.split("+")[0].split("."):
        digits = re.match(r"\d+", piece)
        if digits is None:
            break
        parts.append(int(digits.group()))
        if digits.end() != len(piece):  # a pre/post/dev suffix ends the release segment
            break
    return tuple(parts)


def version_in_range(version: str, spec: str) -> bool:
    """Whether ``version`` satisfies a comma-separated range such as ``">=1.0,<2"``.

    Only release numbers are compared (pre-releases count as their release), which is what a
    framework range needs; ``packaging`` is not a dependency of the agent-side install.

    Raises:
        ValueError: ``spec`` is not a list of ``<op><version>`` clauses.
    """
    have = _release(version)
    for clause in filter(None, (c.strip() for c in spec.split(","))):
        match = _RANGE.match(clause)
        if match is None:
            raise ValueError(f"cannot read version clause {clause!r} in {spec!r}; write e.g. '>=1.0,<2'.")
        op, bound = match.group(1), _release(match.group(2))
        width = max(len(have), len(bound))
        a, b = have + (0,) * (width - len(have)), bound + (0,) * (width - len(bound))
        ok = {">=": a >= b, "<=": a <= b, "==": a == b, "!=": a != b, ">": a > b, "<": a < b}[op]
        if not ok:
            return False
    return True


def framework_version(distribution: str) -> str | None:
    """The installed version of ``distribution``, or None when it is not installed."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


class Instrumentor(ABC):
    """Base class of a framework plugin. Subclasses set the class attributes and the two hooks.

    Attributes:
        name: The plugin's short name (also its entry-point name), e.g. ``"langchain"``.
        framework: The distribution whose version is checked, e.g. ``"langchain-core"``.
        supported: The verified version range of ``framework``, e.g. ``">=1.0,<2"``.
        install_hint: What to run when the framework is missing.
    """

    name: ClassVar[str]
    framework: ClassVar[str]
    supported: ClassVar[str]
    install_hint: ClassVar[str] = ""

    _instances: ClassVar[dict[type[Instrumentor], Instrumentor]] = {}
    _instances_lock: ClassVar[threading.Lock] = threading.Lock()

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        # One instance per plugin class: instrumenting is process-global state.
        with Instrumentor._instances_lock:
            instance = Instrumentor._instances.get(cls)
            if instance is None:
                instance = super().__new__(cls)
                instance._instrumented = False
                instance._trainable = None
                instance._lock = threading.RLock()
                instance._patches = Patches()
                Instrumentor._instances[cls] = instance
        return instance  # pyright: ignore[reportReturnType]

    _instrumented: bool
    _trainable: RoleSelector | None
    _lock: threading.RLock
    _patches: Patches

    @property
    def patches(self) -> Patches:
        """This plugin's install handle: what ``_instrument`` patches, hooks and registers goes here,
        and ``uninstrument()`` undoes it (a fresh one per ``instrument()``)."""
        return self._patches

    @property
    def is_instrumented(self) -> bool:
        """Whether ``instrument()`` is in effect."""
        return self._instrumented

    @property
    def trainable(self) -> RoleSelector | None:
        """The trainable-role selection given to ``instrument()`` (None: the trainer decides)."""
        return self._trainable

    def is_trainable(self, role: str | None) -> bool | None:
        """Whether ``role`` is trainable by this plugin's selection; None when none was given."""
        return None if self._trainable is None else self._trainable(role)

    @classmethod
    def check_framework(cls) -> str:
        """The installed framework version, after checking it is in ``supported``.

        Raises:
            IncompatibleFrameworkError: The framework is missing or its version is out of range.
        """
        version = framework_version(cls.framework)
        if version is None:
            hint = cls.install_hint or f"pip install '{cls.framework}{cls.supported}'"
            raise IncompatibleFrameworkError(f"the {cls.name} plugin needs {cls.framework}; install it: {hint}")
        if not version_in_range(version, cls.supported):
            raise IncompatibleFrameworkError(
                f"the {cls.name} plugin supports {cls.framework}{cls.supported}, but {version} is installed; "
                f"install a supported version (pip install '{cls.framework}{cls.supported}') or pass "
                "check_version=False to try anyway."
            )
        return version

    def instrument(
        self, *, trainable: RoleSpec | RoleSelector = None, check_version: bool = True, **kwargs: Any
    ) -> Self:
        """Start recording (and routing) the framework's calls; idempotent.

        Args:
            trainable: Which roles are trainable (names, a regex or a predicate). Recorded on each
                role span; the trainer honours it unless given its own ``trainable=``. None leaves
                the choice to the trainer (default: all roles).
            check_version: Refuse a framework version outside ``supported`` (default True).
            **kwargs: Plugin-specific options.

        Raises:
            IncompatibleFrameworkError: The framework is missing or unsupported.
        """
        with self._lock:
            if self._instrumented:
                _log.debug("%s plugin is already instrumented; instrument() ignored", self.name)
                return self
            if check_version:
                self.check_framework()
            self._trainable = None if trainable is None else RoleSelector.of(trainable)
            self._patches = Patches()
            try:
                with self._patches.applying():  # a failure half-way leaves nothing applied
                    self._instrument(**kwargs)
            except BaseException:
                self._trainable = None
                raise
            self._instrumented = True
        return self

    def uninstrument(self) -> None:
        """Undo ``instrument()``: the framework behaves exactly as before; idempotent."""
        with self._lock:
            if not self._instrumented:
                _log.debug("%s plugin is not instrumented; uninstrument() ignored", self.name)
                return
            try:
                self._uninstrument()
            finally:
                self._patches.restore()
                self._instrumented = False
                self._trainable = None

    @abstractmethod
    def _instrument(self, **kwargs: Any) -> None:
        """Patch/register with the framework through ``self.patches``. Called once per ``instrument()``
        that takes effect; should it raise, what it recorded on ``self.patches`` is undone."""

    def _uninstrument(self) -> None:  # noqa: B027 - optional: most plugins need only the handle
        """Undo what ``_instrument`` did outside ``self.patches`` (run before the handle restores)."""


def declared_trainable(role: str | None) -> bool | None:
    """Whether the instrumented plugins of this process declare ``role`` trainable.

    True when any plugin's ``instrument(trainable=...)`` selects it, False when some plugin made a
    selection and none selects it, None when no instrumented plugin made one (the trainer then
    decides). The same rule as the adapter's for calls no plugin declared: once a role is named
    trainable, everything else is not. Read at call time (the trainer's frozen-role routing asks it
    for every call), so it follows ``instrument()``/``uninstrument()`` as they happen.
    """
    with Instrumentor._instances_lock:  # pyright: ignore[reportPrivateUsage]
        plugins = list(Instrumentor._instances.values())  # pyright: ignore[reportPrivateUsage]
    answers = [p.is_trainable(role) for p in plugins if p.is_instrumented]
    if any(a is True for a in answers):
        return True
    return False if any(a is False for a in answers) else None
