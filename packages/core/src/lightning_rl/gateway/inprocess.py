"""Agents in the gateway's own process reach it without a socket.

The trainer runs the gateway, the engine and the agents on one event loop in one process. Over
loopback TCP every model call costs the agent's HTTP stack (httpcore's connection pool and h11
parser, a connect per client) and the gateway's server (parsing) a few hundred microseconds of
Python, plus a dozen socket system calls, each of which gives up the GIL and then waits for the
engine thread to hand it back. On the demo that was ~20 % of the event loop's CPU per step.

``running_gateway`` registers the app it serves here while it serves it. An ``httpx`` client
built by ``LLM.async_openai_client`` for a URL of that gateway, on that gateway's event loop, gets
an ``InProcessTransport``: a model call's body is handed to the app's ``fast_handler`` (exactly
what the HTTP server does for these routes, with the same auth check) and its bytes come back as
the response. Everything else falls back to a real HTTP connection: other routes, a wrong token
(answered 401 by the server), another event loop or thread, a gateway that stopped serving.

Behaviour is the server's: the same handlers answer (in a fresh ``contextvars`` context, as on
the server, so the agent's rollout context never leaks into the gateway), errors and streams run
their ASGI response (streamed chunk by chunk; closing the stream disconnects, which frees the
engine slot), the client's read timeout bounds the wait for the answer and for each chunk, and
cancelling the agent cancels the call as a client that hangs up does.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import weakref
from collections.abc import AsyncIterator, Awaitable, Coroutine, Generator, MutableMapping
from contextlib import contextmanager
from typing import Any, cast
from urllib.parse import urlsplit

import httpx

__all__ = ["InProcessTransport", "serving_in_process", "serving_here", "in_process_transport"]

_log = logging.getLogger(__name__)
_DEFAULT_PORTS = {"http": 80, "https": 443}
_served: dict[tuple[str, str, int], tuple[weakref.ref[Any], asyncio.AbstractEventLoop]] = {}
_background: set[asyncio.Task[Any]] = set()  # ASGI responses still running after their client left


def _origin(url: str | httpx.URL) -> tuple[str, str, int] | None:
    parts = urlsplit(str(url))
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    try:
        port = parts.port or _DEFAULT_PORTS.get(scheme)
    except ValueError:
        return None
    if not host or port is None:
        return None
    return scheme, host, port


@contextmanager
def serving_in_process(url: str, app: Any) -> Generator[None]:
    """Register ``app`` (served at ``url`` on the running loop) for in-process clients while the block runs."""
    origin = _origin(url)
    if origin is None or not callable(getattr(app, "fast_handler", None)):
        yield
        return
    entry = (weakref.ref(app), asyncio.get_running_loop())
    _served[origin] = entry
    try:
        yield
    finally:
        if _served.get(origin) is entry:
            del _served[origin]


def _served_app(url: str | httpx.URL, loop: asyncio.AbstractEventLoop) -> Any | None:
    origin = _origin(url)
    entry = _served.get(origin) if origin is not None else None
    if entry is None or entry[1] is not loop:
        return None
    return entry[0]()


def serving_here(base_url: str) -> bool:
    """Whether the gateway of ``base_url`` is served in this process on the running event loop."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return False
    return _served_app(base_url, loop) is not None


def in_process_transport(base_url: str, fallback: httpx.AsyncBaseTransport) -> InProcessTransport | None:
    """An ``InProcessTransport`` to the gateway of ``base_url`` if it serves here, else ``None``."""
    if not serving_here(base_url):
        return None
    return InProcessTransport(asyncio.get_running_loop(), fallback)


class InProcessTransport(httpx.AsyncBaseTransport):
    """Sends model calls to the gateway app served in this process on ``loop``; everything else, and
    requests from another loop, to ``fallback`` (a real HTTP transport, closed with this one)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fallback: httpx.AsyncBaseTransport) -> None:
        self._loop = loop
        self._fallback = fallback

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        handler = None
        headers = [(key.lower(), value) for key, value in request.headers.raw]
        if request.method == "POST" and asyncio.get_running_loop() is self._loop:
            app = _served_app(request.url, self._loop)
            if app is not None:
                handler = app.fast_handler(request.url.path, headers)
        if handler is None:
            return await self._fallback.handle_async_request(request)
        body = await request.aread()
        timeout = cast(dict[str, float | None], request.extensions.get("timeout", {})).get("read")
        context = contextvars.Context()  # the server's handlers never see the agent's context
        pending = context.run(handler, body)
        future: asyncio.Future[Any] = (
            pending
            if isinstance(pending, asyncio.Future)
            else self._loop.create_task(_awaited(pending), context=context)
        )
        try:
            out = await asyncio.wait_for(future, timeout)
        except TimeoutError as exc:
            raise httpx.ReadTimeout("the gateway did not answer in time", request=request) from exc
        except Exception as exc:  # the handler raised: the server logs it and answers 500
            _log.error("Exception in the gateway's handler", exc_info=exc)
            return httpx.Response(500, text="Internal Server Error", request=request)
        if isinstance(out, bytes):
            return httpx.Response(200, headers=[(b"content-type", b"application/json")], content=out, request=request)
        return await self._run_asgi(out, request, headers, timeout)

    async def _run_asgi(
        self, app: Any, request: httpx.Request, headers: list[tuple[bytes, bytes]], timeout: float | None
    ) -> httpx.Response:
        """Run an ASGI answer (an error, a stream) as the server would, its body streamed back."""
        from starlette.responses import Response, StreamingResponse

        if isinstance(app, Response) and not isinstance(app, StreamingResponse) and app.background is None:
            return httpx.Response(app.status_code, headers=app.raw_headers, content=bytes(app.body), request=request)
        url = request.url
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": request.method,
            "scheme": url.scheme,
            "path": url.path,
            "raw_path": url.raw_path.split(b"?", 1)[0],
            "query_string": url.query,
            "root_path": "",
            "headers": headers,
            "client": ("127.0.0.1", 0),
            "server": (url.host, url.port or _DEFAULT_PORTS.get(url.scheme, 80)),
        }
        started: asyncio.Future[tuple[int, list[tuple[bytes, bytes]]]] = self._loop.create_future()
        chunks: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue()
        gone = asyncio.Event()
        sent_request = False

        async def receive() -> MutableMapping[str, Any]:
            nonlocal sent_request
            if not sent_request:
                sent_request = True
                return {"type": "http.request", "body": b"", "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
            if gone.is_set():
                return  # the client left: nobody to answer (as uvicorn's ``send`` does)
            if message["type"] == "http.response.start":
                if not started.done():
                    started.set_result((int(message["status"]), list(message.get("headers", []))))
            elif message["type"] == "http.response.body":
                data = bytes(message.get("body", b""))
                if data:
                    chunks.put_nowait(data)
                if not message.get("more_body", False):
                    chunks.put_nowait(None)

        def finished(task: asyncio.Task[None]) -> None:
            _background.discard(task)
            error = None if task.cancelled() else task.exception()
            if not started.done():
                started.set_exception(error or RuntimeError("the gateway's response ended before it started"))
            elif error is not None:
                chunks.put_nowait(error)
            else:
                chunks.put_nowait(None)  # harmless after the body's own end marker

        coroutine = cast(Coroutine[Any, Any, None], app(scope, receive, send))
        task = self._loop.create_task(coroutine, context=contextvars.Context())
        _background.add(task)
        task.add_done_callback(finished)
        try:
            status, response_headers = await asyncio.wait_for(asyncio.shield(started), timeout)
        except TimeoutError as exc:
            gone.set()
            raise httpx.ReadTimeout("the gateway did not answer in time", request=request) from exc
        except asyncio.CancelledError:
            gone.set()
            raise
        except Exception as exc:  # the app raised before it answered: the server answers 500
            _log.error("Exception in the gateway's response", exc_info=exc)
            return httpx.Response(500, text="Internal Server Error", request=request)
        stream = _Body(chunks, gone, timeout, request)
        return httpx.Response(status, headers=response_headers, stream=stream, request=request)

    async def aclose(self) -> None:
        await self._fallback.aclose()


async def _awaited(pending: Awaitable[Any]) -> Any:
    return await pending


class _Body(httpx.AsyncByteStream):
    """A streamed answer's chunks; closing it before the end tells the app its client left."""

    def __init__(
        self,
        chunks: asyncio.Queue[bytes | BaseException | None],
        gone: asyncio.Event,
        timeout: float | None,
        request: httpx.Request,
    ) -> None:
        self._chunks = chunks
        self._gone = gone
        self._timeout = timeout
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            try:
                item = await asyncio.wait_for(self._chunks.get(), self._timeout)
            except TimeoutError as exc:
                self._gone.set()
                raise httpx.ReadTimeout("the gateway's stream stalled", request=self._request) from exc
            if item is None:
                return
            if isinstance(item, BaseException):
                self._gone.set()
                raise httpx.ReadError(f"the gateway's response failed: {item}", request=self._request) from item
            yield item

    async def aclose(self) -> None:
        self._gone.set()  # the end already came, or the app's ``receive`` now reports a disconnect
