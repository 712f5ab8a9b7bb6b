"""The serving protocol's fast path (``lightning_rl._serving``), over real sockets against uvicorn.

An app with ``fast_handler`` gets the bodies of its hot ``POST`` routes without ASGI; everything
HTTP/1.1 promises must still hold: keep-alive, pipelining order, errors and streams through ASGI,
``Expect: 100-continue``, ``Connection: close``, HTTP/1.0, a client that leaves mid-call, and a
graceful shutdown that waits for the call in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import pytest
from starlette.responses import JSONResponse, StreamingResponse
from starlette.types import Receive, Scope, Send

from lightning_rl._serving import FastHandler
from lightning_rl.gateway import running_gateway


@dataclass
class _App:
    """ASGI app whose ``/fast*`` routes have fast handlers; every request answers with what served it."""

    fast_calls: list[str] = field(default_factory=list[str])
    asgi_calls: list[str] = field(default_factory=list[str])
    finished: list[str] = field(default_factory=list[str])
    release: asyncio.Event = field(default_factory=asyncio.Event)
    futures: bool = False
    """Handlers return a future (answered by its callback) instead of a coroutine (run in a task)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        self.asgi_calls.append(scope["path"])
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        out = json.dumps({"via": "asgi", "path": scope["path"], "body": body.decode()}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(out))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": out})

    def fast_handler(self, path: str, headers: list[tuple[bytes, bytes]]) -> FastHandler | None:
        if not path.startswith("/fast"):
            return None
        self.fast_calls.append(path)

        async def handle(raw: bytes) -> Any:
            if path == "/fast/slow":
                await self.release.wait()
            self.finished.append(path)
            if path == "/fast/error":
                return JSONResponse({"error": "teapot"}, status_code=418)
            if path == "/fast/stream":

                async def pieces() -> AsyncIterator[bytes]:
                    for piece in (b"one,", b"two,", b"three"):
                        yield piece

                return StreamingResponse(pieces(), media_type="text/plain")
            if path == "/fast/raise":
                raise RuntimeError("a bug in the handler")
            return json.dumps({"via": "fast", "path": path, "body": raw.decode()}).encode()

        if self.futures:
            return lambda raw: asyncio.ensure_future(handle(raw))
        return handle


def _request(method: str, path: str, body: bytes = b"", headers: str = "", version: str = "1.1") -> bytes:
    head = f"{method} {path} HTTP/{version}\r\nHost: test\r\nContent-Length: {len(body)}\r\n{headers}\r\n"
    return head.encode() + body


async def _response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One response: status, lower-cased headers, body (Content-Length or chunked)."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode()
    status_line, *lines = head.strip().split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    if "content-length" in headers:
        return int(status_line.split()[1]), headers, await reader.readexactly(int(headers["content-length"]))
    body = b""
    while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
        body += await reader.readexactly(size)
        await reader.readexactly(2)
    await reader.readexactly(2)
    return int(status_line.split()[1]), headers, body


def _json(body: bytes) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(body)
    return out


Connect = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


@pytest.fixture(params=["coroutine", "future"])
async def served(request: pytest.FixtureRequest) -> AsyncIterator[tuple[_App, Connect]]:
    app = _App(futures=request.param == "future")
    writers: list[asyncio.StreamWriter] = []
    # a bounded shutdown: a regression that leaves a request hanging fails its test, not the session
    async with running_gateway(app, timeout_graceful_shutdown=5) as url:
        host, port = url.removeprefix("http://").split(":")

        async def connect() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
            reader, writer = await asyncio.open_connection(host, int(port))
            writers.append(writer)
            return reader, writer

        yield app, connect
        app.release.set()
        for w in writers:
            w.close()


async def test_fast_routes_skip_asgi_and_keep_the_connection_alive(served: tuple[_App, Connect]) -> None:
    app, connect = served
    reader, writer = await connect()
    for i in range(3):
        writer.write(_request("POST", "/fast/echo", b'{"i": %d}' % i))
        status, headers, body = await _response(reader)
        assert status == 200 and headers["content-type"] == "application/json"
        assert _json(body) == {"via": "fast", "path": "/fast/echo", "body": f'{{"i": {i}}}'}
        assert "connection" not in headers
    writer.write(_request("GET", "/other"))
    status, _, body = await _response(reader)
    assert status == 200 and _json(body)["via"] == "asgi"
    assert app.fast_calls == ["/fast/echo"] * 3 and app.asgi_calls == ["/other"]


async def test_a_body_larger_than_uvicorn_s_read_buffer_arrives_whole(served: tuple[_App, Connect]) -> None:
    _, connect = served
    reader, writer = await connect()
    big = b"x" * (3 * 1024 * 1024)  # long prompts are common; uvicorn pauses reading past 64 KiB
    writer.write(_request("POST", "/fast/echo", big))
    status, _, body = await asyncio.wait_for(_response(reader), 30)
    assert status == 200 and _json(body)["body"] == big.decode()
    # a chunked request body too
    chunked = b"POST /fast/echo HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunked += b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    writer.write(chunked)
    status, _, body = await asyncio.wait_for(_response(reader), 30)
    assert status == 200 and _json(body) == {"via": "fast", "path": "/fast/echo", "body": "hello world"}


async def test_pipelined_requests_are_answered_in_order(served: tuple[_App, Connect]) -> None:
    app, connect = served
    reader, writer = await connect()
    # one write, three requests: the first waits in its handler while the other two are parsed
    writer.write(
        _request("POST", "/fast/slow", b"first") + _request("GET", "/other") + _request("POST", "/fast/echo", b"third")
    )
    await asyncio.sleep(0.2)
    app.release.set()
    answers = [_json((await _response(reader))[2]) for _ in range(3)]
    assert [(a["path"], a["body"]) for a in answers] == [
        ("/fast/slow", "first"),
        ("/other", ""),
        ("/fast/echo", "third"),
    ]
    # the third was behind a call in flight: uvicorn queued it and ASGI served it, in order
    assert [a["via"] for a in answers] == ["fast", "asgi", "asgi"]


async def test_a_handler_may_answer_through_asgi_an_error_or_a_stream(served: tuple[_App, Connect]) -> None:
    _, connect = served
    reader, writer = await connect()
    writer.write(_request("POST", "/fast/error"))
    status, _, body = await _response(reader)
    assert status == 418 and _json(body) == {"error": "teapot"}
    writer.write(_request("POST", "/fast/stream"))
    status, headers, body = await _response(reader)
    assert status == 200 and headers["transfer-encoding"] == "chunked" and body == b"one,two,three"
    writer.write(_request("POST", "/fast/echo", b"after"))  # the connection is still in step
    assert _json((await _response(reader))[2])["body"] == "after"


async def test_a_handler_that_raises_gets_a_500_and_the_server_stays_up(served: tuple[_App, Connect]) -> None:
    _, connect = served
    reader, writer = await connect()
    writer.write(_request("POST", "/fast/raise"))
    status, headers, body = await _response(reader)
    assert status == 500 and body == b"Internal Server Error" and headers["connection"] == "close"
    assert await reader.read() == b""  # closed by the server
    reader, writer = await connect()
    writer.write(_request("POST", "/fast/echo", b"still up"))
    assert _json((await _response(reader))[2])["body"] == "still up"


async def test_expect_100_continue_and_http_1_0_take_uvicorn_s_own_path(served: tuple[_App, Connect]) -> None:
    app, connect = served
    reader, writer = await connect()
    request = _request("POST", "/fast/echo", b"body after 100", headers="Expect: 100-continue\r\n")
    head, body = request.split(b"\r\n\r\n")
    writer.write(head + b"\r\n\r\n")  # the body only once the server says so
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 100 Continue")
    writer.write(body)
    assert _json((await _response(reader))[2]) == {"via": "asgi", "path": "/fast/echo", "body": "body after 100"}
    reader, writer = await connect()
    writer.write(_request("POST", "/fast/echo", b"old", version="1.0"))
    status, headers, body = await _response(reader)
    assert status == 200 and _json(body)["via"] == "asgi" and headers["connection"] == "close"
    assert app.fast_calls == []


async def test_connection_close_is_honoured(served: tuple[_App, Connect]) -> None:
    _, connect = served
    reader, writer = await connect()
    writer.write(_request("POST", "/fast/echo", b"bye", headers="Connection: close\r\n"))
    status, headers, body = await _response(reader)
    assert status == 200 and headers["connection"] == "close" and _json(body)["via"] == "fast"
    assert await reader.read() == b""


async def test_a_client_that_leaves_mid_call_breaks_nothing(served: tuple[_App, Connect]) -> None:
    app, connect = served
    _, writer = await connect()
    writer.write(_request("POST", "/fast/slow", b"gone"))
    await asyncio.sleep(0.1)
    writer.close()
    await asyncio.sleep(0.1)
    app.release.set()
    for _ in range(50):
        if app.finished:
            break
        await asyncio.sleep(0.02)
    assert app.finished == ["/fast/slow"]  # the handler ran to its end (a gateway still records the call)
    reader, writer = await connect()
    writer.write(_request("POST", "/fast/echo", b"next"))
    assert _json((await _response(reader))[2])["body"] == "next"


@pytest.mark.parametrize("futures", [False, True])
async def test_shutdown_waits_for_the_fast_call_in_flight(futures: bool) -> None:
    app = _App(futures=futures)
    async with AsyncExitStack() as stack:
        url = await stack.enter_async_context(running_gateway(app))
        host, port = url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(_request("POST", "/fast/slow", b"in flight"))
        await asyncio.sleep(0.1)
        stopping = asyncio.create_task(stack.aclose())  # the server is asked to exit mid-call
        await asyncio.sleep(0.2)
        assert not stopping.done()
        app.release.set()
        status, headers, body = await _response(reader)
        assert status == 200 and _json(body)["body"] == "in flight" and headers["connection"] == "close"
        await asyncio.wait_for(stopping, 10)
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def test_keep_alive_closes_idle_connections_only() -> None:
    """One keep-alive timer per connection: an idle connection closes after the timeout; one in use,
    or waiting for a call longer than the timeout, stays open."""
    app = _App()
    timeout = 0.3
    async with running_gateway(app, timeout_keep_alive=timeout) as url:
        host, port = url.removeprefix("http://").split(":")
        busy_reader, busy = await asyncio.open_connection(host, int(port))
        idle_reader, idle = await asyncio.open_connection(host, int(port))
        idle.write(_request("POST", "/fast/echo", b"once"))
        assert (await _response(idle_reader))[0] == 200
        loop = asyncio.get_running_loop()
        start = loop.time()
        for i in range(8):  # 8 calls 0.1 s apart: busy for over twice the timeout
            busy.write(_request("POST", "/fast/echo", str(i).encode()))
            assert _json((await _response(busy_reader))[2])["body"] == str(i)
            await asyncio.sleep(0.1)
        assert loop.time() - start > 2 * timeout
        assert await asyncio.wait_for(idle_reader.read(), 1) == b""  # the idle one was closed
        # a call that takes longer than the timeout is not cut off
        busy.write(_request("POST", "/fast/slow", b"long"))
        loop.call_later(3 * timeout, app.release.set)
        status, _, body = await _response(busy_reader)
        assert status == 200 and _json(body)["body"] == "long"
        t0 = loop.time()
        assert await asyncio.wait_for(busy_reader.read(), 3) == b""  # then idle: closed after the timeout
        assert loop.time() - t0 >= timeout * 0.9
        busy.close()
        idle.close()


def test_freeze_startup_heap_freezes_and_raises_the_young_threshold() -> None:
    import gc

    from lightning_rl.gateway.server import freeze_startup_heap

    before = gc.get_threshold()
    try:
        freeze_startup_heap()
        assert gc.get_freeze_count() > 0  # the start-up heap is out of every later collection
        young, middle, old = gc.get_threshold()
        assert young >= 20_000 and (middle, old) == before[1:]
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
