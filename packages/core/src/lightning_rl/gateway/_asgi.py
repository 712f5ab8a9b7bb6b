"""The raw ASGI pieces of the gateway's hot path: route matching, call context, body in, JSON out.

Every model call an agent makes crosses the gateway, so its per-request CPU is the gateway's cost.
Through FastAPI a call walks a dozen middleware layers, regex-matches up to 16 routes and builds a
``Request``; measured under load, that was about a third of the gateway's CPU per call. The
model-call routes (``/v1/chat/completions``, ``/v1/completions``, ``/v1/responses`` and their
``/rollouts/...`` variants) are therefore matched here by splitting the path once, and answered
straight through ``send``; everything else still goes to FastAPI (the same trick as the store
server's ``_StoreRoutes``). ``_GatewayApp.call_for`` is their one entry point: served by
``lightning_rl.gateway.server`` (uvicorn with our protocol) they skip ASGI altogether
(``fast_handler`` hands them to the protocol), otherwise the app's ``__call__`` answers them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from starlette.types import Receive

from lightning_rl.gateway.protocol import GatewayHTTPError
from lightning_rl.gateway.recording import CallContext

__all__ = [
    "CallKind",
    "match_call",
    "call_context",
    "content_length",
    "body_too_large",
    "read_body",
    "CALL_PATHS",
]

CallKind = Literal["chat", "completions", "responses"]

CALL_PATHS: dict[str, CallKind] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/responses": "responses",
}
"""The model-call routes, as served without a rollout prefix."""

_TAILS: dict[str, CallKind] = {path.removeprefix("/v1/"): kind for path, kind in CALL_PATHS.items()}


def match_call(path: str) -> tuple[CallKind, str | None, str | None, str | None, str | None] | None:
    """``(kind, rollout_id, attempt_id, key, role)`` when ``path`` is a model-call route, else ``None``.

    Accepts the paths FastAPI routes for them:
    ``[/rollouts/R[/attempts/A][/key/K][/roles/ROLE]]/v1/<api>``, every segment non-empty; ROLE may
    itself contain ``/``. ``K`` is the attempt's key (``Attempt.gateway_key``).
    """
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
        h_rollout = h_attempt = h_role = h_key = None
        for name, value in headers:
            if name.startswith(b"x-lightning-"):
                if name == b"x-lightning-rollout" and h_rollout is None:
                    h_rollout = value.decode("latin-1")
                elif name == b"x-lightning-attempt" and h_attempt is None:
                    h_attempt = value.decode("latin-1")
                elif name == b"x-lightning-role" and h_role is None:
                    h_role = value.decode("latin-1")
                elif name == b"x-lightning-key" and h_key is None:
                    h_key = value.decode("latin-1")
        rollout = rollout or h_rollout or None
        attempt = attempt or h_attempt or None
        role = role or h_role or None
        key = key or h_key or None
    return CallContext(rollout, attempt, role, key)


def content_length(headers: Iterable[tuple[bytes, bytes]]) -> int | None:
    """The request's ``Content-Length`` (``None`` when absent or unreadable: the body is then
    counted as it arrives)."""
    for key, value in headers:
        if key == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


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


async def read_body(receive: Receive, limit: int | None = None, why: str | None = None) -> bytes | None:
    """The whole request body; ``None`` when the client left before sending it.

    Raises:
        GatewayHTTPError: 413 as soon as more than ``limit`` bytes arrived (the rest is not kept).
    """
    message = await receive()
    if message["type"] == "http.disconnect":
        return None
    body: bytes = message.get("body", b"")
    if limit is not None and len(body) > limit:
        raise body_too_large(None, limit, why)
    if not message.get("more_body", False):
        return body
    chunks = [body]
    size = len(body)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if limit is not None and size > limit:
            raise body_too_large(None, limit, why)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)
