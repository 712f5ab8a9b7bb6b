"""Serve any ``LightningStore`` over HTTP, so runners on many machines share one store.

The routes are the store protocol's, one per method (``client.ROUTES``, the table ``StoreClient``'s
methods are made from), and standard OTLP/HTTP at ``POST /v1/traces`` (see ``otlp``). A few rules
keep the server honest under bad input and fast under load:

* Every client mistake is a 4xx with ``{"error": {"type", "message"}}``: bodies that do not parse
  or validate are 400 naming the field (never FastAPI's 422), bodies over ``max_body_bytes`` are
  413, unknown ids 404, illegal status changes 409 - the client never retries those. A 500 means a
  bug in the server.
* With a token, every route (``/health`` included) wants ``Authorization: Bearer <token>``; a
  missing or wrong one is 401.
* The store routes are a pure ASGI layer: a dict lookup on the path, the raw body parsed by
  pydantic's ``model_validate_json``, the answer written by ``model_dump_json``. No dependency
  injection, no request objects, no intermediate dicts, so a store server on one core completes
  hundreds of rollouts a second (see benchmarks/).
* While serving, a background task calls ``store.expire()`` every ``expire_interval_s`` so an
  attempt whose worker died times out even when nobody queries the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, Callable
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from lightning_rl._serving import BearerAuth, read_body, send_json, serving, stop_on_signals, uvicorn_config
from lightning_rl.errors import LightningError, http_status
from lightning_rl.spans import otlp
from lightning_rl.store.base import LightningStore
from lightning_rl.store.client import ROUTES, Route

__all__ = [
    "create_store_app",
    "running_store_server",
    "serve_store",
    "DEFAULT_MAX_BODY_BYTES",
    "error_body",
    "error_response",
    "store_openapi",
]

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
"""Largest accepted request body; bigger ones get 413 (send spans in smaller batches)."""

_JSON = "application/json"

_Params = dict[str, str]


class _TooLarge(Exception):
    pass


def error_body(kind: str, message: str) -> bytes:
    """The JSON error body every route answers with: ``{"error": {"type", "message"}}``."""
    return json.dumps({"error": {"type": kind, "message": message}}, separators=(",", ":")).encode()


def error_response(status: int, kind: str, message: str) -> Response:
    """``error_body`` as a Starlette response."""
    return Response(error_body(kind, message), status_code=status, media_type=_JSON)


def _describe(exc: ValidationError) -> str:
    """``field.path: what is wrong`` for the first few errors, so the caller can fix the body."""
    parts: list[str] = []
    for err in exc.errors(include_url=False)[:5]:
        if err["type"] == "json_invalid":
            return f"request body is not valid JSON: {err['msg']}"
        loc = ".".join(str(p) for p in err["loc"]) or "body"
        parts.append(f"{loc}: {err['msg']}")
    more = exc.error_count() - len(parts)
    return "invalid request body: " + "; ".join(parts) + (f" (and {more} more errors)" if more > 0 else "")


async def _read_body(scope: Scope, receive: Receive, limit: int, field: str) -> bytes:
    """The whole request body; ``_TooLarge`` past ``limit`` bytes (by ``Content-Length`` before reading)."""

    def too_large() -> _TooLarge:  # made only when it happens
        return _TooLarge(f"request body is over the {limit}-byte limit; send `{field}` in smaller batches.")

    raw = await read_body(receive, limit, too_large, scope["headers"])
    if raw is None:
        raise ConnectionResetError("client disconnected while sending the body")
    return raw


def _refusal(sent: bool) -> bytes:
    """The 401's body: what to do about a wrong or a missing token."""
    if sent:
        return error_body("UnauthorizedError", "wrong bearer token; pass the server's --token to the client.")
    message = "missing bearer token: this store requires `Authorization: Bearer <token>` (StoreClient(url, token=...))."
    return error_body("UnauthorizedError", message)


class _Health:
    """``GET /health``, served beside the protocol's routes (not a store method)."""

    method, path, name, body, field, long_poll = "GET", "/health", "health", None, "body", False

    async def answer(self, _store: LightningStore, _body: BaseModel | None, _params: _Params) -> bytes:
        return b'{"status":"ok"}'


_Served = Route[Any, Any] | _Health
_SERVED: tuple[_Served, ...] = (*ROUTES, _Health())
"""Every route of the server (``{id}`` is a rollout id, attempt id or resources version)."""


class _StoreRoutes:
    """Pure ASGI middleware answering the store protocol's routes; everything else goes to FastAPI.

    Dispatch is a dict lookup on the path (ids are the only variable segments), which keeps the
    per-request cost well below Starlette's routing and request objects on the hot paths
    (claim, add spans, finish).
    """

    def __init__(
        self, app: ASGIApp, store: LightningStore, max_body_bytes: int, stopping: asyncio.Event | None = None
    ) -> None:
        self.app = app
        self.store = store
        self.max_body_bytes = max_body_bytes
        self.stopping = stopping or asyncio.Event()
        self.static: dict[str, list[_Served]] = {}
        self.by_id: dict[tuple[str, str], list[_Served]] = {}  # ("attempts", "finish") -> routes
        for route in _SERVED:
            parts = route.path.split("/")[1:]
            if len(parts) >= 2 and parts[1].startswith("{"):
                self.by_id.setdefault((parts[0], parts[2] if len(parts) > 2 else ""), []).append(route)
            else:
                self.static.setdefault(route.path, []).append(route)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        method: str = scope["method"]
        params: _Params = {}
        routes = self.static.get(path)
        if routes is None or all(r.method != method for r in routes):
            # ``/rollouts/{id}`` also matches a rollout whose id happens to be, say, "query".
            parts = path.split("/")
            if 3 <= len(parts) <= 4 and parts[2]:
                by_id = self.by_id.get((parts[1], parts[3] if len(parts) == 4 else ""))
                if by_id is not None and (routes is None or any(r.method == method for r in by_id)):
                    routes, params = by_id, {"id": parts[2]}
        if routes is None:
            await self.app(scope, receive, send)
            return
        for route in routes:
            if route.method == method:
                status, body = await self._run(route, params, scope, receive)
                await send_json(send, status, body)
                return
        allowed = ", ".join(r.method for r in routes)
        await send_json(send, 405, error_body("InvalidRequestError", f"{method} {path}: use {allowed}."))

    async def _run(self, route: _Served, params: _Params, scope: Scope, receive: Receive) -> tuple[int, bytes]:
        try:
            body: BaseModel | None = None
            if route.body is not None:
                raw = await _read_body(scope, receive, self.max_body_bytes, route.field)
                body = route.body.model_validate_json(raw)
            if route.long_poll:
                result = await self._long_poll(route, body, params)
            else:
                result = await route.answer(self.store, body, params)
        except ValidationError as exc:
            return 400, error_body("InvalidRequestError", _describe(exc))
        except _TooLarge as exc:
            return 413, error_body("InvalidRequestError", str(exc))
        except LightningError as exc:
            return http_status(exc), error_body(type(exc).__name__, str(exc))
        except ConnectionResetError as exc:  # the client went away mid-body; nobody reads the answer
            return 400, error_body("InvalidRequestError", str(exc))
        except Exception:
            logger.exception("store server: %s %s failed", scope["method"], scope["path"])
            return 500, error_body("InternalError", f"{scope['method']} {scope['path']} failed; see the server log.")
        return 200, result

    async def _long_poll(self, route: _Served, body: BaseModel | None, params: _Params) -> bytes:
        """The route's answer; but if the server starts stopping meanwhile, the answer of the same
        request with ``timeout_s=0`` (what is true right now) rather than a request cut off by the
        shutdown."""
        assert body is not None
        now = body.model_copy(update={"timeout_s": 0.0})
        if self.stopping.is_set():
            return await route.answer(self.store, now, params)
        call = asyncio.ensure_future(route.answer(self.store, body, params))
        stop = asyncio.ensure_future(self.stopping.wait())
        try:
            await asyncio.wait({call, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if not call.done():
                call.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await call
        if call.done() and not call.cancelled():
            return call.result()
        return await route.answer(self.store, now, params)


def store_openapi() -> dict[str, Any]:
    """The OpenAPI 3.1 document of the store routes, built from their table and the body models the
    server parses with (``lightning_rl._openapi``): what schema-driven fuzzers and client generators
    read. OTLP ingest (``POST /v1/traces``) is OpenTelemetry's protocol and is not described here."""
    from lightning_rl import _openapi

    routes = [(r.path, r.method, r.body, r.name) for r in _SERVED]
    return _openapi.build_openapi("Lightning store", "1", routes, errors=(400, 401, 404, 405, 409, 413))


def create_store_app(
    store: LightningStore,
    token: str | None = None,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    expire_interval_s: float = 1.0,
    openapi_url: str | None = None,
) -> FastAPI:
    """A FastAPI app serving ``store`` (see the module docstring for the rules it follows).

    The store routes are answered by a pure ASGI layer in front of FastAPI (see ``_StoreRoutes``);
    FastAPI runs the lifespan (the periodic ``expire()``), OTLP ingest and the JSON 404/405 answers.

    Args:
        store: Any backend; the app does not close it.
        token: If set, every request must carry ``Authorization: Bearer <token>``.
        max_body_bytes: Larger request bodies are refused with 413.
        expire_interval_s: How often the app's lifespan task calls ``store.expire()``; 0 disables it.
        openapi_url: Serve ``store_openapi()`` at this path (e.g. ``/openapi.json``, for a fuzzer or a
            client generator); None, the default, serves no schema.
    """

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncGenerator[None]:
        task = asyncio.create_task(_expire_forever(store, expire_interval_s)) if expire_interval_s > 0 else None
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    app = FastAPI(title="Lightning store", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    stopping = asyncio.Event()
    app.state.stopping = stopping  # set it to end long polls in flight with an answer (see _StoreRoutes._long_poll)

    async def otlp_traces(request: Request) -> Response:
        try:
            raw = await _read_body(request.scope, request.receive, max_body_bytes, "resourceSpans")
            content, media_type = await otlp.ingest(
                store,
                raw,
                content_type=request.headers.get("content-type", ""),
                content_encoding=request.headers.get("content-encoding", ""),
                max_bytes=max_body_bytes,
            )
        except _TooLarge as exc:
            return error_response(413, "InvalidRequestError", str(exc))
        except otlp.UnsupportedMediaType as exc:
            return error_response(415, "InvalidRequestError", str(exc))
        except LightningError as exc:
            return error_response(http_status(exc), type(exc).__name__, str(exc))
        return Response(content, media_type=media_type)

    app.router.add_route("/v1/traces", otlp_traces, methods=["POST"], include_in_schema=False)
    if openapi_url is not None:
        document = store_openapi()

        async def openapi(_request: Request) -> Response:
            return JSONResponse(document)

        app.router.add_route(openapi_url, openapi, methods=["GET"], include_in_schema=False)

    async def http_error(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        kind = "NotFoundError" if exc.status_code == 404 else "InvalidRequestError"
        return error_response(exc.status_code, kind, f"{exc.detail}: see StoreClient for the routes this server has.")

    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_middleware(_StoreRoutes, store=store, max_body_bytes=max_body_bytes, stopping=stopping)
    if token:
        app.add_middleware(BearerAuth, token=token, refusal=_refusal)  # added last = outermost: guards every route
    return app


async def _expire_forever(store: LightningStore, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            await store.expire()
        except Exception:  # keep serving; the next claim or query expires too
            logger.exception("store server: periodic expire() failed")


@contextlib.asynccontextmanager
async def running_store_server(
    store: LightningStore,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    expire_interval_s: float = 1.0,
) -> AsyncGenerator[str]:
    """Serve ``store`` with uvicorn in the current event loop; yield its base URL.

    ``port=0`` picks a free port. On exit the server stops: long polls answer at once, other requests
    in flight finish first; the store is left open for the caller to close. Signal handlers are left alone.
    """
    app = create_store_app(store, token, max_body_bytes=max_body_bytes, expire_interval_s=expire_interval_s)
    stopping: asyncio.Event = app.state.stopping
    config = uvicorn_config(app, host, port, timeout_graceful_shutdown=5)
    async with serving(config, host, f"store server could not start on {host}:{port}; see the log above.") as started:
        try:
            yield started[0]
        finally:
            stopping.set()  # long polls in flight answer now rather than hold the shutdown up


async def serve_store(
    store: LightningStore,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve ``store`` until SIGINT or SIGTERM, then stop gracefully (``lightning-rl store serve``)."""
    stop = asyncio.Event()
    stop_on_signals(stop.set)
    async with running_store_server(store, host=host, port=port, token=token) as url:
        if on_ready is not None:
            on_ready(url)
        await stop.wait()
