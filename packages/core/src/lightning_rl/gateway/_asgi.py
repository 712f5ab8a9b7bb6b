"""The raw pieces of the gateway's hot path: route matching, the call's context, the 413.

Through FastAPI a model call walks a dozen middleware layers, regex-matches up to 16 routes and
builds a ``Request``: measured under load, about a third of the gateway's CPU per call. So the
model-call routes (``/v1/chat/completions``, ``/v1/completions``, ``/v1/responses``, bare or under
``/rollouts/...``) are matched here by splitting the path once, for ``_GatewayApp.call_for``, their
one entry point; everything else still goes to FastAPI.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from lightning_rl.gateway.protocol import GatewayHTTPError
from lightning_rl.gateway.recording import CallContext

__all__ = ["CallKind", "match_call", "call_context", "body_too_large"]

CallKind = Literal["chat", "completions", "responses"]

_TAILS: dict[str, CallKind] = {"chat/completions": "chat", "completions": "completions", "responses": "responses"}
"""The model-call routes: what follows ``/v1/``."""


def match_call(path: str) -> tuple[CallKind, str | None, str | None, str | None, str | None] | None:
    """``(kind, rollout_id, attempt_id, key, role)`` when ``path`` is a model-call route, else ``None``:
    ``[/rollouts/R[/attempts/A][/key/K][/roles/ROLE]]/v1/<api>``, every segment non-empty, ROLE
    possibly holding ``/``, ``K`` the attempt's key (``Attempt.gateway_key``)."""
    head, sep, tail = path.rpartition("/v1/")
    if not sep:
        return None
    kind = _TAILS.get(tail)
    if kind is None:
        return None
    if not head:
        return kind, None, None, None, None
    parts = head.split("/")
    n = len(parts)
    if n < 3 or parts[0] or parts[1] != "rollouts" or not parts[2]:
        return None
    attempt = key = role = None
    i = 3
    if i < n and parts[i] == "attempts":
        if i + 1 >= n or not parts[i + 1]:
            return None
        attempt = parts[i + 1]
        i += 2
    if i < n and parts[i] == "key":
        if i + 1 >= n or not parts[i + 1]:
            return None
        key = parts[i + 1]
        i += 2
    if i < n:
        # A role is free text ("Sales/Marketing Lead" in CrewAI): the ASGI path arrives decoded,
        # so a quoted "/" in it is a separator again; everything between /roles/ and /v1/ is the role.
        role = "/".join(parts[i + 1 :])
        if parts[i] != "roles" or not role:
            return None
    return kind, parts[2], attempt, key, role


def call_context(
    headers: Iterable[tuple[bytes, bytes]],
    rollout: str | None,
    attempt: str | None,
    role: str | None,
    key: str | None = None,
) -> CallContext:
    """The call's context: path segments first, ``X-Lightning-*`` headers for what the path lacks."""
    if rollout is None or attempt is None or role is None or key is None:
        found: dict[bytes, str] = {}
        for name, value in headers:
            if name.startswith(b"x-lightning-") and name not in found:  # the first of each
                found[name] = value.decode("latin-1")
        rollout = rollout or found.get(b"x-lightning-rollout") or None
        attempt = attempt or found.get(b"x-lightning-attempt") or None
        role = role or found.get(b"x-lightning-role") or None
        key = key or found.get(b"x-lightning-key") or None
    return CallContext(rollout, attempt, role, key)


def body_too_large(size: int | None, limit: int, why: str | None = None) -> GatewayHTTPError:
    """The 413 for a body above ``limit`` bytes (``size``: its length when known; ``why``: what set
    the limit, when not the operator's setting)."""
    what = f"{size} bytes" if size is not None else f"more than {limit} bytes"
    why = why or "the operator sets the limit: GatewayConfig.max_body_bytes, lightning-rl gateway serve --max-body-mb"
    return GatewayHTTPError(
        413,
        f"the request body is {what}, above this gateway's limit of {limit} bytes; send a shorter prompt ({why}).",
        code="request_too_large",
    )
