"""The OpenAI request shapes the gateway accepts, and OpenAI-style errors.

Frameworks send many fields we do not use (``user``, ``metadata``, ``parallel_tool_calls``,
``store``, ``reasoning`` …); every model here ignores unknown fields instead of rejecting them, and
accepts ``null`` wherever a client may send one. Values that are out of range are rejected with a
400 whose message names the field, the way the OpenAI API answers.
"""

from __future__ import annotations

import random
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import from_json, to_json
from starlette.responses import Response

__all__ = [
    "StreamOptions",
    "ChatCompletionRequest",
    "CompletionRequest",
    "ResponsesRequest",
    "GatewayHTTPError",
    "error_response",
    "validation_message",
    "new_call_id",
    "dumps",
    "dumpb",
    "loads",
]


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Request):
    include_usage: bool | None = None


class _Sampling(_Request):
    model: str | None = None
    n: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**64)
    stream: bool | None = None
    stream_options: StreamOptions | None = None

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else [s for s in self.stop if s]


class ChatCompletionRequest(_Sampling):
    """``POST /v1/chat/completions``."""

    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)


class CompletionRequest(_Sampling):
    """``POST /v1/completions``: a text prompt, a token-id prompt, or a list of either."""

    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool | None = None


class ResponsesRequest(_Request):
    """``POST /v1/responses``: the part of the Responses API the OpenAI Agents SDK uses."""

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    max_output_tokens: int | None = Field(default=None, ge=1)
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    parallel_tool_calls: bool | None = None
    stream: bool | None = None
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**64)
    metadata: dict[str, Any] | None = None


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


def validation_message(exc: ValidationError) -> tuple[str, str | None]:
    """A one-line message for a pydantic error, and the (first) offending parameter."""
    parts: list[str] = []
    param: str | None = None
    for err in exc.errors(include_url=False)[:5]:
        loc = _param_path(err["loc"])
        param = param or (str(err["loc"][0]) if err["loc"] else None)
        parts.append(f"{loc}: {err['msg']}" if loc else err["msg"])
    return "invalid request: " + "; ".join(parts), param


def _param_path(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as OpenAI writes a parameter: ``messages[0].content``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif out:
            out += f".{part}"
        else:
            out = part
    return out


def new_call_id(prefix: str) -> str:
    """A unique id such as ``chatcmpl-<32 hex>``; its hex part doubles as the span's trace id.

    128 random bits from ``random`` (seeded from the OS at start-up and again in every forked
    child), as OpenTelemetry's SDK makes trace ids: unique without a system call per id. Nothing
    secret depends on an id.
    """
    return f"{prefix}{random.getrandbits(128):032x}"


def dumpb(obj: Any) -> bytes:
    """Compact UTF-8 JSON, as ``json.dumps(obj, separators=(",", ":"), ensure_ascii=False)`` writes it.

    ``orjson``: ~4x faster than pydantic-core (and ~10x faster than ``json``) on the token-id lists
    and logprobs the gateway forwards on every call, which with real prompts are most of its work.
    Floats keep their shortest round-trip form (exact logprobs). NaN and infinities are written as
    ``null`` (strict JSON, as pydantic writes them; no OpenAI-compatible server sends them).
    Values orjson does not write (integers beyond 64 bits, non-string keys, sets, models) go
    through pydantic-core instead.
    """
    try:
        return orjson.dumps(obj)
    except TypeError:
        return to_json(obj, inf_nan_mode="null")


def dumps(obj: Any) -> str:
    """``dumpb`` as text (SSE lines, span attributes)."""
    return dumpb(obj).decode()


def loads(data: bytes | str) -> Any:
    """Parse JSON like ``json.loads``; ``ValueError`` when invalid.

    ``orjson`` first; what it refuses is parsed again by pydantic-core's more lenient parser
    (``NaN``/``Infinity`` literals), which raises for really broken JSON. Integers beyond 64 bits
    come back as floats (no field of the API takes one: a ``seed`` that large is refused).
    """
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return from_json(data)
