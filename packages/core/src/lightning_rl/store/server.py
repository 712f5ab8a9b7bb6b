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
* Handlers are plain Starlette endpoints that parse the raw body with pydantic's
  ``model_validate_json`` and answer with ``model_dump_json``: no dependency injection, no
  intermediate dicts, no ``BaseHTTPMiddleware``, so the per-request cost stays small.
* While serving, a background task calls ``store.expire()`` every ``expire_interval_s`` so an
  attempt whose worker died times out even when nobody queries the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import signal
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator
from typing import Any

import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

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

__all__ = ["create_store_app", "running_store_server", "serve_store", "DEFAULT_MAX_BODY_BYTES", "error_response"]

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
"""Largest accepted request body; bigger ones get 413 (send spans in smaller batches)."""

_JSON = "application/json"

_Handler = Callable[[LightningStore, Any, Request], Awaitable[BaseModel | bytes]]


class _TooLarge(Exception):
    pass


def error_response(status: int, kind: str, message: str) -> Response:
    """The JSON error body every route answers with: ``{"error": {"type", "message"}}``."""
    payload = _ErrorPayload.model_construct(error=_ErrorDetail.model_construct(type=kind, message=message))
    return Response(payload.model_dump_json(), status_code=status, media_type=_JSON)


class _ErrorDetail(BaseModel):
    type: str
    message: str


class _ErrorPayload(BaseModel):
    error: _ErrorDetail


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


async def read_body(request: Request, limit: int, field: str) -> bytes:
    """The request body, or ``_TooLarge`` as soon as it passes ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _TooLarge(
            f"request body of {declared} bytes is over the {limit}-byte limit; send `{field}` in smaller batches."
        )
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _TooLarge(f"request body is over the {limit}-byte limit; send `{field}` in smaller batches.")
        chunks.append(chunk)
    return b"".join(chunks)


class _BearerAuth:
    """Pure ASGI middleware: 401 unless ``Authorization: Bearer <token>`` matches (constant time)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = b""
            for key, value in scope["headers"]:
                if key == b"authorization":
                    given = value
                    break
            if not hmac.compare_digest(given, self._expected):
                message = (
                    "wrong bearer token; pass the server's --token to the client."
                    if given
                    else "missing bearer token: this store requires `Authorization: Bearer <token>` "
                    "(StoreClient(url, token=...))."
                )
                response = error_response(401, "UnauthorizedError", message)
                response.headers["www-authenticate"] = "Bearer"
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_store_app(
    store: LightningStore,
    token: str | None = None,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    expire_interval_s: float = 1.0,
) -> FastAPI:
    """A FastAPI app serving ``store`` (see the module docstring for the rules it follows).

    Args:
        store: Any backend; the app does not close it.
        token: If set, every request must carry ``Authorization: Bearer <token>``.
        max_body_bytes: Larger request bodies are refused with 413.
        expire_interval_s: How often the app's lifespan task calls ``store.expire()``; 0 disables it.
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

    app = FastAPI(
        title="Lightning store",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )

    def route(method: str, path: str, body_model: type[BaseModel] | None, field: str, fn: _Handler) -> None:
        async def endpoint(request: Request) -> Response:
            try:
                body: Any = None
                if body_model is not None:
                    body = body_model.model_validate_json(await read_body(request, max_body_bytes, field))
                result = await fn(store, body, request)
            except ValidationError as exc:
                return error_response(400, "InvalidRequestError", _describe(exc))
            except _TooLarge as exc:
                return error_response(413, "InvalidRequestError", str(exc))
            except LightningError as exc:
                return error_response(http_status(exc), type(exc).__name__, str(exc))
            except Exception:
                logger.exception("store server: %s %s failed", method, path)
                return error_response(
                    500, "InternalError", f"{method} {path} failed inside the store; see the server log."
                )
            if isinstance(result, bytes):
                return Response(result, media_type=_JSON)
            return Response(result.model_dump_json(), media_type=_JSON)

        app.router.add_route(path, endpoint, methods=[method], include_in_schema=False)

    # --- rollouts ---------------------------------------------------------------------------
    async def enqueue(s: LightningStore, b: EnqueueBody, _: Request) -> BaseModel:
        return RolloutList.model_construct(rollouts=await s.enqueue(b.requests))

    async def claim(s: LightningStore, b: ClaimBody, _: Request) -> BaseModel:
        return ClaimList.model_construct(claims=await s.claim(b.worker_id, b.n))

    async def heartbeat(s: LightningStore, _b: None, r: Request) -> BaseModel:
        return await s.heartbeat(r.path_params["attempt_id"])

    async def finish(s: LightningStore, b: FinishBody, r: Request) -> BaseModel:
        return await s.finish_attempt(r.path_params["attempt_id"], b.status, error=b.error, reward=b.reward)

    async def cancel(s: LightningStore, b: IdsBody, _: Request) -> BaseModel:
        return RolloutList.model_construct(rollouts=await s.cancel(b.ids))

    async def get_rollout(s: LightningStore, _b: None, r: Request) -> BaseModel:
        return await s.get_rollout(r.path_params["rollout_id"])

    async def query_rollouts(s: LightningStore, b: QueryRolloutsBody, _: Request) -> BaseModel:
        rows = await s.query_rollouts(
            ids=b.ids, status=b.status, group_id=b.group_id, mode=b.mode, limit=b.limit, offset=b.offset
        )
        return RolloutList.model_construct(rollouts=rows)

    async def wait(s: LightningStore, b: WaitBody, _: Request) -> BaseModel:
        return RolloutList.model_construct(rollouts=await s.wait_for_rollouts(b.ids, b.timeout_s))

    # --- attempts ---------------------------------------------------------------------------
    async def get_attempt(s: LightningStore, _b: None, r: Request) -> BaseModel:
        return await s.get_attempt(r.path_params["attempt_id"])

    async def query_attempts(s: LightningStore, _b: None, r: Request) -> BaseModel:
        return AttemptList.model_construct(attempts=await s.query_attempts(r.path_params["rollout_id"]))

    # --- spans ------------------------------------------------------------------------------
    async def add_spans(s: LightningStore, b: SpansBody, _: Request) -> bytes:
        return b'{"count":%d}' % await s.add_spans(b.spans)

    async def query_spans(s: LightningStore, b: QuerySpansBody, _: Request) -> BaseModel:
        rows = await s.query_spans(
            rollout_id=b.rollout_id, attempt_id=b.attempt_id, name=b.name, limit=b.limit, offset=b.offset
        )
        return SpanList.model_construct(spans=rows)

    # --- resources --------------------------------------------------------------------------
    async def add_resources(s: LightningStore, b: ResourcesBody, _: Request) -> BaseModel:
        return await s.add_resources(llm=b.llm, prompts=b.prompts, extra=b.extra)

    async def latest_resources(s: LightningStore, _b: None, _r: Request) -> BaseModel:
        return await s.get_resources(None)

    async def get_resources(s: LightningStore, _b: None, r: Request) -> BaseModel:
        raw: str = r.path_params["version"]
        if not raw.isdigit():
            raise InvalidRequestError(f"resources version must be a positive integer or 'latest', got {raw!r}.")
        return await s.get_resources(int(raw))

    # --- housekeeping -----------------------------------------------------------------------
    async def expire(s: LightningStore, b: ExpireBody, _: Request) -> BaseModel:
        return Count.model_construct(count=await s.expire(b.now))

    async def prune(s: LightningStore, b: PruneBody, _: Request) -> BaseModel:
        return Count.model_construct(count=await s.prune(b.older_than))

    async def stats(s: LightningStore, _b: None, _r: Request) -> BaseModel:
        return await s.stats()

    async def health(_s: LightningStore, _b: None, _r: Request) -> bytes:
        return b'{"status":"ok"}'

    route("POST", "/rollouts/enqueue", EnqueueBody, "requests", enqueue)
    route("POST", "/rollouts/claim", ClaimBody, "body", claim)
    route("POST", "/rollouts/cancel", IdsBody, "ids", cancel)
    route("POST", "/rollouts/query", QueryRolloutsBody, "ids", query_rollouts)
    route("POST", "/rollouts/wait", WaitBody, "ids", wait)
    route("GET", "/rollouts/{rollout_id}", None, "", get_rollout)
    route("GET", "/rollouts/{rollout_id}/attempts", None, "", query_attempts)
    route("GET", "/attempts/{attempt_id}", None, "", get_attempt)
    route("POST", "/attempts/{attempt_id}/heartbeat", None, "", heartbeat)
    route("POST", "/attempts/{attempt_id}/finish", FinishBody, "body", finish)
    route("POST", "/spans", SpansBody, "spans", add_spans)
    route("POST", "/spans/query", QuerySpansBody, "body", query_spans)
    route("POST", "/resources", ResourcesBody, "extra", add_resources)
    route("GET", "/resources/latest", None, "", latest_resources)
    route("GET", "/resources/{version}", None, "", get_resources)
    route("POST", "/expire", ExpireBody, "body", expire)
    route("POST", "/prune", PruneBody, "body", prune)
    route("GET", "/stats", None, "", stats)
    route("GET", "/health", None, "", health)

    async def otlp_traces(request: Request) -> Response:
        try:
            raw = await read_body(request, max_body_bytes, "resourceSpans")
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

    async def http_error(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        kind = "NotFoundError" if exc.status_code == 404 else "InvalidRequestError"
        return error_response(exc.status_code, kind, f"{exc.detail}: see StoreClient for the routes this server has.")

    app.add_exception_handler(StarletteHTTPException, http_error)
    if token:
        app.add_middleware(_BearerAuth, token=token)
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
) -> AsyncGenerator[tuple[uvicorn.Server, asyncio.Task[None], str]]:
    app = create_store_app(store, token, max_body_bytes=max_body_bytes, expire_interval_s=expire_interval_s)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=5,
    )
    server = _QuietServer(config)
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                with contextlib.suppress(SystemExit):  # uvicorn exits on a bind error; raise instead
                    task.result()
                raise OSError(f"store server could not start on {host}:{port}; see the log above.")
            await asyncio.sleep(0.01)
        bound = server.servers[0].sockets[0].getsockname()
        display = f"[{host}]" if ":" in host else host
        yield server, task, f"http://{display}:{bound[1]}"
    finally:
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
    async with _started(store, host, port, token, max_body_bytes, expire_interval_s) as (_server, _task, url):
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
    async with _started(store, host, port, token, DEFAULT_MAX_BODY_BYTES, 1.0) as (server, task, url):
        loop = asyncio.get_running_loop()

        def stop() -> None:
            server.should_exit = True

        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):  # not on Windows / not main thread
                loop.add_signal_handler(sig, stop)
        if on_ready is not None:
            on_ready(url)
        await asyncio.shield(task)
