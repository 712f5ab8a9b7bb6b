"""A scripted test double of a vLLM OpenAI-compatible server, for testing what sits above it.

The gateway's upstream mode, plugins and examples need an upstream that answers like vLLM — with
``prompt_token_ids`` at the top level, ``token_ids`` per choice, and logprobs — without a GPU or a
download. ``FakeUpstream`` answers ``/v1/chat/completions`` and ``/v1/completions`` (streaming and
not) from a script of replies (text or tool calls) and keeps every request it received, so a test
can check what was forwarded. Its "tokenizer" is UTF-8 bytes (one token per byte, id = byte value),
which makes exactness checks trivial: ``bytes(token_ids).decode() == text``.

``fast_upstream_app()`` is a minimal raw-ASGI variant that answers every chat call with one fixed,
pre-serialised body: the benchmark uses it to measure the gateway's own overhead.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

__all__ = ["FakeReply", "FakeToolCall", "FakeUpstream", "fast_upstream_app", "fake_token_ids"]


@dataclass
class FakeToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict[str, Any])


@dataclass
class FakeReply:
    """One scripted answer: text, tool calls, or both; or a failure of the server (chat only)."""

    text: str = ""
    tool_calls: list[FakeToolCall] = field(default_factory=list[FakeToolCall])
    finish_reason: str | None = None
    status: int = 200
    """Above 399: answer with this status and an OpenAI-shaped error whose message is ``text``."""
    delay_s: float = 0.0
    """Wait this long before answering (a slow or hung server)."""
    cut_after: int | None = None
    """Streamed: drop the connection after this many chunks (a server that dies mid-answer)."""


def fake_token_ids(text: str) -> list[int]:
    """The fake's tokenizer: one token per UTF-8 byte."""
    return list(text.encode())


def _logprob_entries(ids: Sequence[int]) -> list[dict[str, Any]]:
    return [
        {"token": bytes([t]).decode(errors="replace"), "logprob": -0.5, "bytes": [t], "top_logprobs": []} for t in ids
    ]


class FakeUpstream:
    """A fake vLLM server (a test double). ``app`` is its ASGI app.

    Args:
        script: Replies given in order (plain strings are text replies); when it runs out,
            ``default`` answers.
        model: The model name it serves.
        return_token_ids: Answer ``return_token_ids`` like vLLM; ``False`` mimics an upstream that
            returns text only (the gateway must then mark tokens inexact).
        chunk_bytes: Bytes (tokens) per streamed chunk.
        responder: Decides each reply from the request body instead of the script (what
            concurrent tests need: a reply that depends on the conversation, not on arrival order).
    """

    def __init__(
        self,
        script: Sequence[FakeReply | str] = (),
        *,
        model: str = "fake-model",
        return_token_ids: bool = True,
        default: str = "ok",
        chunk_bytes: int = 4,
        responder: Callable[[dict[str, Any]], FakeReply | str] | None = None,
    ) -> None:
        self.script: list[FakeReply] = [FakeReply(r) if isinstance(r, str) else r for r in script]
        self.model = model
        self.return_token_ids = return_token_ids
        self.default = default
        self.chunk_bytes = chunk_bytes
        self.responder = responder
        self.requests: list[dict[str, Any]] = []
        self.app = Starlette(
            routes=[
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/completions", self._completions, methods=["POST"]),
            ]
        )

    def _next(self, body: dict[str, Any]) -> FakeReply:
        if self.responder is not None:
            reply = self.responder(body)
            return FakeReply(reply) if isinstance(reply, str) else reply
        return self.script.pop(0) if self.script else FakeReply(self.default)

    def _ids(self, body: dict[str, Any]) -> bool:
        return self.return_token_ids and bool(body.get("return_token_ids"))

    async def _models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "fake"}]})

    async def _chat(self, request: Request) -> Response:
        body: dict[str, Any] = await request.json()
        self.requests.append(body)
        if body.get("model") != self.model:
            error = {"message": f"model {body.get('model')!r} not found", "type": "NotFoundError", "code": 404}
            return JSONResponse({"error": error}, status_code=404)
        prompt_ids = fake_token_ids(json.dumps(body["messages"], sort_keys=True))
        n = int(body.get("n") or 1)
        replies = [self._next(body) for _ in range(n)]
        ids = self._ids(body)
        if replies[0].delay_s:
            await asyncio.sleep(replies[0].delay_s)
        if replies[0].status >= 400:
            error = {"message": replies[0].text, "type": "upstream_fake_error", "param": None, "code": None}
            return JSONResponse({"error": error}, status_code=replies[0].status)
        if body.get("stream"):
            return StreamingResponse(self._chat_stream(body, prompt_ids, replies, ids), media_type="text/event-stream")
        choices: list[dict[str, Any]] = []
        for i, r in enumerate(replies):
            calls = [
                {
                    "id": f"call_{os.urandom(6).hex()}",
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                }
                for c in r.tool_calls
            ]
            out_ids = fake_token_ids(r.text + "".join(json.dumps(c.arguments) for c in r.tool_calls))
            choice: dict[str, Any] = {
                "index": i,
                "message": {"role": "assistant", "content": r.text or None, "tool_calls": calls},
                "logprobs": {"content": _logprob_entries(out_ids)} if body.get("logprobs") else None,
                "finish_reason": r.finish_reason or ("tool_calls" if calls else "stop"),
            }
            if ids:
                choice["token_ids"] = out_ids
            choices.append(choice)
        completion = sum(len(fake_token_ids(r.text)) for r in replies)
        data: dict[str, Any] = {
            "id": f"chatcmpl-{os.urandom(8).hex()}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": choices,
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": completion,
                "total_tokens": len(prompt_ids) + completion,
            },
        }
        if ids:
            data["prompt_token_ids"] = prompt_ids
        return JSONResponse(data)

    async def _chat_stream(
        self, body: dict[str, Any], prompt_ids: list[int], replies: list[FakeReply], ids: bool
    ) -> AsyncGenerator[str]:
        cid = f"chatcmpl-{os.urandom(8).hex()}"
        base = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()), "model": self.model}
        first: dict[str, Any] = dict(base, choices=[])
        if ids:
            first["prompt_token_ids"] = prompt_ids
        yield f"data: {json.dumps(first)}\n\n"
        total = 0
        cut = replies[0].cut_after
        for i, r in enumerate(replies):
            data = r.text.encode()
            step = self.chunk_bytes
            for start in range(0, len(data), step):
                part = list(data[start : start + step])
                choice: dict[str, Any] = {
                    "index": i,
                    "delta": {"content": bytes(part).decode(errors="replace")},
                    "logprobs": {"content": _logprob_entries(part)} if body.get("logprobs") else None,
                    "finish_reason": None,
                }
                if ids:
                    choice["token_ids"] = part
                total += len(part)
                yield f"data: {json.dumps(dict(base, choices=[choice]))}\n\n"
                if cut is not None and start // step + 1 >= cut:
                    raise ConnectionResetError("the fake upstream drops the stream (FakeReply.cut_after)")
            for k, c in enumerate(r.tool_calls):
                args = json.dumps(c.arguments)
                part = fake_token_ids(args)
                delta = {
                    "tool_calls": [
                        {
                            "index": k,
                            "id": f"call_{os.urandom(6).hex()}",
                            "type": "function",
                            "function": {"name": c.name, "arguments": args},
                        }
                    ]
                }
                choice = {"index": i, "delta": delta, "logprobs": None, "finish_reason": None}
                if ids:
                    choice["token_ids"] = part
                yield f"data: {json.dumps(dict(base, choices=[choice]))}\n\n"
            reason = r.finish_reason or ("tool_calls" if r.tool_calls else "stop")
            end: dict[str, Any] = {"index": i, "delta": {}, "logprobs": None, "finish_reason": reason}
            if ids:
                end["token_ids"] = []
            yield f"data: {json.dumps(dict(base, choices=[end]))}\n\n"
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": total,
                "total_tokens": len(prompt_ids) + total,
            }
            yield f"data: {json.dumps(dict(base, choices=[], usage=usage))}\n\n"
        yield "data: [DONE]\n\n"

    async def _completions(self, request: Request) -> Response:
        body: dict[str, Any] = await request.json()
        self.requests.append(body)
        prompt = body.get("prompt")
        prompt_ids = list(prompt) if isinstance(prompt, list) else fake_token_ids(str(prompt))
        n = int(body.get("n") or 1)
        replies = [self._next(body) for _ in range(n)]
        ids = self._ids(body)
        choices: list[dict[str, Any]] = []
        for i, r in enumerate(replies):
            out = fake_token_ids(r.text)
            lp = None
            if body.get("logprobs") is not None:
                lp = {
                    "tokens": [bytes([t]).decode(errors="replace") for t in out],
                    "token_logprobs": [-0.5] * len(out),
                    "top_logprobs": [{} for _ in out],
                    "text_offset": list(range(len(out))),
                }
            choice: dict[str, Any] = {"index": i, "text": r.text, "logprobs": lp, "finish_reason": "stop"}
            if ids:
                choice["token_ids"] = out
                choice["prompt_token_ids"] = prompt_ids
            choices.append(choice)
        completion = sum(len(r.text.encode()) for r in replies)
        return JSONResponse(
            {
                "id": f"cmpl-{os.urandom(8).hex()}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": self.model,
                "choices": choices,
                "usage": {
                    "prompt_tokens": len(prompt_ids),
                    "completion_tokens": completion,
                    "total_tokens": len(prompt_ids) + completion,
                },
            }
        )


def fast_upstream_app(model: str = "fake-model", text: str = "ok, done.") -> Any:
    """A minimal raw-ASGI fake vLLM server for benchmarks: one fixed answer, nothing parsed.

    ``POST /v1/chat/completions`` returns a pre-serialised body with ``prompt_token_ids``,
    ``token_ids`` and logprobs; ``GET /v1/models`` lists ``model``. Anything else is a 404.
    """
    ids = fake_token_ids(text)
    chat = json.dumps(
        {
            "id": "chatcmpl-fast",
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": {"content": _logprob_entries(ids)},
                    "finish_reason": "stop",
                    "token_ids": ids,
                }
            ],
            "usage": {"prompt_tokens": 8, "completion_tokens": len(ids), "total_tokens": 8 + len(ids)},
            "prompt_token_ids": [1, 2, 3, 4, 5, 6, 7, 8],
        }
    ).encode()
    models = json.dumps({"object": "list", "data": [{"id": model, "object": "model"}]}).encode()
    headers = [(b"content-type", b"application/json")]

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        more = True
        while more:  # drain the request body
            message = await receive()
            more = bool(message.get("more_body"))
        path = scope["path"]
        body, status = (chat, 200) if path.endswith("/chat/completions") else (models, 200)
        if not path.endswith(("/chat/completions", "/models")):
            body, status = b'{"error": {"message": "not found"}}', 404
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [*headers, (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})

    return app
