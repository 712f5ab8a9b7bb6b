"""Plugin discovery through the ``lightning_rl.plugins`` entry-point group.

A plugin package declares, in its ``pyproject.toml``::

    [project.entry-points."lightning_rl.plugins"]
    langchain = "lightning_langchain:LangChainInstrumentor"

so ``lightning-rl plugins`` and :func:`load_plugin` find it without Lightning knowing it exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata

from lightning_rl.errors import IncompatibleFrameworkError
from lightning_rl.plugins.base import Instrumentor, framework_version, version_in_range

__all__ = ["ENTRY_POINT_GROUP", "PluginInfo", "available_plugins", "load_plugin", "describe_plugins"]

ENTRY_POINT_GROUP = "lightning_rl.plugins"


def available_plugins() -> dict[str, metadata.EntryPoint]:
    """Installed plugins by name (not imported yet)."""
    return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def load_plugin(name: str) -> Instrumentor:
    """The (singleton) instrumentor of the installed plugin ``name``.

    Raises:
        LookupError: No plugin of that name is installed (the message lists those that are).
        IncompatibleFrameworkError: The plugin's framework is missing (an ``ImportError``).
        TypeError: The entry point does not name an ``Instrumentor`` subclass.
    """
    plugins = available_plugins()
    if name not in plugins:
        known = ", ".join(sorted(plugins)) or "none"
        raise LookupError(
            f"no Lightning plugin named {name!r} is installed (installed: {known}); pip install lightning-{name}"
        )
    try:
        cls = plugins[name].load()
    except ImportError as exc:  # the plugin is installed, its framework (an extra) is not
        raise IncompatibleFrameworkError(
            f"the {name} plugin cannot be imported ({exc}); install it with its framework: "
            f"pip install 'lightning-{name}[{name}]'"
        ) from exc
    if not (isinstance(cls, type) and issubclass(cls, Instrumentor)):
        raise TypeError(
            f"entry point {name!r} of group {ENTRY_POINT_GROUP!r} must name an Instrumentor subclass, got {cls!r}."
        )
    return cls()


@dataclass(frozen=True)
class PluginInfo:
    """One installed plugin, as ``lightning-rl plugins`` shows it."""

    name: str
    framework: str
    supported: str
    installed: str | None

    @property
    def ok(self) -> bool:
        return self.installed is not None and version_in_range(self.installed, self.supported)


def describe_plugins() -> list[PluginInfo]:
    """Every installed plugin with its framework's installed version and supported range."""
    out: list[PluginInfo] = []
    for name in sorted(available_plugins()):
        try:
            plugin = load_plugin(name)
        except Exception as exc:  # one broken plugin must not hide the others
            out.append(PluginInfo(name, f"(cannot load: {type(exc).__name__}: {exc})", "", None))
            continue
        out.append(PluginInfo(name, plugin.framework, plugin.supported, framework_version(plugin.framework)))
    return out
