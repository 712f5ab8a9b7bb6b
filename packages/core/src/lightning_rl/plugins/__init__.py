"""The plugin contract shared by every framework plugin (``lightning-langchain``, ...).

A plugin (a) routes the framework's model calls to the rollout's gateway URL (:mod:`.routing`),
(b) records which role made each call and (c) turns tool events into tool spans, the inputs of AIR
(:mod:`.record`), and (d) lets the user mark roles trainable (``instrument(trainable=...)``). It
subclasses :class:`Instrumentor`, records what it changes on its install handle (:class:`Patches`)
and registers under the ``lightning_rl.plugins`` entry-point group.
"""

from __future__ import annotations

from lightning_rl.plugins.base import Instrumentor, declared_trainable, framework_version, version_in_range
from lightning_rl.plugins.patches import Patches, http_client_of
from lightning_rl.plugins.record import PluginFailures, guarded, record_error, record_role, record_tool
from lightning_rl.plugins.registry import (
    ENTRY_POINT_GROUP,
    PluginInfo,
    available_plugins,
    describe_plugins,
    load_plugin,
)
from lightning_rl.plugins.routing import (
    RoleSource,
    Route,
    acting_as,
    add_route_user,
    async_request_hook,
    current_role,
    current_route,
    install_hooks,
    remove_hooks,
    remove_route_user,
    request_hook,
    route_request,
    routed_async_client,
    routed_client,
)
from lightning_rl.plugins.runs import Bounded, ToolRun, ToolRuns
from lightning_rl.plugins.tool_calls import ToolCallRef, same_arguments, tool_calls_in

__all__ = [
    "Instrumentor",
    "declared_trainable",
    "framework_version",
    "version_in_range",
    "Patches",
    "http_client_of",
    "record_role",
    "record_tool",
    "record_error",
    "guarded",
    "PluginFailures",
    "Bounded",
    "ToolRun",
    "ToolRuns",
    "ToolCallRef",
    "tool_calls_in",
    "same_arguments",
    "ENTRY_POINT_GROUP",
    "PluginInfo",
    "available_plugins",
    "load_plugin",
    "describe_plugins",
    "Route",
    "RoleSource",
    "current_route",
    "current_role",
    "acting_as",
    "route_request",
    "request_hook",
    "async_request_hook",
    "routed_client",
    "routed_async_client",
    "install_hooks",
    "remove_hooks",
    "add_route_user",
    "remove_route_user",
]
