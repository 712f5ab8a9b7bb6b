"""``wrap(team_or_agent)``: route and record one AutoGen agent or team, and nothing else in the process.

The explicit, per-object integration (``AutoGenInstrumentor`` is the process-wide one). Wrapping
walks the team (nested teams too) and, for each agent:

* replaces its ``on_messages_stream`` with the observed one (an instance attribute, so only this
  object changes and ``unwrap`` just deletes it), which sets the agent's role for its model calls
  and records its tool results (``_turns``);
* routes its model client to the rollout's gateway with the agent's name as role (``_routing``);

and routes the team's own model client, if it has one (``SelectorGroupChat``'s speaker selector),
under ``selector_role``. Outside a rollout nothing changes: requests go where the client points.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, TypeVar

from autogen_agentchat.base import ChatAgent, Team

from lightning_autogen._routing import add_owner, http_client_of, remove_owner
from lightning_autogen._turns import StreamFn, observed_stream
from lightning_rl.roles import RoleSelector, RoleSpec

__all__ = ["wrap", "unwrap", "is_wrapped"]

_log = logging.getLogger("lightning_rl.plugins.autogen")

T = TypeVar("T", bound=ChatAgent | Team)


@dataclass
class _Wrapping:
    """What one ``wrap`` changed, so ``unwrap`` can undo exactly that."""

    agents: list[ChatAgent] = field(default_factory=list[ChatAgent])
    """Agents whose ``on_messages_stream`` this wrap replaced."""
    owners: list[tuple[Any, str | None, str | None]] = field(default_factory=list[tuple[Any, str | None, str | None]])


_STATE = "_lightning_autogen_wrapping"
"""The attribute holding a wrapped object's ``_Wrapping`` (on the object, so it dies with it)."""


def _state(target: ChatAgent | Team) -> _Wrapping | None:
    state: Any = vars(target).get(_STATE)
    return state if isinstance(state, _Wrapping) else None


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

    def flags() -> dict[str, bool]:
        return {} if selection is None else {role: selection(role) for role in roles}

    done = _Wrapping()
    for agent in agents:
        current: Any = vars(agent).get("on_messages_stream")
        if current is None:  # not wrapped by another wrap() (that one's settings then apply)
            method: Any = type(agent).on_messages_stream
            # Under AutoGenInstrumentor the class method is already observed: wrap the original instead.
            original: StreamFn = getattr(method, "__lightning_original__", method).__get__(agent)
            agent.on_messages_stream = observed_stream(agent.name, original, flags)  # pyright: ignore[reportAttributeAccessIssue]
            done.agents.append(agent)
        client: Any = getattr(agent, "_model_client", None)
        if client is not None and add_owner(client, agent=agent.name):
            done.owners.append((client, agent.name, None))
    for client in team_clients:
        if add_owner(client, selector=selector_role):
            done.owners.append((client, None, selector_role))
    unrouted = [a.name for a in agents if http_client_of(getattr(a, "_model_client", None)) is None]
    if unrouted:
        _log.debug("agents without an OpenAI model client (not routed): %s", unrouted)
    setattr(target, _STATE, done)
    return target


def unwrap(target: ChatAgent | Team) -> None:
    """Undo :func:`wrap`: the agents' streams and model clients are as before; a no-op if not wrapped."""
    done = _state(target)
    if done is None:
        return
    delattr(target, _STATE)
    for agent in done.agents:
        vars(agent).pop("on_messages_stream", None)
    for client, agent_name, selector in done.owners:
        remove_owner(client, agent=agent_name, selector=selector)


def is_wrapped(target: ChatAgent | Team) -> bool:
    """Whether ``target`` is currently wrapped."""
    return _state(target) is not None
