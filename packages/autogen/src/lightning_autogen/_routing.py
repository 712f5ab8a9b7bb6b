"""Route AutoGen model clients to the rollout's gateway, with the calling agent's role in the URL.

Core's routing hook goes on the httpx client under the ``OpenAIChatCompletionClient``'s
``AsyncOpenAI``. A request's role is (1) the one set by :func:`~lightning_rl.plugins.acting_as`,
which the agent wrapper enters around each step of an agent's turn (exact even when agents share
one model client, as AutoGen's own examples do), else (2) the client's single owner: the team's
speaker selector, or the one agent that uses it. Neither (a shared client used outside any
wrapped agent): the attempt URL without a role. Owners are counted per client and released by the
install handle that routed them, so wrapping twice and unwrapping once leaves routing in place.
"""

from __future__ import annotations

import logging
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from lightning_rl.plugins import Patches, current_role, http_client_of

__all__ = ["route", "ClientOwners"]

_log = logging.getLogger("lightning_rl.plugins.autogen")


@dataclass
class ClientOwners:
    """Who uses one httpx client: agent names and selector roles, with counts."""

    agents: Counter[str] = field(default_factory=Counter[str])
    selectors: Counter[str] = field(default_factory=Counter[str])

    def default_role(self) -> str | None:
        """The role of a call made outside any wrapped agent's turn."""
        selectors = [name for name, n in self.selectors.items() if n > 0]
        if len(selectors) == 1:
            return selectors[0]
        agents = [name for name, n in self.agents.items() if n > 0]
        return agents[0] if len(agents) == 1 and not selectors else None

    def role(self) -> str | None:
        return current_role() or self.default_role()


_owners: weakref.WeakKeyDictionary[Any, ClientOwners] = weakref.WeakKeyDictionary()


def route(patches: Patches, model_client: object, *, agent: str | None = None, selector: str | None = None) -> bool:
    """Route ``model_client`` through ``patches``, counting ``agent`` or ``selector`` (if given) as its
    owner until ``patches`` restores; False if it is not routable."""
    http = http_client_of(model_client)
    if http is None or not hasattr(http, "aclose"):
        _log.debug("model client %s is not an OpenAI client; its calls are not routed", type(model_client).__name__)
        return False
    owners = _owners.get(http)
    if owners is None:
        owners = _owners[http] = ClientOwners()
    patches.hook_client(http, role=owners.role)
    counts, name = (owners.agents, agent) if agent is not None else (owners.selectors, selector)
    if name is not None:
        counts[name] += 1
        patches.on_restore(lambda: counts.subtract([name]))
    return True
