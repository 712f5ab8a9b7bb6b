"""OpenAI-style errors, call ids and the gateway's JSON (the request checks are in ``validation``)."""

from __future__ import annotations

import random
from typing import Any

import orjson
from pydantic_core import from_json, to_json
from starlette.responses import Response

__all__ = ["GatewayHTTPError", "error_response", "new_call_id", "dumps", "dumpb", "loads"]


class GatewayHTTPError(Exception):
    """An error answered to the client as OpenAI-style JSON with ``status``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",  # noqa: A002 - the OpenAI field name
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def response(self) -> Response:
        return error_response(self.status, self.message, type=self.type, param=self.param, code=self.code)


def error_response(
    status: int,
    message: str,
    *,
    type: str = "invalid_request_error",  # noqa: A002 - the OpenAI field name
    param: str | None = None,
    code: str | None = None,
) -> Response:
    """An error in the OpenAI format: ``{"error": {"message", "type", "param", "code"}}``."""
    body = {"error": {"message": message, "type": type, "param": param, "code": code}}
    return Response(dumps(body), status_code=status, media_type="application/json")


def new_call_id(prefix: str) -> str:
    """A unique id such as ``chatcmpl-<32 hex>``; its hex part doubles as the span's trace id. 128 bits
    from ``random`` (seeded from the OS at start-up and in every forked child), as OpenTelemetry's
    SDK makes trace ids: unique without a system call per id, and nothing secret depends on one."""
    return f"{prefix}{random.getrandbits(128):032x}"


def dumpb(obj: Any) -> bytes:
    """Compact UTF-8 JSON, as ``json.dumps(obj, separators=(",", ":"), ensure_ascii=False)`` writes it.

    ``orjson``: ~4x faster than pydantic-core (~10x than ``json``) on the token-id lists and logprobs
    forwarded on every call, most of the gateway's work with real prompts. Floats keep their
    shortest round-trip form (exact logprobs); NaN and infinities become ``null``. What orjson does
    not write (integers beyond 64 bits, non-string keys, sets, models) goes through pydantic-core.
    """
    try:
        return orjson.dumps(obj)
    except TypeError:
        return to_json(obj, inf_nan_mode="null")


def dumps(obj: Any) -> str:
    """``dumpb`` as text (SSE lines, span attributes)."""
    return dumpb(obj).decode()


def loads(data: bytes | str) -> Any:
    """Parse JSON like ``json.loads`` (``ValueError`` when invalid): ``orjson``, else pydantic-core's
    more lenient parser (``NaN``/``Infinity``; integers beyond 64 bits come back as floats)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return from_json(data)
