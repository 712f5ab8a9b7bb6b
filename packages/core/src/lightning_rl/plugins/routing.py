"""Send a framework's model calls to the current rollout's gateway URL, whatever client it built.

Frameworks build their OpenAI clients long before a rollout starts (often at import time), and one
process runs many rollouts at once. So routing happens per *request*: an httpx request hook reads the
current rollout from its context variable and rewrites the request to the attempt's gateway URL
(``…/rollouts/{r}/attempts/{a}[/roles/{role}]/v1/<endpoint>``), plus the ``X-Lightning-*`` headers
and the gateway's key. Outside a rollout the request is left exactly as the framework made it, so
the same agent keeps working in production or evaluation.

Every framework here accepts an httpx client for its OpenAI client (``http_client=`` /
``http_async_client=``), or exposes one on the client it built (``client._client``), so
:func:`install_hooks` covers clients the user already made.

The role is known at request time when each agent has its own client (``role="writer"``), or when
the plugin runs the agent's code inside :func:`acting_as` (a context variable, so it is exact under
concurrency as long as the framework calls the model in the same context).
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Awaitable, Callable, Generator, Hashable
from contextlib import contextmanager
from dataclasses import dataclass
from types import EllipsisType
from typing import Any

import httpx

from lightning_rl.tracing import current_rollout

__all__ = [
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

_log = logging.getLogger(__name__)

RoleSource = str | Callable[[], str | None] | None
"""The role of a client's calls: a fixed name, a function asked at request time, or None (then the
role set by :func:`acting_as`, if any)."""

_role: contextvars.ContextVar[str | None] = contextvars.ContextVar("lightning_role", default=None)

# Endpoints whose path we recognise when the client's base URL has no ``/v1`` segment.
_HOOK_MARK = "_lightning_route_hook"
_hooks_lock = threading.RLock()  # rollouts in worker threads may reach a fresh client at the same time

_ENDPOINTS = ("/chat/completions", "/completions", "/responses", "/embeddings", "/models")


@dataclass(frozen=True)
class Route:
    """Where the current attempt's model calls go."""

    base_url: str
    """The attempt's (or role's) OpenAI base URL on the gateway, ending in ``/v1``."""
    api_key: str
    model: str
    rollout_id: str
    attempt_id: str
    role: str | None

    @property
    def headers(self) -> dict[str, str]:
        """The ``X-Lightning-*`` headers naming the attempt (and role, when it is plain ASCII:
        HTTP headers cannot carry other text, and the role URL already names it exactly)."""
        out = {"X-Lightning-Rollout": self.rollout_id, "X-Lightning-Attempt": self.attempt_id}
        if self.role and self.role.isascii() and self.role.isprintable():
            out["X-Lightning-Role"] = self.role
        return out


def current_role() -> str | None:
    """The role set by the innermost :func:`acting_as`, or None."""
    return _role.get()


@contextmanager
def acting_as(role: str | None) -> Generator[None]:
    """Attribute model calls made inside the block (same context) to ``role``."""
    token = _role.set(role)
    try:
        yield
    finally:
        _role.reset(token)


def _ask(role: RoleSource) -> str | None:
    if callable(role):
        try:
            return role()
        except Exception:  # a plugin's role lookup must never fail the user's call
            _log.debug("role lookup failed; call left unattributed", exc_info=True)
            return None
    return role


def _resolve(role: RoleSource) -> str | None:
    return _ask(role) or _role.get()


def current_route(role: RoleSource = None) -> Route | None:
    """The route of the current rollout attempt (None outside a rollout or without an ``LLM``)."""
    ctx = current_rollout()
    if ctx is None or ctx.llm is None:
        return None
    name = _resolve(role)
    llm = ctx.llm.for_role(name) if name else ctx.llm
    return Route(llm.base_url, llm.api_key, llm.model, ctx.rollout_id, ctx.attempt_id, name)


def _endpoint(path: str) -> str:
    """The OpenAI endpoint part of a request path: what follows the last ``/v1``, else a known tail."""
    _head, sep, tail = path.rpartition("/v1/")
    if sep:
        return "/" + tail
    for endpoint in _ENDPOINTS:
        index = path.find(endpoint)
        if index >= 0:
            return path[index:]
    return path if path.startswith("/") else "/" + path


def route_request(request: httpx.Request, role: RoleSource = None) -> bool:
    """Rewrite ``request`` to the current attempt's gateway URL; False (unchanged) outside a rollout."""
    route = current_route(role)
    if route is None:
        return False
    # Build everything first, then change the request: a failure leaves it untouched, never half-routed.
    # Same URL class as the request's: openai 3.x sends through ``httpx2``, whose types differ.
    url_type: Any = type(request.url)
    target = url_type(route.base_url.rstrip("/") + _endpoint(request.url.path))
    target = target.copy_with(query=request.url.query or None)
    headers = {"Host": target.netloc.decode("ascii"), "Authorization": f"Bearer {route.api_key}", **route.headers}
    request.url = target
    request.headers.update(headers)
    return True


class _Users:
    """The role sources of one routing hook, by owner (a plugin's install handle, or the role itself).

    Several plugins can route one client (a LangChain model and an Agents SDK model sharing the
    user's ``AsyncOpenAI``): each keeps its own role source until it lets go, and the hook asks
    them in the order they arrived; the first that names a role wins, else :func:`acting_as`.
    """

    def __init__(self) -> None:
        self.sources: dict[Hashable, RoleSource] = {}

    def role(self) -> str | None:
        for source in list(self.sources.values()):
            found = _ask(source)
            if found:
                return found
        return _role.get()


def _users_hook(users: _Users, is_async: bool) -> Callable[..., Any]:
    def route(request: httpx.Request) -> None:
        try:
            route_request(request, users.role)
        except Exception:  # never break the host's call; it goes where it was going
            _log.debug("could not route request to the gateway", exc_info=True)

    async def aroute(request: httpx.Request) -> None:
        route(request)

    hook = aroute if is_async else route
    setattr(hook, _HOOK_MARK, users)
    return hook


def _single(role: RoleSource) -> _Users:
    users = _Users()
    users.sources[_source_key(role)] = role
    return users


def request_hook(role: RoleSource = None) -> Callable[[httpx.Request], None]:
    """A synchronous httpx ``request`` event hook routing to the current attempt."""
    return _users_hook(_single(role), is_async=False)


def async_request_hook(role: RoleSource = None) -> Callable[[httpx.Request], Awaitable[None]]:
    """An asynchronous httpx ``request`` event hook routing to the current attempt."""
    return _users_hook(_single(role), is_async=True)


def routed_client(role: RoleSource = None, **kwargs: Any) -> httpx.Client:
    """An ``httpx.Client`` whose requests go to the current attempt's gateway (pass as ``http_client=``)."""
    hooks: dict[str, list[Callable[..., Any]]] = kwargs.pop("event_hooks", None) or {}
    hooks.setdefault("request", []).append(request_hook(role))
    return httpx.Client(event_hooks=hooks, **kwargs)


def routed_async_client(role: RoleSource = None, **kwargs: Any) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` whose requests go to the current attempt's gateway."""
    hooks: dict[str, list[Callable[..., Any]]] = kwargs.pop("event_hooks", None) or {}
    hooks.setdefault("request", []).append(async_request_hook(role))
    return httpx.AsyncClient(event_hooks=hooks, **kwargs)


def _source_key(role: RoleSource) -> Hashable:
    return ("role", role)


def _users_of(client: httpx.Client | httpx.AsyncClient) -> _Users | None:
    for hook in client.event_hooks.get("request", []):
        users = getattr(hook, _HOOK_MARK, None)
        if isinstance(users, _Users):
            return users
    return None


def add_route_user(client: httpx.Client | httpx.AsyncClient, owner: Hashable, role: RoleSource = None) -> bool:
    """Make ``owner`` a user of ``client``'s routing hook with its own role source (the hook is added
    by the first user); False when ``owner`` uses it already. Undo with :func:`remove_route_user`.

    Works on ``httpx2`` clients too (openai 3.x), which share httpx's hook API.
    """
    with _hooks_lock:
        users = _users_of(client)
        if users is None:
            users = _Users()
            hooks = client.event_hooks
            hook = _users_hook(users, is_async=hasattr(client, "aclose"))  # httpx(2).AsyncClient has aclose
            client.event_hooks = {**hooks, "request": [*hooks.get("request", []), hook]}
        if owner in users.sources:
            return False
        users.sources[owner] = role
        return True


def remove_route_user(client: httpx.Client | httpx.AsyncClient, owner: Hashable) -> bool:
    """Undo :func:`add_route_user`; the hook goes with its last user. Returns whether ``owner`` was one."""
    with _hooks_lock:
        users = _users_of(client)
        if users is None or owner not in users.sources:
            return False
        del users.sources[owner]
        if not users.sources:
            _drop_hooks(client)
        return True


def install_hooks(client: httpx.Client | httpx.AsyncClient, role: RoleSource = None) -> bool:
    """Add the routing hook to an existing httpx client with ``role`` as one of its role sources;
    False if that role source is there already.

    For clients the user built before instrumenting (``ChatOpenAI().root_client._client``). A plugin
    uses its install handle instead (:meth:`lightning_rl.plugins.Patches.hook_client`), which
    counts its users.
    """
    return add_route_user(client, _source_key(role), role)


def remove_hooks(client: httpx.Client | httpx.AsyncClient, role: RoleSource | EllipsisType = ...) -> bool:
    """Take the routing hook off ``client`` (with ``role``: only that role source, the hook going with
    the last); returns whether there was something to remove."""
    if role is not ...:
        return remove_route_user(client, _source_key(role))
    with _hooks_lock:
        return _drop_hooks(client)


def _drop_hooks(client: httpx.Client | httpx.AsyncClient) -> bool:
    hooks = client.event_hooks
    requests = list(hooks.get("request", []))
    kept = [h for h in requests if not getattr(h, _HOOK_MARK, False)]
    if len(kept) == len(requests):
        return False
    client.event_hooks = {**hooks, "request": kept}
    return True
