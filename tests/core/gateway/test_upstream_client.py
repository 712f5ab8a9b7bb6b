"""The gateway's lean upstream HTTP client (``gateway._http.LeanHTTPClient``) over real sockets.

Every non-streamed upstream call goes through it, and its answer arrives through a callback (no
task per call), so what HTTP/1.1 allows an upstream to do must work here: Content-Length, chunked
and close-delimited bodies, bodiless statuses, keep-alive reuse, an idle connection the server
closed (retried on a fresh one, never surfaced), a server that dies mid-answer or never answers,
and a client closed while a call is in flight. The upstream is a scripted ``asyncio`` server.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from lightning_rl.gateway._http import LeanHTTPClient

Answer = Callable[[bytes, asyncio.StreamWriter], Awaitable[bool]]
"""Answers one request (its head and body already read); returns whether to keep the connection."""


@dataclass
class _Upstream:
    """A scripted HTTP/1.1 server: each request is answered by the next ``answers`` entry (the last repeats)."""

    answers: list[Answer]
    connections: int = 0
    requests: list[bytes] = field(default_factory=list[bytes])
    writers: list[asyncio.StreamWriter] = field(default_factory=list[asyncio.StreamWriter])
    url: str = ""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                body = await reader.readexactly(length)
                self.requests.append(head + body)
                answer = self.answers[min(len(self.requests) - 1, len(self.answers) - 1)]
                if not await answer(body, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def upstream() -> AsyncIterator[Callable[..., Awaitable[_Upstream]]]:
    servers: list[asyncio.Server] = []
    scripted: list[_Upstream] = []

    async def start(*answers: Answer) -> _Upstream:
        up = _Upstream(list(answers))
        server = await asyncio.start_server(up.handle, "127.0.0.1", 0)
        up.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        servers.append(server)
        scripted.append(up)
        return up

    yield start
    for up in scripted:
        for writer in up.writers:
            writer.close()
    for server in servers:
        server.close()
        await server.wait_closed()


def _sized(body: bytes, status: str = "200 OK") -> Answer:
    async def answer(_: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n".encode())
        writer.write(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        return True

    return answer


async def _echo(request: bytes, writer: asyncio.StreamWriter) -> bool:
    await asyncio.sleep(0.01)  # so concurrent calls overlap
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(request), request))
    return True


async def test_a_sized_answer_and_the_request_the_upstream_saw(upstream: Callable[..., Awaitable[_Upstream]]) -> None:
    up = await upstream(_sized(b'{"ok": true}'))
    client = LeanHTTPClient(up.url + "/prefix/", {"authorization": "Bearer k"}, timeout_s=5)
    assert await client.post("/v1/chat/completions", b'{"q": 1}') == (200, b'{"ok": true}')
    head, body = up.requests[0].split(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /prefix/v1/chat/completions HTTP/1.1"
    assert {"authorization: Bearer k", "Content-Type: application/json", "Content-Length: 8"} <= set(lines)
    assert body == b'{"q": 1}'
    await client.aclose()


async def test_keep_alive_reuses_one_connection(upstream: Callable[..., Awaitable[_Upstream]]) -> None:
    up = await upstream(_sized(b"{}"))
    client = LeanHTTPClient(up.url, {}, timeout_s=5)
    for _ in range(3):
        assert await client.post("/x", b"{}") == (200, b"{}")
    assert up.connections == 1 and len(up.requests) == 3
    await client.aclose()


async def test_a_chunked_answer_is_reassembled(upstream: Callable[..., Awaitable[_Upstream]]) -> None:
    async def chunked(_: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for piece in (b'{"a": ', b'"long ', b'value"}'):
            writer.write(b"%x;ext=1\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            await asyncio.sleep(0.01)  # the answer arrives in several reads
        writer.write(b"0\r\n\r\n")
        return True

    up = await upstream(chunked)
    client = LeanHTTPClient(up.url, {}, timeout_s=5)
    assert await client.post("/x", b"{}") == (200, b'{"a": "long value"}')
    assert await client.post("/x", b"{}") == (200, b'{"a": "long value"}')
    assert up.connections == 1  # a complete chunked answer leaves the connection reusable
    await client.aclose()


async def test_a_close_delimited_answer_and_a_fresh_connection_after_it(
    upstream: Callable[..., Awaitable[_Upstream]],
) -> None:
    async def until_close(_: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{"done": 1}')
        return False  # the server closes: that ends the body

    up = await upstream(until_close)
    client = LeanHTTPClient(up.url, {}, timeout_s=5)
    assert await client.post("/x", b"{}") == (200, b'{"done": 1}')
    assert await client.post("/x", b"{}") == (200, b'{"done": 1}')
    assert up.connections == 2
    await client.aclose()


async def test_bodiless_statuses_and_error_statuses_are_answers(upstream: Callable[..., Awaitable[_Upstream]]) -> None:
    async def no_content(_: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        return True

    up = await upstream(no_content, _sized(b'{"error": {"message": "boom"}}', "500 Internal Server Error"))
    client = LeanHTTPClient(up.url, {}, timeout_s=5)
    assert await client.post("/x", b"{}") == (204, b"")
    assert await client.post("/x", b"{}") == (500, b'{"error": {"message": "boom"}}')
    assert up.connections == 1
    await client.aclose()


async def test_an_idle_connection_the_server_closed_is_retried_on_a_new_one(
    upstream: Callable[..., Awaitable[_Upstream]],
) -> None:
    up = await upstream(_sized(b"{}"))
    client = LeanHTTPClient(up.url, {}, timeout_s=5)
    assert await client.post("/x", b"{}") == (200, b"{}")
    up.writers[0].close()  # the upstream drops the idle keep-alive connection
    await asyncio.sleep(0.05)
    assert await client.post("/x", b"{}") == (200, b"{}")  # never surfaced to the caller
    assert up.connections == 2
    await client.aclose()


async def test_a_server_that_dies_mid_answer_is_a_connection_error(
    upstream: Callable[..., Awaitable[_Upstream]],
) -> None:
    async def half(_: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"partial')
        await writer.drain()
        return False

    up = await upstream(half)
    client = LeanHTTPClient(up.url, {}, timeout_s=5)
    with pytest.raises(ConnectionError, match="mid-response"):
        await client.post("/x", b"{}")
    await client.aclose()


async def test_a_malformed_answer_is_a_connection_error(upstream: Callable[..., Awaitable[_Upstream]]) -> None:
    async def garbage(_: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"garbage\r\n\r\n")
        return True

    up = await upstream(garbage)
    client = LeanHTTPClient(up.url, {}, timeout_s=5)
    with pytest.raises(ConnectionError, match="malformed"):
        await client.post("/x", b"{}")
    await client.aclose()


async def test_a_silent_upstream_times_out(upstream: Callable[..., Awaitable[_Upstream]]) -> None:
    async def silent(_: bytes, writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(30)
        return False

    up = await upstream(silent)
    client = LeanHTTPClient(up.url, {}, timeout_s=0.2)
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(TimeoutError):
        await client.post("/x", b"{}")
    assert loop.time() - start < 2
    await client.aclose()


async def test_nothing_listening_is_an_os_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    client = LeanHTTPClient(f"http://127.0.0.1:{port}", {}, timeout_s=5)
    with pytest.raises(OSError):
        await client.post("/x", b"{}")
    await client.aclose()


async def test_start_calls_back_once(upstream: Callable[..., Awaitable[_Upstream]]) -> None:
    up = await upstream(_sized(b"{}"))
    client = LeanHTTPClient(up.url, {}, timeout_s=5)
    calls: list[tuple[int, bytes, BaseException | None]] = []
    for _ in range(2):  # the first call opens the connection, the second reuses it (no task)
        done = asyncio.Event()

        def on_done(status: int, body: bytes, exc: BaseException | None) -> None:
            calls.append((status, body, exc))
            done.set()  # noqa: B023  (each call waits for its own event before the next starts)

        client.start("/x", b"{}", on_done)
        await asyncio.wait_for(done.wait(), 5)
    await asyncio.sleep(0.05)
    assert calls == [(200, b"{}", None), (200, b"{}", None)]
    await client.aclose()


async def test_concurrent_calls_get_their_own_answers(upstream: Callable[..., Awaitable[_Upstream]]) -> None:
    up = await upstream(_echo)
    client = LeanHTTPClient(up.url, {}, timeout_s=5)
    bodies = [b'{"i": %d}' % i for i in range(20)]
    answers = await asyncio.gather(*(client.post("/x", b) for b in bodies))
    assert answers == [(200, b) for b in bodies]
    assert up.connections <= 20
    again = await asyncio.gather(*(client.post("/x", b) for b in bodies))  # from the pool now
    assert again == answers and up.connections <= 20
    await client.aclose()


async def test_closing_fails_the_calls_in_flight_and_refuses_new_ones(
    upstream: Callable[..., Awaitable[_Upstream]],
) -> None:
    async def held(_: bytes, writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(30)
        return False

    up = await upstream(_sized(b"{}"), held)
    client = LeanHTTPClient(up.url, {}, timeout_s=60)
    assert await client.post("/x", b"{}") == (200, b"{}")  # a pooled connection, then a held call on it
    in_flight = asyncio.create_task(client.post("/x", b"{}"))
    await asyncio.sleep(0.1)
    await client.aclose()
    with pytest.raises(ConnectionError, match="closed"):
        await asyncio.wait_for(in_flight, 2)
    with pytest.raises(RuntimeError, match="closed"):
        await client.post("/x", b"{}")
