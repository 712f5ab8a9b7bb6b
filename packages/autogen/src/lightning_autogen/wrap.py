"""``wrap(team_or_agent)``: route and record one AutoGen agent or team, and nothing else in the process.

The explicit, per-object integration (``AutoGenInstrumentor`` is the process-wide one). Wrapping
walks the team (nested teams too) and, for each agent:

* replaces its ``on_messages_stream`` with the observed one (an instance attribute, so only this
  object changes and ``unwrap`` just deletes it), which sets the agent's role for its model calls
  and records its tool results (``_turns``);
* routes its model client to the rollout's gateway with the agent's name as role (``_routing``);

and routes the team's own model client, if it has one (``SelectorGroupChat``'s speaker selector),
under ``selector_role``. Each wrap records what it changed on its own install handle, which
``unwrap`` restores. Outside a rollout nothing changes: requests go where the client points.
"""

from __future__ import annotations

import logging
from typing import Any, TypeVar

from autogen_agentchat.base import ChatAgent, Team

from lightning_autogen._routing import route
from lightning_autogen._turns import StreamFn, observed_stream, trainable_flags
from lightning_rl.plugins import Patches, http_client_of
from lightning_rl.roles import RoleSelector, RoleSpec

__all__ = ["wrap", "unwrap", "is_wrapped"]

_log = logging.getLogger("lightning_rl.plugins.autogen")

T = TypeVar("T", bound=ChatAgent | Team)


_STATE = "_lightning_autogen_wrapping"
"""The attribute holding a wrapped object's install handle (on the object, so it dies with it)."""


def _state(target: ChatAgent | Team) -> Patches | None:
    state: Any = vars(target).get(_STATE)
    return state if isinstance(state, Patches) else None


def _members(target: ChatAgent | Team) -> tuple[list[ChatAgent], list[Any]]:
    """The agents of ``target`` (depth first) and the teams' own model clients."""
    if isinstance(target, ChatAgent):
        return [target], []
    participants: Any = getattr(target, "_participants", None)
    if participants is None:
        raise TypeError(
            f"cannot wrap {type(target).__name__}: it exposes no participants; wrap its agents one by one instead."
        )
    agents: list[ChatAgent] = []
    clients: list[Any] = []
    own_client: Any = getattr(target, "_model_client", None)
    if own_client is not None:
        clients.append(own_client)
    for member in participants:
        sub_agents, sub_clients = _members(member)
        agents += sub_agents
        clients += sub_clients
    return agents, clients


def wrap(target: T, *, trainable: RoleSpec | RoleSelector = None, selector_role: str = "selector") -> T:
    """Route every model call of ``target``'s agents to the current rollout and record their roles and tools.

    Args:
        target: An AutoGen agent (``AssistantAgent``) or team (``RoundRobinGroupChat``,
            ``SelectorGroupChat``, nested teams). Returned unchanged in type, ready to ``run``.
        trainable: Which agents (by name) are trained: names, a regex or a predicate. The others'
            calls are recorded but excluded from training. None: let the trainer decide (all).
        selector_role: The role of the team's own model calls (``SelectorGroupChat``'s speaker
            selection); trainable like any role.

    Returns:
        ``target`` itself. Wrapping it again is a no-op; :func:`unwrap` restores it.
    """
    if _state(target) is not None:
        _log.debug("%r is already wrapped; wrap() ignored", target)
        return target
    agents, team_clients = _members(target)
    selection = None if trainable is None else RoleSelector.of(trainable)
    roles = [agent.name for agent in agents] + ([selector_role] if team_clients else [])
    flags = trainable_flags(lambda: selection, roles)

    patches = Patches()
    for agent in agents:
        if "on_messages_stream" not in vars(agent):  # not wrapped by another wrap() (its settings then apply)
            method: Any = type(agent).on_messages_stream
            # Under AutoGenInstrumentor the class method is already observed: wrap the original instead.
            original: StreamFn = getattr(method, "__lightning_original__", method).__get__(agent)
            patches.patch(agent, "on_messages_stream", observed_stream(agent.name, original, flags))
        client: Any = getattr(agent, "_model_client", None)
        if client is not None:
            route(patches, client, agent=agent.name)
    for client in team_clients:
        route(patches, client, selector=selector_role)
    unrouted = [a.name for a in agents if http_client_of(getattr(a, "_model_client", None)) is None]
    if unrouted:
        _log.debug("agents without an OpenAI model client (not routed): %s", unrouted)
    patches.patch(target, _STATE, patches)  # restoring removes it again
    return target


def unwrap(target: ChatAgent | Team) -> None:
    """Undo :func:`wrap`: the agents' streams and model clients are as before; a no-op if not wrapped."""
    patches = _state(target)
    if patches is not None:
        patches.restore()


def is_wrapped(target: ChatAgent | Team) -> bool:
    """Whether ``target`` is currently wrapped."""
    return _state(target) is not None
