"""A reference for ``gateway_overhead.py --reference``: the least a Python proxy can do per call.

What any pure-Python gateway in front of the upstream must do at the very least, and nothing
more: parse the client's HTTP request (httptools), parse its JSON and write it again for the
upstream (asking for token ids and logprobs, as the gateway does), send it over a pooled keep-alive
connection, parse the upstream's JSON answer and write it again for the client, on uvloop. No
validation, no routing, no recording, no error handling beyond resending what a closed upstream
connection carried, no timeouts: not a server to use, a floor
to measure the real gateway against on the same host. Its added latency is what the host's
loopback TCP, event loop and JSON cost; the gateway's added latency above it is what validation,
recording and robustness cost.

    uv run python benchmarks/minimal_proxy.py PORT UPSTREAM_PORT   (prints READY when serving)
"""

from __future__ import annotations

import asyncio
import gc
import sys

import httptools
import orjson
import uvloop

__all__ = ["serve"]

_UPSTREAM_HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: upstream\r\nContent-Type: application/json\r\n"


class _Upstream(asyncio.Protocol):
    """One keep-alive connection to the upstream; answers carry a Content-Length."""

    def __init__(self, idle: list[_Upstream]) -> None:
        self.idle = idle
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.body = b""
        self.client: _Client | None = None  # whose request is in flight

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        # the upstream closes idle keep-alive connections: forget this one, resend what it carried
        if self in self.idle:
            self.idle.remove(self)
        if self.client is not None:
            self.client.forward(self.body)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        length = int(self.buf[:end].lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
        if len(self.buf) < end + 4 + length:
            return
        body, self.buf = self.buf[end + 4 : end + 4 + length], b""
        client, self.client = self.client, None
        self.idle.append(self)
        assert client is not None
        client.answer(body)

    def send(self, body: bytes, client: _Client) -> None:
        assert self.transport is not None
        self.client = client
        self.body = body
        self.transport.write(_UPSTREAM_HEAD + b"Content-Length: %d\r\n\r\n" % len(body) + body)


class _Client(asyncio.Protocol):
    """One client connection: each request is forwarded, each answer written back in order."""

    def __init__(self, upstream_port: int, idle: list[_Upstream]) -> None:
        self.upstream_port = upstream_port
        self.idle = idle
        self.parser = httptools.HttpRequestParser(self)
        self.chunks: list[bytes] = []
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        request = orjson.loads(b"".join(self.chunks))
        self.chunks = []
        request["return_token_ids"] = True
        request["logprobs"] = True
        self.forward(orjson.dumps(request))

    def forward(self, body: bytes) -> None:
        while self.idle:
            upstream = self.idle.pop()
            if upstream.transport is not None and not upstream.transport.is_closing():
                upstream.send(body, self)
                return
        asyncio.ensure_future(self._connect_and_send(body))

    async def _connect_and_send(self, body: bytes) -> None:
        loop = asyncio.get_running_loop()
        _, upstream = await loop.create_connection(lambda: _Upstream(self.idle), "127.0.0.1", self.upstream_port)
        upstream.send(body, self)

    def answer(self, body: bytes) -> None:
        response = orjson.loads(body)
        response["id"] = "chatcmpl-reference"
        out = orjson.dumps(response)
        assert self.transport is not None
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(out)
        self.transport.write(head + out)


async def serve(port: int, upstream_port: int) -> None:
    idle: list[_Upstream] = []
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Client(upstream_port, idle), "127.0.0.1", port)
    gc.collect()
    gc.freeze()  # as the gateway's CLI does
    print("READY", flush=True)
    await server.serve_forever()


if __name__ == "__main__":
    uvloop.run(serve(int(sys.argv[1]), int(sys.argv[2])))
