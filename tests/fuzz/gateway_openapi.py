"""An OpenAPI 3.1 document of the gateway's OpenAI-compatible routes, written for the fuzzer.

The gateway is a FastAPI app, but its model-call routes are answered before FastAPI (a raw ASGI fast
path, ``lightning_rl.gateway._asgi``) and validated by hand-written code (``gateway.validation``),
so there is no generated schema to read. This document describes the fields that validation reads,
with the gateway's own limits (``GatewayConfig(max_n=4, max_tokens_limit=64)`` in the tests) and
small token budgets so each valid call decodes a few tokens of the tiny model. Schemathesis draws
valid requests from it and, in negative mode, requests that break it (wrong types, missing fields,
out-of-range numbers): the gateway must answer all of them without a 5xx.
"""

from __future__ import annotations

from typing import Any

__all__ = ["gateway_openapi"]

_TEXT = {"type": "string", "maxLength": 40}
_ROLE = {"type": "string", "enum": ["system", "developer", "user", "assistant", "tool"]}
_TOOL = {
    "type": "object",
    "required": ["type", "function"],
    "properties": {
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,16}$"},
                "description": _TEXT,
                "parameters": {"type": "object", "properties": {"type": {"const": "object"}}},
            },
        },
    },
}
_SAMPLING: dict[str, Any] = {
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "seed": {"type": "integer", "minimum": 0, "maximum": 2**31},
    "stream": {"type": "boolean"},
    "stop": {"oneOf": [_TEXT, {"type": "array", "items": _TEXT, "maxItems": 4}]},
    "model": _TEXT,
}
_CHAT = {
    "type": "object",
    "required": ["messages"],
    "properties": {
        "messages": {
            "type": "array",
            "minItems": 1,
            "maxItems": 3,
            "items": {
                "type": "object",
                "required": ["role", "content"],
                "properties": {"role": _ROLE, "content": _TEXT, "name": _TEXT},
            },
        },
        "max_tokens": {"type": "integer", "minimum": 1, "maximum": 4},
        "n": {"type": "integer", "minimum": 1, "maximum": 2},
        "logprobs": {"type": "boolean"},
        "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 5},
        "tools": {"type": "array", "items": _TOOL, "maxItems": 2},
        "tool_choice": {"type": "string", "enum": ["auto", "none"]},
        **_SAMPLING,
    },
}
_COMPLETION = {
    "type": "object",
    "required": ["prompt"],
    "properties": {
        "prompt": {
            "oneOf": [
                _TEXT,
                {
                    "type": "array",
                    "items": {"type": "integer", "minimum": 0, "maximum": 400},
                    "minItems": 1,
                    "maxItems": 8,
                },
            ]
        },
        "max_tokens": {"type": "integer", "minimum": 1, "maximum": 4},
        "n": {"type": "integer", "minimum": 1, "maximum": 2},
        "echo": {"type": "boolean"},
        "logprobs": {"type": "integer", "minimum": 0, "maximum": 5},
        **_SAMPLING,
    },
}
_RESPONSES = {
    "type": "object",
    "required": ["input"],
    "properties": {
        "input": {
            "oneOf": [
                _TEXT,
                {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 3,
                    "items": {
                        "type": "object",
                        "required": ["role", "content"],
                        "properties": {"type": {"const": "message"}, "role": _ROLE, "content": _TEXT},
                    },
                },
            ]
        },
        "instructions": _TEXT,
        "max_output_tokens": {"type": "integer", "minimum": 1, "maximum": 4},
        "tools": {
            "type": "array",
            "maxItems": 2,
            "items": {
                "type": "object",
                "required": ["type", "name"],
                "properties": {"type": {"const": "function"}, "name": {"type": "string", "pattern": "^[a-z_]{1,16}$"}},
            },
        },
        **{k: v for k, v in _SAMPLING.items() if k != "stop"},
    },
}


def _post(schema: dict[str, Any], summary: str, path_params: tuple[str, ...] = ()) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "summary": summary,
        "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
        "responses": {
            "200": {"description": "the completion (JSON, or text/event-stream when stream is true)"},
            "400": {"description": "invalid request (OpenAI's error shape)"},
            "401": {"description": "the attempt's key is wrong"},
            "404": {"description": "unknown route"},
            "409": {"description": "the attempt is not running"},
            "413": {"description": "body over the limit"},
        },
    }
    if path_params:
        operation["parameters"] = [
            {"name": n, "in": "path", "required": True, "schema": {"type": "string", "pattern": "^[a-z0-9-]{1,12}$"}}
            for n in path_params
        ]
    return {"post": operation}


def gateway_openapi() -> dict[str, Any]:
    """The document: chat, completions and responses at ``/v1`` and at a rollout's base URL."""
    rollout = "/rollouts/{rollout}/attempts/{attempt}/key/{key}/v1"
    ids = ("rollout", "attempt", "key")
    return {
        "openapi": "3.1.0",
        "info": {"title": "Lightning gateway (OpenAI-compatible)", "version": "1"},
        "paths": {
            "/v1/chat/completions": _post(_CHAT, "chat completion"),
            "/v1/completions": _post(_COMPLETION, "text completion"),
            "/v1/responses": _post(_RESPONSES, "responses API"),
            f"{rollout}/chat/completions": _post(_CHAT, "chat completion in a rollout", ids),
            "/v1/models": {"get": {"summary": "models", "responses": {"200": {"description": "model list"}}}},
        },
    }
