"""HTTP serving details shared by the store server and the gateway.

``http_protocol()`` is uvicorn's HTTP/1.1 protocol (httptools when installed, else h11) with two
measured savings. uvicorn writes a response's head and body in two ``send`` calls, two wake-ups of
the client on loopback; here the head leaves with the body written after it. And per request,
uvicorn's ASGI cycle (a cycle object, message dicts, header checks, a write flushed a loop step
later) cost the gateway about a sixth of its CPU per model call, so an app that defines
``fast_handler(path, headers)`` (``FastRoutes``) may answer a ``POST`` itself: once the body is in
it is handed over as bytes, and a ``bytes`` answer is written as a ``200`` JSON response in one
``send``, from the future's callback when the handler returns a future (no task, cycle object or
event per call: about 1 % of the gateway's instructions). Any other answer (an ASGI app: an error,
a stream) runs through uvicorn's cycle and its flow control; a whole ``bytes`` answer is written
even to a slow reader (one bounded JSON body). Anything unusual (``Expect: 100-continue``, an
upgrade, HTTP/1.0, a ``root_path``, a concurrency limit, a request pipelined behind one in flight)
takes uvicorn's own path, so keep-alive, pipelining order, disconnects and graceful shutdown behave
as uvicorn makes them behave.

The subclass relies on uvicorn's private protocol internals (``_unset_keepalive_if_required``,
``_start_asgi_task``, ``RequestResponseCycle``'s keywords), which change between releases, so it is
used only with the uvicorn versions it was tested with (``TESTED_UVICORN``). With any other version
(a ``RuntimeWarning`` says so), or with ``LIGHTNING_STOCK_UVICORN=1``, ``http_protocol()`` returns
uvicorn's own protocol class: every route then goes through ASGI, correct and somewhat slower.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import importlib.util
import os
import signal
import urllib.parse
import warnings
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Iterable, MutableMapping, Sequence
from functools import partial
from typing import Any, Protocol, cast

from lightning_rl.credentials import bearer_matches

__all__ = [
    "uvicorn_config",
    "wait_until_serving",
    "serving",
    "stop_on_signals",
    "BearerAuth",
    "send_json",
    "content_length",
    "read_body",
    "http_protocol",
    "FastHandler",
    "FastRoutes",
    "TESTED_UVICORN",
    "STOCK_UVICORN_ENV",
    "fast_path_refusal",
]

TESTED_UVICORN: tuple[tuple[int, int], tuple[int, int]] = ((0, 54), (0, 55))
"""uvicorn versions ``[low, high)`` the fast path's subclass is tested with (``.ci/uvicorn_range`` and
``tests/reliability/test_gateway_serving.py``); outside them the stock protocol is used."""
STOCK_UVICORN_ENV = "LIGHTNING_STOCK_UVICORN"
"""Set to ``1`` to serve with uvicorn's own protocol class (no fast path, no coalesced writes)."""
_warned: set[str] = set()


def uvicorn_config(app: Any, host: str = "127.0.0.1", port: int = 0, **options: Any) -> Any:
    """A ``uvicorn.Config`` for ``app`` with the serving defaults of the gateway and the store server
    (``options`` override them): ``http_protocol()``, no access log, no ``date``/``server`` headers
    and no proxy-header rewriting, which neither ever needs."""
    import uvicorn

    settings: dict[str, Any] = {
        "log_level": "warning",
        "access_log": False,
        "lifespan": "on",
        "http": http_protocol(),
        "server_header": False,
        "date_header": False,
        "proxy_headers": False,
    }
    settings.update(options)
    return uvicorn.Config(app, host=host, port=port, **settings)


async def wait_until_serving(server: Any, task: asyncio.Task[Any], host: str, what: str) -> str:
    """Wait for a ``uvicorn.Server`` started as ``task`` to listen; return ``http://host:port`` with the
    bound port. uvicorn reports a bind error by logging and calling ``sys.exit``; a server that ends
    before it listens raises ``OSError(what)`` here instead, so the caller sees a real error."""
    while not server.started:
        if task.done():
            with contextlib.suppress(SystemExit):  # uvicorn exits on a bind error; raise instead
                task.result()
            raise OSError(what)
        await asyncio.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()
    display = f"[{host}]" if ":" in host else host
    return f"http://{display}:{bound[1]}"


@contextlib.asynccontextmanager
async def serving(config: Any, host: str, what: str) -> AsyncGenerator[tuple[str, Any, asyncio.Task[None]]]:
    """Serve a ``uvicorn.Config`` in this event loop; yield its URL, the ``uvicorn.Server`` and the task
    serving it. Signals are left to the host (a test, an app, or ``stop_on_signals``): uvicorn's own
    handlers would take Ctrl-C from the process. On exit the server stops, requests in flight first."""
    import uvicorn

    server: Any = uvicorn.Server(config)
    server.capture_signals = contextlib.nullcontext  # uvicorn >= 0.29
    server.install_signal_handlers = lambda: None  # older uvicorn
    task = asyncio.create_task(server.serve())
    try:
        yield await wait_until_serving(server, task, host, what), server, task
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await task


def stop_on_signals(stop: Callable[[], object]) -> None:
    """Call ``stop`` on SIGINT or SIGTERM (a command serving until stopped); a no-op where the loop
    cannot take signal handlers (Windows, a thread other than the main one)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop)


async def send_json(send: Any, status: int, body: bytes, extra_headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    """Answer an ASGI request with a JSON body of known length (not chunked: one socket write fewer)."""
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)), *extra_headers]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BearerAuth:
    """Pure ASGI middleware: 401 unless ``Authorization: Bearer <token>`` matches (the scheme in any
    case, the token in constant time: ``credentials.bearer_matches``) on the paths ``guards`` picks
    (all by default). ``refusal(sent)`` makes the 401's JSON body, told whether a token was sent."""

    def __init__(
        self, app: Any, token: str, refusal: Callable[[bool], bytes], guards: Callable[[str], bool] | None = None
    ) -> None:
        self.app, self._token, self._refusal, self._guards = app, token.encode(), refusal, guards

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and (self._guards is None or self._guards(scope["path"])):
            given = next((value for key, value in scope["headers"] if key == b"authorization"), b"")
            if not bearer_matches(given, self._token):
                await send_json(send, 401, self._refusal(bool(given)), [(b"www-authenticate", b"Bearer")])
                return
        await self.app(scope, receive, send)


def content_length(headers: Iterable[tuple[bytes, bytes]]) -> int | None:
    """A request's ``Content-Length`` (``None`` when absent or unreadable: the body is counted as it arrives)."""
    for key, value in headers:
        if key == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def read_body(
    receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
    limit: int,
    too_large: Callable[[], Exception],
    headers: Iterable[tuple[bytes, bytes]] = (),
) -> bytes | None:
    """A request's whole body from ASGI ``receive``; ``None`` when the client left before it was in.
    Above ``limit`` bytes it raises ``too_large()`` (each server words its own 413): by the
    ``Content-Length`` in ``headers`` before reading, else once that many arrived (never kept)."""
    size = content_length(headers)
    if size is not None and size > limit:
        raise too_large()
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise too_large()
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def fast_path_refusal() -> str | None:
    """Why the fast path's protocol subclass is not used here (``None``: it is)."""
    if os.environ.get(STOCK_UVICORN_ENV, "").strip() not in ("", "0"):
        return f"{STOCK_UVICORN_ENV} is set"
    import uvicorn

    try:
        version = tuple(int(p) for p in uvicorn.__version__.split(".")[:2])
    except ValueError:
        return f"uvicorn {uvicorn.__version__} has an unreadable version"
    low, high = TESTED_UVICORN
    if not low <= version < high:
        return (
            f"uvicorn {uvicorn.__version__} is outside the tested range "
            f">={low[0]}.{low[1]},<{high[0]}.{high[1]} of Lightning's serving fast path"
        )
    return None


FastHandler = Callable[[bytes], Awaitable[Any]]
"""Answers one request from its body, eventually: ``bytes`` (a ``200`` JSON body) or an ASGI app to run.
An ``asyncio.Future`` is answered from its done callback (no task for the call); any other
awaitable runs in a task, as uvicorn runs an app."""


class FastRoutes(Protocol):
    """An ASGI app that answers some ``POST`` routes without going through ASGI."""

    def fast_handler(self, path: str, headers: list[tuple[bytes, bytes]]) -> FastHandler | None:
        """The handler for a ``POST`` to ``path`` (decoded, no query) with these (lower-cased)
        headers, or ``None`` to serve the request through ASGI as usual."""
        ...


class _CoalescingTransport:
    """A transport that sends a response's head together with the body written after it (normally in
    the same loop step); a head with no body in that step (a stream) leaves at its end. Every other
    write goes out at once, after whatever is held, so the byte order never changes."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._buffer: list[bytes] = []
        self._loop = asyncio.get_running_loop()
        # Asked twice per response: bound once here, not found through ``__getattr__`` each time
        # (a failed attribute lookup and a Python call, ~1 % of the gateway's instructions).
        self.is_closing = transport.is_closing

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._buffer and data[:5] == b"HTTP/":  # a head: held for the body written after it
            self._buffer.append(bytes(data))
            self._loop.call_soon(self._flush)
        else:
            self.write_now(bytes(data))

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def write_now(self, data: bytes) -> None:
        """Send ``data`` at once (after anything held): a whole response, nothing to wait for."""
        if self._buffer:
            self._buffer.append(data)
            self._flush()
        else:
            self._transport.write(data)

    def _flush(self) -> None:
        if self._buffer:
            data = self._buffer[0] if len(self._buffer) == 1 else b"".join(self._buffer)
            self._buffer.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(len(b) for b in self._buffer)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def http_protocol() -> type[asyncio.Protocol]:
    """The protocol class to serve with (see the module docstring); h11 gets coalesced writes only."""
    refusal = fast_path_refusal()
    if refusal is not None:
        if not refusal.startswith(STOCK_UVICORN_ENV) and refusal not in _warned:
            _warned.add(refusal)
            warnings.warn(
                f"{refusal}; serving with uvicorn's own HTTP protocol (correct, slower). Install a tested "
                f"uvicorn or set {STOCK_UVICORN_ENV}=1 to silence this.",
                RuntimeWarning,
                stacklevel=2,
            )
    if importlib.util.find_spec("httptools") is not None:
        if refusal is None:
            return _httptools_protocol()
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        return HttpToolsProtocol
    from uvicorn.protocols.http.h11_impl import H11Protocol

    if refusal is not None:
        return H11Protocol

    class _CoalescingH11(H11Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            # no isinstance check: uvloop's transports do not subclass asyncio.Transport
            super().connection_made(cast(asyncio.Transport, _CoalescingTransport(cast(asyncio.Transport, transport))))

    return _CoalescingH11


def _httptools_protocol() -> type[asyncio.Protocol]:
    import httptools
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
    from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

    class _Protocol(HttpToolsProtocol):
        _fast: Callable[[str, list[tuple[bytes, bytes]]], FastHandler | None] | None = None
        _out: _CoalescingTransport

        def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
            # no isinstance check: uvloop's transports do not subclass asyncio.Transport
            self._out = _CoalescingTransport(cast(asyncio.Transport, transport))
            self._fast = getattr(self.app, "fast_handler", None)
            super().connection_made(cast(asyncio.Transport, self._out))

        # --- keep-alive: one timer per connection ------------------------------------------
        # uvicorn cancels its keep-alive timer when a request's bytes arrive and arms a new one
        # after every response: a timer per call (~4 % of the gateway's CPU per call). Here the
        # timer stays armed: bytes and responses only mark the connection active, and the timer,
        # when it fires, closes the connection only if nothing happened for the whole timeout
        # and no request is in flight (else it waits out the rest). Unlike uvicorn's, it also
        # closes a connection whose client stopped half-way through a request's head.
        _last_active = 0.0

        def _unset_keepalive_if_required(self) -> None:
            self._last_active = self.loop.time()

        def on_response_complete(self) -> None:
            self.server_state.total_requests += 1
            if self.transport.is_closing():
                return
            self._last_active = self.loop.time()
            self.flow.resume_reading()
            if self.pipeline:
                cycle, app = self.pipeline.pop()
                self._start_asgi_task(cycle, app)
            elif self.timeout_keep_alive_task is None:
                self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self._keep_alive_check)

        def _keep_alive_check(self) -> None:
            self.timeout_keep_alive_task = None
            in_flight = cast(RequestResponseCycle | _FastCall | None, self.cycle)
            if self.transport.is_closing() or (in_flight is not None and not in_flight.response_complete):
                return  # closed, or a request in flight: its response arms the timer again
            idle = self.loop.time() - self._last_active
            if idle >= self.timeout_keep_alive:
                self.timeout_keep_alive_handler()
            else:
                wait = self.timeout_keep_alive - idle
                self.timeout_keep_alive_task = self.loop.call_later(wait, self._keep_alive_check)

        def connection_lost(self, exc: Exception | None) -> None:
            super().connection_lost(exc)
            if self.timeout_keep_alive_task is not None:
                self.timeout_keep_alive_task.cancel()
                self.timeout_keep_alive_task = None

        # --- the fast path: receiving -------------------------------------------------------
        def on_headers_complete(self) -> None:
            fast = self._fast
            parser: Any = self.parser
            in_flight = cast(RequestResponseCycle | _FastCall | None, self.cycle)  # None before the first request
            if (
                fast is None
                or self.expect_100_continue
                or self.root_path
                or self.limit_concurrency is not None
                or (in_flight is not None and not in_flight.response_complete)
                or parser.get_method() != b"POST"
                or parser.get_http_version() != "1.1"
                or parser.should_upgrade()
            ):
                super().on_headers_complete()
                return
            parsed = httptools.parse_url(self.url)
            raw_path: bytes = parsed.path
            path = raw_path.decode("ascii")
            if "%" in path:
                path = urllib.parse.unquote(path)
            handler = fast(path, self.headers)
            if handler is None:
                super().on_headers_complete()
                return
            scope = self.scope
            scope["method"] = "POST"
            scope["path"] = path
            scope["raw_path"] = raw_path
            scope["query_string"] = parsed.query or b""
            self.cycle = _FastCall(handler, scope, parser.should_keep_alive())  # type: ignore[assignment]

        def on_body(self, body: bytes) -> None:
            call = self.cycle
            if isinstance(call, _FastCall) and not call.started:
                # The handler wants the whole body at once: keep reading. (uvicorn pauses reading
                # past 64 KiB until the app's ``receive`` asks for more, which no fast handler does.)
                call.chunks.append(body)
                return
            super().on_body(body)

        def on_message_complete(self) -> None:
            call = self.cycle
            if not isinstance(call, _FastCall) or call.started:
                super().on_message_complete()
                return
            call.started = True
            chunks = call.chunks
            body = b"".join(chunks) if len(chunks) != 1 else chunks[0]
            call.chunks = []
            try:
                out = call.handler(body)
            except Exception as exc:
                self._fail(call, exc)
                return
            if isinstance(out, asyncio.Future):  # answered by a callback: no task per call
                out.add_done_callback(partial(self._future_done, call))
            else:
                self._spawn(call, self._await(call, out))

        # --- the fast path: answering -------------------------------------------------------
        def _future_done(self, call: _FastCall, future: asyncio.Future[Any]) -> None:
            try:
                out = future.result()
            except asyncio.CancelledError:
                self._fail(call, None)
                return
            except Exception as exc:
                self._fail(call, exc)
                return
            self._answer(call, out)

        async def _await(self, call: _FastCall, pending: Awaitable[Any]) -> None:
            try:
                out = await pending
            except Exception as exc:
                self._fail(call, exc)
                return
            self._answer(call, out)

        def _answer(self, call: _FastCall, out: Any) -> None:
            """Write a ``bytes`` answer as a whole ``200`` response, or run an ASGI app."""
            if not isinstance(out, bytes):
                self._spawn(call, self._run_asgi(call, out))
                return
            transport = self._out
            if call.disconnected or transport.is_closing():
                return  # the client left: nobody to answer (as uvicorn's ``send`` does)
            head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % len(out)
            for name, value in self.server_state.default_headers:
                head += b"%s: %s\r\n" % (name, value)
            if not call.keep_alive:
                head += b"connection: close\r\n"
            call.response_complete = True
            if self.access_log:
                scope: Any = call.scope
                self.access_logger.info(
                    '%s - "POST %s HTTP/1.1" 200', get_client_addr(scope), get_path_with_query_string(scope)
                )
            transport.write_now(head + b"\r\n" + out)
            if not call.keep_alive:
                transport.close()
            self.on_response_complete()

        def _fail(self, call: _FastCall, exc: BaseException | None) -> None:
            """The handler raised (or was cancelled): a ``500``, as uvicorn answers an app that raises."""
            if exc is not None:
                self.logger.error("Exception in ASGI application\n", exc_info=exc)
            self._spawn(call, self._run_asgi(call, None))

        async def _run_asgi(self, call: _FastCall, app: Any) -> None:
            """Answer through uvicorn's own cycle: an ASGI app (an error, a stream) or, for ``None``, a 500."""
            cycle = RequestResponseCycle(
                scope=call.scope,  # type: ignore[arg-type]
                transport=self.transport,
                flow=self.flow,
                logger=self.logger,
                access_logger=self.access_logger,
                access_log=self.access_log,
                default_headers=self.server_state.default_headers,
                message_event=asyncio.Event(),
                expect_100_continue=False,
                keep_alive=call.keep_alive,
                on_response=self.on_response_complete,
            )
            cycle.more_body = False  # the body was read: the app's ``receive`` gets an empty one
            cycle.disconnected = call.disconnected or self.transport.is_closing()
            if cast(object, self.cycle) is call:  # so disconnects and shutdown reach the cycle now answering
                self.cycle = cycle
            call.response_complete = True  # this placeholder is done; the cycle answers
            if app is None:
                if not cycle.disconnected:
                    await cycle.send_500_response()  # ``connection: close``: the cycle closes the connection
                return
            await cycle.run_asgi(app)

        def _spawn(self, call: _FastCall, coro: Coroutine[Any, Any, None]) -> None:
            if getattr(self.config, "reset_contextvars", False):  # as uvicorn starts its tasks
                task = self.loop.create_task(coro, context=contextvars.Context())
            else:
                task = self.loop.create_task(coro)
            task.add_done_callback(self.tasks.discard)
            self.tasks.add(task)

    return _Protocol


class _NoEvent:
    """Stands in for a cycle's ``message_event``: a fast call has nobody waiting on ``receive``."""

    __slots__ = ()

    def set(self) -> None:
        return None


_NO_EVENT = _NoEvent()


class _FastCall:
    """A request answered by a ``FastHandler``, as uvicorn's protocol sees it while in flight: the few
    attributes the protocol reads from its current cycle, so disconnects, graceful shutdown and
    pipelining treat it as uvicorn's own cycle, at a fraction of the cost."""

    __slots__ = ("handler", "scope", "keep_alive", "chunks", "started", "response_complete", "disconnected")
    message_event = _NO_EVENT

    def __init__(self, handler: FastHandler, scope: dict[str, Any], keep_alive: bool) -> None:
        self.handler = handler
        self.scope = scope
        self.keep_alive = keep_alive
        self.chunks: list[bytes] = []
        self.started = False
        self.response_complete = False
        self.disconnected = False
