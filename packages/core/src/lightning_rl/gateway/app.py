"""The OpenAI-compatible gateway: serve a model to agents and record every call of a rollout.

The agent never knows it is being trained: it is given a base URL and talks the OpenAI API.
Which rollout a call belongs to comes from the URL (``/rollouts/{rollout}/attempts/{attempt}/key/{key}/v1``,
optionally ``/roles/{role}`` before ``/v1``) or from the ``X-Lightning-Rollout`` /
``X-Lightning-Attempt`` / ``X-Lightning-Key`` / ``X-Lightning-Role`` headers; a call outside any
rollout is served and not recorded (evaluation, plain use). A call inside one is served only when it
names a running attempt and carries that attempt's key (``binding``). Recording never sits on the
request path: spans go to a ``SpanWriter`` that batches them to the store in the background.
Limits come before work: a body above ``max_body_bytes`` is a 413 before it is read.

Bad input is answered the way the OpenAI API answers it (``{"error": {...}}`` with a 4xx), so agent
frameworks surface a readable message; only a bug in the gateway gives a 500.

The model-call routes are the hot path, with one entry point, ``_GatewayApp.call_for`` (see
``_asgi``), reached before FastAPI's middleware and router, which serve everything else. It returns
an awaitable of the JSON bytes of a 200 or of a ``Response`` (errors, streams); a non-streamed
call's is one future resolved from the backend's callback (``_Gateway._call``), so on the
gateway's own server it is answered without a task (see ``lightning_rl._serving``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar, cast

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from lightning_rl._serving import FastHandler, content_length, read_body, send_json
from lightning_rl.credentials import bearer_header_matches
from lightning_rl.engine.base import InferenceEngine, SamplingParams
from lightning_rl.errors import LightningError, http_status
from lightning_rl.gateway import formatting as fmt
from lightning_rl.gateway._asgi import CallKind, body_too_large, call_context, match_call
from lightning_rl.gateway._weights import weights_file
from lightning_rl.gateway.binding import AttemptBinder
from lightning_rl.gateway.protocol import GatewayHTTPError, dumpb, error_response, loads, new_call_id
from lightning_rl.gateway.recording import CallContext, CallInfo, Recorder
from lightning_rl.gateway.upstreams import (
    CallResult,
    CallSpec,
    EngineBackend,
    GatewayBackend,
    StreamPiece,
    call_starter,
)
from lightning_rl.gateway.validation import check_chat_request, check_completion_request, check_responses_request
from lightning_rl.seeding import CallSeeds
from lightning_rl.spans import SpanWriter
from lightning_rl.store.base import LightningStore

__all__ = ["GatewayConfig", "create_gateway_app"]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")

#: Model names frameworks send by default; they are mapped to the served model.
DEFAULT_ALIASES: tuple[str, ...] = ("gpt-5.6-luna",)

_PREFIXES = (
    "",
    "/rollouts/{rollout_id}",
    "/rollouts/{rollout_id}/key/{key}",
    "/rollouts/{rollout_id}/attempts/{attempt_id}",
    "/rollouts/{rollout_id}/attempts/{attempt_id}/roles/{role:path}",
    "/rollouts/{rollout_id}/attempts/{attempt_id}/key/{key}",
    "/rollouts/{rollout_id}/attempts/{attempt_id}/key/{key}/roles/{role:path}",
)


@dataclass
class GatewayConfig:
    """Limits and names. Requests beyond a limit get a 400 that names it."""

    model_aliases: tuple[str, ...] = DEFAULT_ALIASES
    """Extra model names accepted for the served model (the OpenAI Agents SDK sends ``gpt-5.6-luna``)."""
    accept_any_model: bool = False
    """Serve every model name instead of answering 404 for unknown ones. Calls attributed to a
    rollout (URL or headers) always get the served model, so a framework's configured model name
    needs no change during training."""
    max_n: int = 16
    """Most choices per call."""
    max_tokens_limit: int = 8192
    """Most completion tokens a client may ask for."""
    default_max_tokens: int | None = None
    """Completion budget when the client sets none (``None``: up to ``max_tokens_limit`` and the context)."""
    writer_max_batch: int = 512
    writer_flush_interval_s: float = 0.0
    """How long a partial batch of spans waits before it is written. Zero: one event-loop step, so the
    calls that complete in the same step share a batch (~2 % less CPU per call than writing at once);
    spans written so soon after they were built are still in the CPU cache and die young (never
    promoted by the garbage collector): waiting 50 ms cost ~18 % more gateway CPU per recorded call."""
    writer_max_queue: int = 100_000
    max_body_bytes: int = 16 * 1024 * 1024
    """Largest request body accepted; a larger one is answered 413 before it is read (by its
    ``Content-Length``) or as soon as that many bytes arrived (a chunked body), and never kept."""
    attempt_check_s: float = 1.0
    """How long the store's answer about a running attempt is trusted before it is asked again (see
    ``binding``): a call may be served up to this long after its attempt ended."""
    weights_dir: str | None = None
    """The folder ``POST /admin/weights`` may load weights files from (``None``: no file may be
    loaded; an upstream backend, which takes only a version, still works). Paths outside it are
    refused with a 403 that says nothing about them."""
    call_seeds: CallSeeds | None = None
    """Seeds for the recorded calls that set none, derived from the run's seed, the rollout and the
    call (``lightning_rl.seeding``; the trainer sets it). ``None``: such calls draw from OS randomness."""


class _SSE(StreamingResponse):
    """A stream that always closes its generator, so a client that leaves frees its batch slot at once."""

    async def stream_response(self, send: Send) -> None:
        try:
            await super().stream_response(send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()


_Handler = Callable[[bytes, CallContext], Awaitable[bytes | Response]]


def _body(raw: bytes) -> dict[str, Any]:
    try:
        data = loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        msg = f"the request body is not valid JSON ({exc}); send a JSON object."
        raise GatewayHTTPError(400, msg, code="invalid_json") from exc
    if not isinstance(data, dict):
        raise GatewayHTTPError(400, "the request body must be a JSON object.", code="invalid_type")
    return data


def _stop_list(body: dict[str, Any]) -> list[str]:
    stop: str | list[str] | None = body.get("stop")
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else [s for s in stop if s]


def _ready(response: Response) -> asyncio.Future[bytes | Response]:
    """An answer known at once (an error), as the future the call handlers return."""
    future: asyncio.Future[bytes | Response] = asyncio.get_running_loop().create_future()
    future.set_result(response)
    return future


class _Gateway:
    """The app's state and handlers (one instance per app)."""

    def __init__(
        self, backend: GatewayBackend, store: LightningStore | None, config: GatewayConfig, writer: SpanWriter | None
    ) -> None:
        self.backend = backend
        self.config = config
        self.writer = writer
        self.recorder = Recorder(writer)
        self.binder = AttemptBinder(store, config.attempt_check_s) if store is not None else None
        self.requests: Counter[str] = Counter()
        self.errors: Counter[int] = Counter()
        self.streams_cancelled = 0
        self.in_flight = 0
        self.opening = 0
        """Streams being opened (their first piece awaited): in flight, not yet counted in ``in_flight``."""
        self.held = 0
        self._resumed: asyncio.Future[None] | None = None
        """Set while paused (see ``pause``): the calls that arrive wait for it."""
        self._start_call = call_starter(backend)

    # --- validation -------------------------------------------------------------------------
    def _model(self, requested: str | None, ctx: CallContext) -> str:
        """The model name to answer with: the requested one when this gateway serves it (frameworks that
        compare the two, as AutoGen does, stay quiet); spans record the served model either way."""
        served = self.backend.model_name
        if requested is None or requested == served:
            return served
        # Inside a rollout the policy under training answers, whatever name the agent's framework
        # was configured with ("gpt-4o-mini" in a user's LangChain code): the agent runs unchanged.
        if requested in self.config.model_aliases or self.config.accept_any_model or ctx.rollout_id is not None:
            return requested
        msg = f"the model {requested!r} does not exist here; this gateway serves {served!r}."
        raise GatewayHTTPError(404, msg, param="model", code="model_not_found")

    def limits(self, n: int, max_tokens: int | None, param: str = "max_tokens") -> int:
        cfg = self.config
        if n > cfg.max_n:
            msg = f"n={n} is above this gateway's limit of {cfg.max_n}."
            raise GatewayHTTPError(400, msg, param="n", code="invalid_value")
        if max_tokens is not None and max_tokens > cfg.max_tokens_limit:
            msg = f"{param}={max_tokens} is above this gateway's limit of {cfg.max_tokens_limit}."
            raise GatewayHTTPError(400, msg, param=param, code="invalid_value")
        return max_tokens or cfg.default_max_tokens or cfg.max_tokens_limit

    def params(
        self, body: dict[str, Any], max_tokens: int, stop: list[str], top_logprobs: int, ctx: CallContext
    ) -> SamplingParams:
        """The sampling parameters of a call (the one place a call's seed is decided: the body's, else
        for a recorded call one derived from the run, the rollout and the call, ``config.call_seeds``)."""
        temperature, top_p, seed = body.get("temperature"), body.get("top_p"), body.get("seed")
        seeds = self.config.call_seeds
        if seed is None and seeds is not None and ctx.rollout_id is not None:
            seed = seeds.next_seed(ctx.rollout_id, ctx.attempt_id)
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if temperature is None else temperature,
            top_p=1.0 if top_p is None else top_p,
            stop=stop,
            seed=seed,
            top_logprobs=top_logprobs,
        )

    # --- /v1/models -------------------------------------------------------------------------
    async def models(self, request: Request) -> Response:
        now = int(time.time())
        names = [self.backend.model_name, *self.config.model_aliases]
        data = [{"id": m, "object": "model", "created": now, "owned_by": "lightning"} for m in names]
        return JSONResponse({"object": "list", "data": data})

    # --- every model call -----------------------------------------------------------------
    def handle(self, api: _API, raw: bytes, ctx: CallContext) -> Awaitable[bytes | Response]:
        """A model call of any API: validate it, plan the backend calls, then answer at once (one
        future, resolved from the backend's callback) or as a stream."""
        start_ns = time.time_ns()
        self.requests[api.name] += 1
        try:
            body = _body(raw)
            api.check(body)
            model = self._model(body.get("model"), ctx)
            specs = api.plan(self, body, ctx)
            call = _Call(api, ctx, body, model, new_call_id(api.id_prefix), int(time.time()), start_ns, specs)
            if body.get("stream"):
                return self._stream(call)
            if len(specs) == 1:
                return self._call(partial(self._start_call, specs[0]), partial(self._finish_one, call))
            return self._call(partial(self._start_all, specs), partial(self._finish, call))
        except Exception as exc:
            return _ready(self._error(exc))

    def _finish(self, call: _Call, results: list[CallResult]) -> bytes:
        """Record the call's results and format its answer."""
        served = self.backend.model_name
        for spec, result in zip(call.specs, results, strict=True):
            self.recorder.record(call.ctx, call.info(spec, served), result)
        return dumpb(call.api.respond(call, results))

    def _finish_one(self, call: _Call, result: CallResult) -> bytes:
        return self._finish(call, [result])

    # --- binding a call to its attempt -----------------------------------------------------
    def bound(self, handler: _Handler) -> _Handler:
        """``handler`` answering only calls bound to a running attempt whose key they carry (see
        ``binding``); calls that name no rollout, or a gateway without a store, are served as they are."""

        def call(raw: bytes, ctx: CallContext) -> Awaitable[bytes | Response]:
            if self._resumed is not None:
                return self._held(call, raw, ctx)
            binder = self.binder
            if ctx.rollout_id is None or binder is None:
                return handler(raw, ctx)
            try:
                bound = binder.bind(ctx)
            except GatewayHTTPError as exc:
                return _ready(self._error(exc))
            if isinstance(bound, CallContext):
                return handler(raw, bound)
            return self._bound_later(handler, raw, bound)

        return call

    async def _bound_later(self, handler: _Handler, raw: bytes, binding: Awaitable[CallContext]) -> bytes | Response:
        try:
            ctx = await binding
        except Exception as exc:
            return self._error(exc)
        if self._resumed is not None:  # paused while the store was asked: wait like a new call
            return await self._held(handler, raw, ctx)
        return await handler(raw, ctx)

    # --- pause and drain ------------------------------------------------------------------
    async def pause(self, timeout_s: float | None = None) -> bool:
        """Stop admitting model calls, then wait until the calls in flight have ended (within
        ``timeout_s``, ``None``: however long; returns whether they did). Calls that arrive meanwhile
        are held and served after ``resume``: a weight swap in between loses no call, and none is
        answered partly by the old weights and recorded under the new version."""
        if self._resumed is None:
            self._resumed = asyncio.get_running_loop().create_future()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        quiet = 0
        while quiet < 2:  # twice in a row: a stream is counted only once its body starts
            quiet = quiet + 1 if self.in_flight + self.opening == 0 else 0
            if quiet < 2 and deadline is not None and time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.005)
        return True

    def resume(self) -> None:
        """Admit calls again; the held ones go on."""
        resumed, self._resumed = self._resumed, None
        if resumed is not None:
            resumed.set_result(None)

    async def _held(self, handler: _Handler, raw: bytes, ctx: CallContext) -> bytes | Response:
        self.held += 1
        try:
            while self._resumed is not None:
                await asyncio.shield(self._resumed)
        finally:
            self.held -= 1
        return await handler(raw, ctx)

    # --- non-streamed calls: callbacks, no task -------------------------------------------
    def _start_all(
        self, specs: list[CallSpec], on_done: Callable[[list[CallResult] | None, BaseException | None], None]
    ) -> None:
        """Start every call of a multi-prompt request; ``on_done`` gets all results, or the first error."""
        if not specs:
            on_done([], None)
            return
        results: list[CallResult | None] = [None] * len(specs)
        left = len(specs)

        def one(i: int, result: CallResult | None, exc: BaseException | None) -> None:
            nonlocal left
            if left <= 0:
                return  # an earlier call failed: already reported
            if exc is not None or result is None:
                left = 0
                on_done(None, exc or RuntimeError("the backend answered nothing"))
                return
            results[i] = result
            left -= 1
            if left == 0:
                on_done([r for r in results if r is not None], None)

        for i, spec in enumerate(specs):
            self._start_call(spec, partial(one, i))

    def _call(
        self,
        start: Callable[[Callable[[_T | None, BaseException | None], None]], None],
        finish: Callable[[_T], bytes],
    ) -> asyncio.Future[bytes | Response]:
        """The answer to a call: ``start(on_done)`` starts the backend's work, whose result ``finish``
        records and formats. Chained by callbacks, so the fast path writes it without a task."""
        self.in_flight += 1
        out: asyncio.Future[bytes | Response] = asyncio.get_running_loop().create_future()

        def done(result: _T | None, exc: BaseException | None) -> None:
            self.in_flight -= 1
            if out.done():
                return  # the caller gave up (cancelled): nobody to answer
            if exc is None:
                try:
                    out.set_result(finish(cast(_T, result)))  # no error: a result
                    return
                except Exception as error:
                    exc = error
            if isinstance(exc, asyncio.CancelledError):
                out.cancel()
            else:
                out.set_result(self._error(exc))

        try:
            start(done)
        except Exception as exc:  # refused before it started (a closed client, a body it cannot send)
            done(None, exc)
        return out

    # --- streaming plumbing -----------------------------------------------------------------
    async def _open_stream(self, spec: CallSpec) -> AsyncGenerator[StreamPiece]:
        """Start a backend stream and wait for its first piece, so early errors (prompt too long,
        upstream down) become a proper error response instead of a broken stream."""
        stream = self.backend.stream(spec)
        try:
            first = await anext(stream, None)
        except BaseException:
            await stream.aclose()
            raise

        async def chained() -> AsyncGenerator[StreamPiece]:
            try:
                if first is not None:
                    yield first
                async for piece in stream:
                    yield piece
            finally:
                await stream.aclose()

        return chained()

    async def _stream(self, call: _Call) -> Response:
        """A streamed answer: the backend's stream opened (its first piece in), as an SSE response
        whose chunks the API formats from the pieces; the call is recorded when it ends."""
        spec = call.specs[0]  # one prompt (see validation)
        self.opening += 1
        try:
            pieces = await self._open_stream(spec)
        except Exception as exc:
            return self._error(exc)
        finally:
            self.opening -= 1
        acc = fmt.StreamAccumulator(spec.n)
        chunks = call.api.chunks(call, pieces, acc)

        async def body() -> AsyncGenerator[str]:
            self.in_flight += 1
            finished = False
            try:
                async for chunk in chunks:
                    yield chunk
                finished = True
            except Exception as exc:  # mid-stream failure: tell the client in-band, keep the server up
                _log.warning("stream %s failed: %s", call.rid, exc)
                error = {"message": f"the stream failed: {exc}", "type": "server_error", "param": None, "code": None}
                yield fmt.sse({"error": error})
            finally:
                self.in_flight -= 1
                await chunks.aclose()
                if finished:
                    self.recorder.record(call.ctx, call.info(spec, self.backend.model_name), acc.result())
                else:
                    self.streams_cancelled += 1

        return _SSE(body(), media_type="text/event-stream", headers={"cache-control": "no-cache"})

    def _error(self, exc: BaseException) -> Response:
        """The answer to a failed call, counted: the client's mistakes a 4xx, only a bug a 500."""
        if isinstance(exc, GatewayHTTPError):
            response = exc.response()
        elif isinstance(exc, LightningError) and (status := http_status(exc)) != 500:
            response = error_response(status, str(exc), code="invalid_value" if status == 400 else None)
        elif isinstance(exc, ValueError):
            response = error_response(400, str(exc), code="invalid_value")
        elif isinstance(exc, ConnectionError):
            response = error_response(503, str(exc), type="service_unavailable")
        else:
            _log.exception("gateway error", exc_info=exc)
            msg = f"internal gateway error: {type(exc).__name__}: {exc}"
            response = error_response(500, msg, type="server_error")
        self.errors[response.status_code] += 1
        return response

    # --- operations -------------------------------------------------------------------------
    async def metrics(self, request: Request) -> Response:
        values = self.metric_values()
        if request.query_params.get("format") == "json" or "application/json" in request.headers.get("accept", ""):
            return JSONResponse(values)
        lines: list[str] = []
        for name, value in values.items():
            if isinstance(value, dict):
                lines.append(f"# TYPE lightning_gateway_{name} counter")
                label = "status" if name == "errors_total" else "api"
                for key, v in value.items():
                    lines.append(f'lightning_gateway_{name}{{{label}="{key}"}} {v}')
            else:
                lines.append(f"lightning_gateway_{name} {value}")
        return Response("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")

    def metric_values(self) -> dict[str, Any]:
        values: dict[str, Any] = {
            "requests_total": dict(self.requests),
            "errors_total": {str(k): v for k, v in self.errors.items()},
            "in_flight": self.in_flight,
            "paused": int(self._resumed is not None),
            "calls_held": self.held,
            "streams_cancelled_total": self.streams_cancelled,
            "calls_recorded_total": self.recorder.recorded,
            "model_version": self.backend.version or 0,
        }
        if self.writer is not None:
            s = self.writer.stats()
            values.update(
                spans_written_total=s.written,
                spans_pending=s.pending,
                spans_dropped_total=s.dropped,
                spans_rejected_total=s.rejected,
                span_write_retries_total=s.retries,
            )
        return values

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": self.backend.model_name, "version": self.backend.version})

    async def admin_pause(self, request: Request) -> Response:
        """``POST /admin/pause`` (``{"timeout_s": ...}`` optional): stop admitting calls and drain."""
        try:
            body = await self._admin_body(request, b"{}")
            timeout_s = body.get("timeout_s")
            if timeout_s is not None and (not isinstance(timeout_s, int | float) or timeout_s < 0):
                raise GatewayHTTPError(400, "'timeout_s' must be a non-negative number of seconds.", param="timeout_s")
            drained = await self.pause(timeout_s)
            return JSONResponse({"paused": True, "drained": drained, "in_flight": self.in_flight + self.opening})
        except Exception as exc:
            return self._error(exc)

    async def _admin_body(self, request: Request, empty: bytes) -> dict[str, Any]:
        """An admin request's JSON object (``empty`` stands for a missing body)."""
        limit = self.config.max_body_bytes
        return _body(await read_body(request.receive, limit, partial(body_too_large, None, limit)) or empty)

    async def admin_resume(self, request: Request) -> Response:
        """``POST /admin/resume``: admit calls again (the held ones first)."""
        held = self.held
        self.resume()
        return JSONResponse({"paused": False, "released": held})

    async def admin_weights(self, request: Request) -> Response:
        """Swap weights (embedded engine) or record the upstream's new version: ``{"path", "version"}``,
        ``path`` a file inside ``GatewayConfig.weights_dir`` (anything else is refused: ``_weights``)."""
        try:
            body = await self._admin_body(request, b"")
            version = body.get("version")
            path = body.get("path")
            if not isinstance(version, int) or isinstance(version, bool) or version < 0:
                raise GatewayHTTPError(400, "'version' must be a non-negative integer.", param="version")
            if path is None:
                await self.backend.load_weights(None, version)
                return JSONResponse({"version": self.backend.version})
            file = weights_file(path, self.config.weights_dir)
            try:
                await self.backend.load_weights(str(file), version)
            except Exception as exc:  # a file inside the folder that is not a state dict of this model
                _log.warning("could not load weights from %s: %r", file, exc)
                raise GatewayHTTPError(
                    400,
                    f"could not load weights from {path!r} in the weights folder ({type(exc).__name__}); "
                    "save the model's state dict there with torch.save.",
                    param="path",
                ) from exc
            return JSONResponse({"version": self.backend.version})
        except Exception as exc:
            return self._error(exc)


# --- The APIs: what differs between chat completions, completions and responses ---

_Plan = Callable[["_Gateway", dict[str, Any], CallContext], list[CallSpec]]
_Chunks = Callable[["_Call", AsyncGenerator[StreamPiece], fmt.StreamAccumulator], AsyncGenerator[str]]


@dataclass(frozen=True, slots=True)
class _API:
    """One model-call API, described by what ``_Gateway.handle`` cannot share between them."""

    name: str
    """The API as metrics and spans name it (``chat.completions``)."""
    operation: str
    """The span's ``gen_ai.operation.name``."""
    id_prefix: str
    check: Callable[[dict[str, Any]], None]
    """Its validation pass (``validation``)."""
    plan: _Plan
    """The backend calls a valid body asks for (one per prompt)."""
    respond: Callable[[_Call, list[CallResult]], dict[str, Any]]
    """The non-streamed answer, from one result per call."""
    chunks: _Chunks
    """The streamed answer's server-sent events, from the backend's pieces."""


@dataclass(slots=True)
class _Call:
    """One request's facts, shared by the steps that answer and record it."""

    api: _API
    ctx: CallContext
    body: dict[str, Any]
    model: str
    """The model name answered (see ``_Gateway._model``)."""
    rid: str
    created: int
    start_ns: int
    specs: list[CallSpec]

    def info(self, spec: CallSpec, served_model: str) -> CallInfo:
        """What the request asked for, for the span of ``spec``'s call."""
        return CallInfo(
            self.api.name,
            self.api.operation,
            self.body.get("model"),
            served_model,
            self.rid,
            bool(self.body.get("stream")),
            self.start_ns,
            time.time_ns(),
            spec.params.temperature,
            spec.params.top_p,
            spec.max_tokens_requested,
            spec.prompt if spec.api == "completion" else spec.body["messages"],
        )


def _chat_plan(gw: _Gateway, body: dict[str, Any], ctx: CallContext) -> list[CallSpec]:
    n: int = body.get("n") or 1
    requested: int | None = body.get("max_completion_tokens") or body.get("max_tokens")
    max_tokens = gw.limits(n, requested, "max_completion_tokens" if body.get("max_completion_tokens") else "max_tokens")
    want_lp = bool(body.get("logprobs"))
    messages: list[dict[str, Any]] = [
        dict(m, content=fmt.content_text(m["content"])) if isinstance(m.get("content"), list) else m
        for m in body["messages"]
    ]
    params = gw.params(body, max_tokens, _stop_list(body), (body.get("top_logprobs") or 0) if want_lp else 0, ctx)
    tools, choice = body.get("tools") or None, body.get("tool_choice")
    return [
        CallSpec("chat", params, n, requested, messages, tools, choice, None, want_lp, body, ctx.role, ctx.rollout_id)
    ]


def _completion_plan(gw: _Gateway, body: dict[str, Any], ctx: CallContext) -> list[CallSpec]:
    n: int = body.get("n") or 1
    requested: int | None = body.get("max_tokens")
    params = gw.params(body, gw.limits(n, requested), _stop_list(body), body.get("logprobs") or 0, ctx)
    want_lp = body.get("logprobs") is not None
    prompt = body["prompt"]  # one prompt (text or token ids) per choice group (see ``validation``)
    prompts: list[str | list[int]] = [prompt] if isinstance(prompt, str) or isinstance(prompt[0], int) else prompt
    return [
        CallSpec("completion", params, n, requested, None, None, None, p, want_lp, body, ctx.role, ctx.rollout_id)
        for p in prompts
    ]


def _responses_plan(gw: _Gateway, body: dict[str, Any], ctx: CallContext) -> list[CallSpec]:
    """A Responses call as the chat call it is served by (its ``body`` is what an upstream gets)."""
    requested: int | None = body.get("max_output_tokens")
    max_tokens = gw.limits(1, requested, "max_output_tokens")
    messages = fmt.responses_messages(body)
    tools = fmt.responses_tools(body.get("tools"))
    choice = fmt.responses_tool_choice(body.get("tool_choice"))
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages, "n": 1, "max_tokens": max_tokens}
    chat.update(
        (k, body[k]) for k in ("temperature", "top_p", "seed", "parallel_tool_calls") if body.get(k) is not None
    )
    if tools:
        chat["tools"] = tools
        if choice is not None:
            chat["tool_choice"] = choice
    params = gw.params(body, max_tokens, [], 0, ctx)
    return [
        CallSpec("chat", params, 1, requested, messages, tools, choice, None, False, chat, ctx.role, ctx.rollout_id)
    ]


def _chat_respond(call: _Call, results: list[CallResult]) -> dict[str, Any]:
    return fmt.chat_response(call.rid, call.created, call.model, results[0], call.specs[0].want_logprobs)


def _completion_respond(call: _Call, results: list[CallResult]) -> dict[str, Any]:
    spec = call.specs[0]
    return fmt.completion_response(call.rid, call.created, call.model, results, spec.n, spec.want_logprobs)


def _responses_respond(call: _Call, results: list[CallResult]) -> dict[str, Any]:
    message_id = "msg_" + call.rid.removeprefix("resp_")[:24]
    return fmt.response_object(call.rid, call.created, call.model, call.body, results[0], message_id=message_id)


async def _chunks(call: _Call, pieces: AsyncGenerator[StreamPiece], acc: fmt.StreamAccumulator) -> AsyncGenerator[str]:
    """Chat and completions streams: a chunk per piece, the usage when asked, then ``[DONE]``."""
    spec = call.specs[0]
    started: set[int] = set()
    async for piece in pieces:
        acc.add(piece)
        if piece.index >= 0:
            yield fmt.stream_chunk(
                call.rid, call.created, call.model, spec, piece, acc, first=piece.index not in started
            )
            started.add(piece.index)
    if (call.body.get("stream_options") or {}).get("include_usage"):
        result = acc.result()
        yield fmt.usage_chunk(call.rid, call.created, call.model, spec, result)
    yield "data: [DONE]\n\n"


async def _responses_chunks(
    call: _Call, pieces: AsyncGenerator[StreamPiece], acc: fmt.StreamAccumulator
) -> AsyncGenerator[str]:
    events = fmt.ResponsesEvents(call.rid, call.created, call.model, call.body)
    for event in events.start():
        yield event
    async for piece in pieces:
        acc.add(piece)
        if piece.index == 0:
            for event in events.text_delta(piece.text):
                yield event
    for event in events.finish(acc.result()):
        yield event


_CHAT = _API("chat.completions", "chat", "chatcmpl-", check_chat_request, _chat_plan, _chat_respond, _chunks)
_COMPLETIONS = _API(
    "completions", "text_completion", "cmpl-", check_completion_request, _completion_plan, _completion_respond, _chunks
)
_RESPONSES = _API(
    "responses", "chat", "resp_", check_responses_request, _responses_plan, _responses_respond, _responses_chunks
)


class _GatewayApp(FastAPI):
    """FastAPI with the model-call routes answered before its middleware and router (the hot path)."""

    gateway: _Gateway
    expected_auth: bytes | None = None
    admin_auth: bytes | None = None
    max_body_bytes: int = 16 * 1024 * 1024
    max_body_why: str | None = None
    """What set ``max_body_bytes`` when it is not the operator's setting (the model's context)."""
    calls: dict[CallKind, _Handler]

    def _token_ok(self, headers: list[tuple[bytes, bytes]]) -> bool:
        """Whether the request carries the agents' token (always, when the gateway has none)."""
        return self.expected_auth is None or bearer_header_matches(headers, self.expected_auth)

    def _refusal(self, path: str, headers: list[tuple[bytes, bytes]]) -> Response | None:
        """The answer to a request refused before any work (a missing or wrong token, a body above
        the limit by its ``Content-Length``), else ``None``."""
        if path.startswith("/admin/"):
            if self.admin_auth is None:
                msg = (
                    "the admin endpoints are off: start the gateway with an admin token "
                    "(create_gateway_app(admin_token=...), lightning-rl gateway serve --admin-token-file or "
                    "$LIGHTNING_GATEWAY_ADMIN_TOKEN) and send it as 'Authorization: Bearer <admin token>'."
                )
                return error_response(403, msg, type="permission_error", code="admin_disabled")
            if not bearer_header_matches(headers, self.admin_auth):
                msg = "missing or wrong admin token: send 'Authorization: Bearer <the gateway's admin token>'."
                return error_response(401, msg, type="authentication_error", code="invalid_api_key")
        elif path != "/health" and not self._token_ok(headers):
            msg = "missing or wrong API key: send 'Authorization: Bearer <the gateway token>'."
            return error_response(401, msg, type="authentication_error", code="invalid_api_key")
        size = content_length(headers)
        if size is not None and size > self.max_body_bytes:
            return self._too_large(size).response()
        return None

    def _too_large(self, size: int | None = None) -> GatewayHTTPError:
        return body_too_large(size, self.max_body_bytes, self.max_body_why)

    def call_for(self, path: str, headers: list[tuple[bytes, bytes]]) -> FastHandler | None:
        """The one entry point of the model-call routes (for the fast path and ``__call__``): the handler
        of ``path`` bound to the call's context, or ``None`` when ``path`` is no model call."""
        hit = match_call(path)
        if hit is None:
            return None
        kind, rollout, attempt, key, role = hit
        handler = self.calls[kind]
        ctx = call_context(headers, rollout, attempt, role, key)

        def answer(raw: bytes) -> Awaitable[bytes | Response]:
            return handler(raw, ctx)

        return answer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path: str = scope["path"]
            refusal = self._refusal(path, scope["headers"])
            if refusal is not None:
                await refusal(scope, receive, send)
                return
            if scope["method"] == "POST":
                root: str = scope.get("root_path", "")  # mounted: match the path below the mount point
                answer = self.call_for(path[len(root) :] if root and path.startswith(root) else path, scope["headers"])
                if answer is not None:
                    await self._answer(answer, scope, receive, send)
                    return
        await super().__call__(scope, receive, send)

    async def _answer(self, answer: FastHandler, scope: Scope, receive: Receive, send: Send) -> None:
        """Read the body, answer the call, send the answer (the ASGI path; the fast path does this itself)."""
        try:
            raw = await read_body(receive, self.max_body_bytes, self._too_large)
        except GatewayHTTPError as exc:  # a chunked body above the limit
            await exc.response()(scope, receive, send)
            return
        if raw is None:
            return  # the client left before sending its request: nobody to answer
        out = await answer(raw)
        if isinstance(out, bytes):
            await send_json(send, 200, out)
        else:
            await out(scope, receive, send)

    def fast_handler(self, path: str, headers: list[tuple[bytes, bytes]]) -> FastHandler | None:
        """The model-call routes for the serving protocol's fast path (``lightning_rl._serving``); ``None``
        leaves the request to ``__call__`` (other routes, a bad token, no ``Content-Length``, a 413)."""
        if not self._token_ok(headers):
            return None
        size = content_length(headers)
        if size is None or size > self.max_body_bytes:
            return None
        return self.call_for(path, headers)


def create_gateway_app(
    backend: GatewayBackend | InferenceEngine,
    *,
    store: LightningStore | None = None,
    token: str | None = None,
    admin_token: str | None = None,
    config: GatewayConfig | None = None,
    writer: SpanWriter | None = None,
) -> FastAPI:
    """The gateway as an ASGI app.

    Args:
        backend: An ``EngineBackend``, an ``UpstreamBackend``, or an ``InferenceEngine`` (wrapped in
            an ``EngineBackend``).
        store: Where calls of a rollout are recorded; ``None`` serves without recording.
        token: When set, every request must carry ``Authorization: Bearer <token>`` (the agent's API key).
        admin_token: The token ``/admin/*`` (weights) requires instead of ``token``; must differ from
            it. ``None``: the admin endpoints answer 403.
        config: Limits and model aliases.
        writer: A ``SpanWriter`` to record through (default: one over ``store``, closed with the app).
    """
    if isinstance(backend, InferenceEngine):
        backend = EngineBackend(backend)
    config = config or GatewayConfig()
    own_writer = writer is None and store is not None
    if own_writer:
        assert store is not None
        writer = SpanWriter(
            store,
            max_batch=config.writer_max_batch,
            flush_interval_s=config.writer_flush_interval_s,
            max_queue=config.writer_max_queue,
        )
    gw = _Gateway(backend, store, config, writer)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncGenerator[None]:
        await gw.backend.start()
        try:
            yield
        finally:
            gw.resume()  # calls held by a pause are served before the backend closes
            if writer is not None:
                if own_writer:
                    await writer.close(timeout=10.0)
                else:
                    await writer.flush(timeout=10.0)
            await gw.backend.aclose()

    app = _GatewayApp(title="Lightning gateway", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.gateway = gw
    app.state.gateway = gw
    if admin_token is not None and (not admin_token or admin_token == token):
        raise ValueError("admin_token must be non-empty and differ from token (the key agents hold).")
    app.expected_auth = token.encode() if token else None
    app.admin_auth = admin_token.encode() if admin_token else None
    app.max_body_bytes = config.max_body_bytes
    bound = getattr(gw.backend, "body_bound", None)
    context_bound = bound() if callable(bound) else None
    if isinstance(context_bound, int) and context_bound < config.max_body_bytes:  # see EngineBackend.body_bound
        app.max_body_bytes = context_bound
        app.max_body_why = "no longer body can hold a prompt that fits the model's context"
    apis: dict[CallKind, _API] = {"chat": _CHAT, "completions": _COMPLETIONS, "responses": _RESPONSES}
    app.calls = {kind: gw.bound(partial(gw.handle, api)) for kind, api in apis.items()}
    for prefix in _PREFIXES:  # the model calls are answered by app.call_for, before the router
        app.add_route(prefix + "/v1/models", gw.models, methods=["GET"], include_in_schema=False)
    app.add_route("/metrics", gw.metrics, methods=["GET"], include_in_schema=False)
    app.add_route("/health", gw.health, methods=["GET"], include_in_schema=False)
    app.add_route("/admin/weights", gw.admin_weights, methods=["POST"], include_in_schema=False)
    app.add_route("/admin/pause", gw.admin_pause, methods=["POST"], include_in_schema=False)
    app.add_route("/admin/resume", gw.admin_resume, methods=["POST"], include_in_schema=False)
    return app
