"""Serve any ``LightningStore`` over HTTP, so runners on many machines share one store.

The routes mirror the store protocol one to one (``StoreClient`` is the matching client) and also
accept standard OTLP/HTTP at ``POST /v1/traces`` (see ``otlp``). A few rules keep the server honest
under bad input and fast under load:

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
import logging
import signal
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator
from functools import partial
from typing import Any

import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from lightning_rl._serving import http_protocol, read_body, send_json, wait_until_serving
from lightning_rl.credentials import bearer_matches
from lightning_rl.errors import InvalidRequestError, LightningError, http_status
from lightning_rl.store import otlp
from lightning_rl.store.base import LightningStore
from lightning_rl.store.client import (
    AttemptList,
    ClaimBody,
    ClaimList,
    Count,
    EnqueueBody,
    ExpireBody,
    FinishBody,
    IdsBody,
    PruneBody,
    QueryRolloutsBody,
    QuerySpansBody,
    ResourcesBody,
    RolloutList,
    SpanList,
    SpansBody,
    WaitBody,
)

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
_Handler = Callable[[LightningStore, Any, _Params], Awaitable[BaseModel | bytes]]


class _TooLarge(Exception):
    pass


class _ErrorDetail(BaseModel):
    type: str
    message: str


class _ErrorPayload(BaseModel):
    error: _ErrorDetail


def error_body(kind: str, message: str) -> bytes:
    """The JSON error body every route answers with: ``{"error": {"type", "message"}}``."""
    payload = _ErrorPayload.model_construct(error=_ErrorDetail.model_construct(type=kind, message=message))
    return payload.model_dump_json().encode()


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


def _too_large(limit: int, field: str) -> _TooLarge:
    return _TooLarge(f"request body is over the {limit}-byte limit; send `{field}` in smaller batches.")


async def _read_body(scope: Scope, receive: Receive, limit: int, field: str) -> bytes:
    """The whole request body; ``_TooLarge`` past ``limit`` bytes (by ``Content-Length`` before reading)."""
    raw = await read_body(receive, limit, partial(_too_large, limit, field), scope["headers"])
    if raw is None:
        raise ConnectionResetError("client disconnected while sending the body")
    return raw


class _BearerAuth:
    """Pure ASGI middleware: 401 unless ``Authorization: Bearer <token>`` matches (the scheme in any
    case, the token in constant time)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = b""
            for key, value in scope["headers"]:
                if key == b"authorization":
                    given = value
                    break
            if not bearer_matches(given, self._token):
                message = (
                    "wrong bearer token; pass the server's --token to the client."
                    if given
                    else "missing bearer token: this store requires `Authorization: Bearer <token>` "
                    "(StoreClient(url, token=...))."
                )
                await send_json(send, 401, error_body("UnauthorizedError", message), [(b"www-authenticate", b"Bearer")])
                return
        await self.app(scope, receive, send)


class _Route:
    """One protocol method: how to parse its body and which store call answers it.

    ``on_stop`` answers a long poll that is still waiting when the server stops: the request ends
    with a normal answer (what is true right now) instead of being cut off by the shutdown.
    """

    __slots__ = ("method", "body_model", "field", "fn", "on_stop")

    def __init__(
        self,
        method: str,
        body_model: type[BaseModel] | None,
        field: str,
        fn: _Handler,
        on_stop: _Handler | None = None,
    ) -> None:
        self.method = method
        self.body_model = body_model
        self.field = field
        self.fn = fn
        self.on_stop = on_stop


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
        self.static: dict[str, list[_Route]] = {}
        self.by_id: dict[tuple[str, str], list[_Route]] = {}  # ("attempts", "finish") -> routes
        for path, route in _ROUTES:
            parts = path.split("/")[1:]
            if len(parts) >= 2 and parts[1].startswith("{"):
                self.by_id.setdefault((parts[0], parts[2] if len(parts) > 2 else ""), []).append(route)
            else:
                self.static.setdefault(path, []).append(route)

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

    async def _run(self, route: _Route, params: _Params, scope: Scope, receive: Receive) -> tuple[int, bytes]:
        try:
            body: Any = None
            if route.body_model is not None:
                raw = await _read_body(scope, receive, self.max_body_bytes, route.field)
                body = route.body_model.model_validate_json(raw)
            if route.on_stop is None:
                result = await route.fn(self.store, body, params)
            else:
                result = await self._long_poll(route, body, params)
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
        return 200, result if isinstance(result, bytes) else result.model_dump_json().encode()

    async def _long_poll(self, route: _Route, body: Any, params: _Params) -> BaseModel | bytes:
        """``route.fn``, or ``route.on_stop``'s answer if the server starts stopping meanwhile."""
        assert route.on_stop is not None
        if self.stopping.is_set():
            return await route.on_stop(self.store, body, params)
        call = asyncio.ensure_future(route.fn(self.store, body, params))
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
        return await route.on_stop(self.store, body, params)


# --- the routes: one per protocol method ------------------------------------------------------


async def _enqueue(s: LightningStore, b: EnqueueBody, _: _Params) -> BaseModel:
    return RolloutList.model_construct(rollouts=await s.enqueue(b.requests))


async def _claim(s: LightningStore, b: ClaimBody, _: _Params) -> BaseModel:
    return ClaimList.model_construct(claims=await s.claim(b.worker_id, b.n, timeout_s=b.timeout_s))


async def _heartbeat(s: LightningStore, _b: None, p: _Params) -> BaseModel:
    return await s.heartbeat(p["id"])


async def _finish(s: LightningStore, b: FinishBody, p: _Params) -> BaseModel:
    return await s.finish_attempt(p["id"], b.status, error=b.error, reward=b.reward)


async def _cancel(s: LightningStore, b: IdsBody, _: _Params) -> BaseModel:
    return RolloutList.model_construct(rollouts=await s.cancel(b.ids))


async def _get_rollout(s: LightningStore, _b: None, p: _Params) -> BaseModel:
    return await s.get_rollout(p["id"])


async def _query_rollouts(s: LightningStore, b: QueryRolloutsBody, _: _Params) -> BaseModel:
    rows = await s.query_rollouts(
        ids=b.ids, status=b.status, group_id=b.group_id, mode=b.mode, limit=b.limit, offset=b.offset
    )
    return RolloutList.model_construct(rollouts=rows)


async def _wait(s: LightningStore, b: WaitBody, _: _Params) -> BaseModel:
    return RolloutList.model_construct(rollouts=await s.wait_for_rollouts(b.ids, b.timeout_s))


async def _wait_now(s: LightningStore, b: WaitBody, _: _Params) -> BaseModel:
    """The server is stopping: answer a long poll with the rollouts that have ended so far."""
    return RolloutList.model_construct(rollouts=await s.wait_for_rollouts(b.ids, 0.0))


async def _get_attempt(s: LightningStore, _b: None, p: _Params) -> BaseModel:
    return await s.get_attempt(p["id"])


async def _query_attempts(s: LightningStore, _b: None, p: _Params) -> BaseModel:
    return AttemptList.model_construct(attempts=await s.query_attempts(p["id"]))


async def _add_spans(s: LightningStore, b: SpansBody, _: _Params) -> bytes:
    return b'{"count":%d}' % await s.add_spans(b.spans)


async def _query_spans(s: LightningStore, b: QuerySpansBody, _: _Params) -> BaseModel:
    rows = await s.query_spans(
        rollout_id=b.rollout_id, attempt_id=b.attempt_id, name=b.name, limit=b.limit, offset=b.offset
    )
    return SpanList.model_construct(spans=rows)


async def _add_resources(s: LightningStore, b: ResourcesBody, _: _Params) -> BaseModel:
    return await s.add_resources(llm=b.llm, prompts=b.prompts, extra=b.extra)


async def _get_resources(s: LightningStore, _b: None, p: _Params) -> BaseModel:
    raw = p["id"]
    if raw == "latest":
        return await s.get_resources(None)
    if not raw.isdigit():
        raise InvalidRequestError(f"resources version must be a positive integer or 'latest', got {raw!r}.")
    return await s.get_resources(int(raw))


async def _expire(s: LightningStore, b: ExpireBody, _: _Params) -> BaseModel:
    return Count.model_construct(count=await s.expire(b.now))


async def _prune(s: LightningStore, b: PruneBody, _: _Params) -> BaseModel:
    return Count.model_construct(count=await s.prune(b.older_than))


async def _stats(s: LightningStore, _b: None, _p: _Params) -> BaseModel:
    return await s.stats()


async def _health(_s: LightningStore, _b: None, _p: _Params) -> bytes:
    return b'{"status":"ok"}'


_ROUTES: list[tuple[str, _Route]] = [
    ("/rollouts/enqueue", _Route("POST", EnqueueBody, "requests", _enqueue)),
    ("/rollouts/claim", _Route("POST", ClaimBody, "body", _claim)),
    ("/rollouts/cancel", _Route("POST", IdsBody, "ids", _cancel)),
    ("/rollouts/query", _Route("POST", QueryRolloutsBody, "ids", _query_rollouts)),
    ("/rollouts/wait", _Route("POST", WaitBody, "ids", _wait, on_stop=_wait_now)),
    ("/rollouts/{id}", _Route("GET", None, "", _get_rollout)),
    ("/rollouts/{id}/attempts", _Route("GET", None, "", _query_attempts)),
    ("/attempts/{id}", _Route("GET", None, "", _get_attempt)),
    ("/attempts/{id}/heartbeat", _Route("POST", None, "", _heartbeat)),
    ("/attempts/{id}/finish", _Route("POST", FinishBody, "body", _finish)),
    ("/spans", _Route("POST", SpansBody, "spans", _add_spans)),
    ("/spans/query", _Route("POST", QuerySpansBody, "body", _query_spans)),
    ("/resources", _Route("POST", ResourcesBody, "extra", _add_resources)),
    ("/resources/{id}", _Route("GET", None, "", _get_resources)),
    ("/expire", _Route("POST", ExpireBody, "body", _expire)),
    ("/prune", _Route("POST", PruneBody, "body", _prune)),
    ("/stats", _Route("GET", None, "", _stats)),
    ("/health", _Route("GET", None, "", _health)),
]
"""Every store route (``{id}`` is a rollout id, attempt id or resources version); the client's
methods name the same paths."""


def store_openapi() -> dict[str, Any]:
    """The OpenAPI 3.1 document of the store routes, built from ``_ROUTES`` and the body models the
    server parses with (``lightning_rl._openapi``): what schema-driven fuzzers and client generators
    read. OTLP ingest (``POST /v1/traces``) is OpenTelemetry's protocol and is not described here."""
    from lightning_rl import _openapi

    routes = [
        (path, r.method, r.body_model, (r.fn.__doc__ or r.fn.__name__.strip("_")).splitlines()[0])
        for path, r in _ROUTES
    ]
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
    app.state.stopping = stopping  # set it to end long polls in flight with an answer (see _Route.on_stop)

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
        app.add_middleware(_BearerAuth, token=token)  # added last = outermost: guards every route
    return app


async def _expire_forever(store: LightningStore, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            await store.expire()
        except Exception:  # keep serving; the next claim or query expires too
            logger.exception("store server: periodic expire() failed")


class _QuietServer(uvicorn.Server):
    """A uvicorn server that leaves signal handling to its host (a test, an app, or ``serve_store``)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None]:
        yield


@contextlib.asynccontextmanager
async def _started(
    store: LightningStore, host: str, port: int, token: str | None, max_body_bytes: int, expire_interval_s: float
) -> AsyncGenerator[tuple[uvicorn.Server, asyncio.Task[None], str, asyncio.Event]]:
    app = create_store_app(store, token, max_body_bytes=max_body_bytes, expire_interval_s=expire_interval_s)
    stopping: asyncio.Event = app.state.stopping
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=5,
        server_header=False,
        date_header=False,
        proxy_headers=False,
        http=http_protocol(),
    )
    server = _QuietServer(config)
    task = asyncio.create_task(server.serve())
    try:
        url = await wait_until_serving(
            server, task, host, f"store server could not start on {host}:{port}; see the log above."
        )
        yield server, task, url, stopping
    finally:
        stopping.set()  # long polls in flight answer now rather than hold the shutdown up
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await task


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

    ``port=0`` picks a free port. On exit the server stops (in-flight requests finish first); the
    store is left open for the caller to close. Signal handlers are left alone.
    """
    async with _started(store, host, port, token, max_body_bytes, expire_interval_s) as (
        _server,
        _task,
        url,
        _stopping,
    ):
        yield url


async def serve_store(
    store: LightningStore,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve ``store`` until SIGINT or SIGTERM, then stop gracefully (``lightning-rl store serve``)."""
    async with _started(store, host, port, token, DEFAULT_MAX_BODY_BYTES, 1.0) as (server, task, url, stopping):
        loop = asyncio.get_running_loop()

        def stop() -> None:
            stopping.set()
            server.should_exit = True

        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):  # not on Windows / not main thread
                loop.add_signal_handler(sig, stop)
        if on_ready is not None:
            on_ready(url)
        await asyncio.shield(task)
