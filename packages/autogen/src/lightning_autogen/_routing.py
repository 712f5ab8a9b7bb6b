"""Route AutoGen model clients to the rollout's gateway, with the calling agent's role in the URL.

An ``OpenAIChatCompletionClient`` keeps an ``AsyncOpenAI`` client whose httpx client sends every
request; core's :func:`~lightning_rl.plugins.install_hooks` adds the routing hook to it. The role
of each request is decided when it is sent:

1. the role set by :func:`~lightning_rl.plugins.acting_as`, which the agent wrapper enters around
   each step of an agent's turn (exact even when several agents share one model client, which
   AutoGen's own examples do);
2. otherwise the client's single owner: the team's speaker selector when the client is the
   selector's (an agent's call always carries its own role by rule 1, so a role-less call on the
   selector's client is the selector's), or the one agent that uses the client.

A call with neither (a shared client used outside any wrapped agent) goes to the attempt URL
without a role. Owners are counted, so wrapping twice and unwrapping once leaves routing in place.
"""

from __future__ import annotations

import logging
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from lightning_rl.plugins import current_role, install_hooks, remove_hooks

__all__ = ["http_client_of", "add_owner", "remove_owner", "ClientOwners"]

_log = logging.getLogger("lightning_rl.plugins.autogen")


@dataclass
class ClientOwners:
    """Who uses one httpx client: agent names and selector roles (with counts), and the hook's origin."""

    agents: Counter[str] = field(default_factory=Counter[str])
    selectors: Counter[str] = field(default_factory=Counter[str])
    global_users: int = 0
    """``AutoGenInstrumentor`` routes the client (no owner known)."""
    installed: bool = False
    """Whether our hook is the one on the client (False: one was already there; never remove it)."""

    def default_role(self) -> str | None:
        """The role of a call made outside any wrapped agent's turn."""
        selectors = [name for name, n in self.selectors.items() if n > 0]
        if len(selectors) == 1:
            return selectors[0]
        agents = [name for name, n in self.agents.items() if n > 0]
        return agents[0] if len(agents) == 1 and not selectors else None

    def role(self) -> str | None:
        return current_role() or self.default_role()

    @property
    def unused(self) -> bool:
        return self.global_users <= 0 and not +self.agents and not +self.selectors


_owners: weakref.WeakKeyDictionary[httpx.AsyncClient, ClientOwners] = weakref.WeakKeyDictionary()


def http_client_of(model_client: object) -> httpx.AsyncClient | None:
    """The httpx client under an AutoGen OpenAI/Azure model client (or the httpx client itself), else None."""
    http: Any = model_client
    if not hasattr(http, "event_hooks"):
        openai_client: Any = getattr(model_client, "_client", None)
        http = getattr(openai_client, "_client", None)
    if http is None or not hasattr(http, "event_hooks") or not hasattr(http, "aclose"):
        return None
    return http


def add_owner(model_client: object, *, agent: str | None = None, selector: str | None = None) -> bool:
    """Route ``model_client`` and count ``agent``/``selector`` (neither: a global user); False if not routable."""
    http = http_client_of(model_client)
    if http is None:
        _log.debug("model client %s is not an OpenAI client; its calls are not routed", type(model_client).__name__)
        return False
    owners = _owners.get(http)
    if owners is None:
        owners = ClientOwners()
        owners.installed = install_hooks(http, role=owners.role)
        _owners[http] = owners
    if agent is not None:
        owners.agents[agent] += 1
    elif selector is not None:
        owners.selectors[selector] += 1
    else:
        owners.global_users += 1
    return True


def remove_owner(model_client: object, *, agent: str | None = None, selector: str | None = None) -> None:
    """Undo one :func:`add_owner`; the hook goes once the client has no owner left."""
    http = http_client_of(model_client)
    owners = None if http is None else _owners.get(http)
    if http is None or owners is None:
        return
    if agent is not None:
        owners.agents[agent] -= 1
    elif selector is not None:
        owners.selectors[selector] -= 1
    else:
        owners.global_users -= 1
    if owners.unused:
        if owners.installed:
            remove_hooks(http)
        del _owners[http]
