"""A lean HTTP/1.1 keep-alive client for the gateway's non-streamed upstream calls.

Profiling the upstream mode showed ``httpx`` spending ~1 ms of CPU per forwarded call (URL
parsing, cookies, header models, h11 state machine): the biggest share of the gateway's overhead.
This client does only what the hot path needs: ``POST`` a JSON body over a pooled keep-alive
connection and read a ``Content-Length``, chunked or close-delimited response. Each connection is
a bare ``asyncio.Protocol`` that parses the response as bytes arrive and resolves one future per
call (no stream reader, no extra task, one timer), so a forwarded call costs the gateway a few
microseconds of Python on top of the two system calls. Everything else (streams, model listing)
still goes through ``httpx``.
"""

from __future__ import annotations

import asyncio
from typing import cast
from urllib.parse import urlsplit

__all__ = ["LeanHTTPClient"]

_MAX_HEAD = 64 * 1024


class _StaleConnection(ConnectionError):
    """A pooled connection the server had closed: nothing came back, so the call may be retried."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.reusable = False
        self._waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self._buf = bytearray()
        self._timer: asyncio.TimerHandle | None = None
        self._status = 0
        self._body_at = -1  # where the body starts in _buf once the head is parsed
        self._length: int | None = None
        self._chunked = False
        self._keep_alive = True
        self._until_eof = False
        self._received = False

    # --- asyncio.Protocol -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it
        self.reusable = True

    def data_received(self, data: bytes) -> None:
        if self._waiter is None or self._waiter.done():
            self.reusable = False  # bytes nobody asked for: this connection is out of step
            return
        self._received = True
        self._buf += data
        try:
            self._parse()
        except (ValueError, IndexError) as exc:
            self._fail(ConnectionError(f"the upstream sent a malformed HTTP response ({exc})"))

    def eof_received(self) -> bool | None:
        self.reusable = False
        if self._until_eof and self._waiter is not None and self._body_at >= 0:
            self._done(bytes(self._buf[self._body_at :]))
        return None  # let the transport close itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        if self._until_eof and exc is None and self._body_at >= 0:
            self._done(bytes(self._buf[self._body_at :]))
        elif not self._received:
            self._fail(_StaleConnection(f"the upstream closed the connection ({exc or 'EOF'})"))
        else:
            self._fail(ConnectionError(f"the upstream closed the connection mid-response ({exc or 'EOF'})"))

    # --- one exchange -----------------------------------------------------------------------
    def send(self, request: bytes, timeout_s: float) -> asyncio.Future[tuple[int, bytes]]:
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        self._waiter = loop.create_future()
        self._buf = bytearray()
        self._body_at = -1
        self._length = None
        self._chunked = self._until_eof = False
        self._keep_alive = True
        self._received = False
        self._timer = loop.call_later(timeout_s, self._timed_out, timeout_s)
        self.transport.write(request)
        return self._waiter

    def _parse(self) -> None:
        buf = self._buf
        if self._body_at < 0:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > _MAX_HEAD:
                    raise ValueError("response head too large")
                return
            self._head(bytes(buf[:end]))
            self._body_at = end + 4
        if self._length is not None:
            end = self._body_at + self._length
            if len(buf) >= end:
                self._keep_alive = self._keep_alive and len(buf) == end  # extra bytes: out of step
                self._done(bytes(buf[self._body_at : end]))
        elif self._chunked:
            body = self._dechunk()
            if body is not None:
                self._done(body)

    def _head(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        self._status = int(lines[0].split(" ", 2)[1])
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                self._length = int(value)
            elif name == "transfer-encoding" and "chunked" in value.lower():
                self._chunked = True
            elif name == "connection" and "close" in value.lower():
                self._keep_alive = False
        if self._status in (204, 304) or self._status < 200:
            self._length, self._chunked = 0, False  # no body, whatever the headers say
        elif self._chunked:
            self._length = None
        elif self._length is None:
            self._until_eof = True
            self._keep_alive = False

    def _dechunk(self) -> bytes | None:
        """The whole chunked body once its last chunk arrived, else ``None``."""
        buf = self._buf
        pos = self._body_at
        parts: list[bytes] = []
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                return None
            size = int(bytes(buf[pos:eol]).split(b";", 1)[0], 16)
            start = eol + 2
            if size == 0:
                end = buf.find(b"\r\n\r\n", eol)  # the empty trailer section
                return b"".join(parts) if end >= 0 else None
            if len(buf) < start + size + 2:
                return None
            parts.append(bytes(buf[start : start + size]))
            pos = start + size + 2

    def _done(self, body: bytes) -> None:
        waiter = self._finish()
        if waiter is not None:
            self.reusable = self.reusable and self._keep_alive
            waiter.set_result((self._status, body))

    def _fail(self, exc: BaseException) -> None:
        self.reusable = False
        waiter = self._finish()
        if waiter is not None:
            waiter.set_exception(exc)
        if self.transport is not None:
            self.transport.abort()

    def _finish(self) -> asyncio.Future[tuple[int, bytes]] | None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        waiter, self._waiter = self._waiter, None
        self._buf = bytearray()
        return waiter if waiter is not None and not waiter.done() else None

    def _timed_out(self, timeout_s: float) -> None:
        self._timer = None
        self._fail(TimeoutError(f"the upstream did not answer within {timeout_s} s"))

    def close(self) -> None:
        self.reusable = False
        if self.transport is not None:
            self.transport.close()


class LeanHTTPClient:
    """POST JSON to one ``http://host:port`` origin over pooled keep-alive connections."""

    def __init__(self, base_url: str, headers: dict[str, str], *, timeout_s: float, max_idle: int = 512) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or parts.hostname is None:
            raise ValueError("LeanHTTPClient serves plain http:// origins only")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/")
        host_header = f"{self.host}:{self.port}"
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items() if k.lower() != "content-type")
        self._head = f"Host: {host_header}\r\n{extra}Content-Type: application/json\r\nContent-Length: "
        self.timeout_s = timeout_s
        self.max_idle = max_idle
        self._idle: list[_Connection] = []

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        """Send ``body``; returns (status, response body). Raises ``OSError`` when the origin is unreachable."""
        request = f"POST {self.prefix}{path} HTTP/1.1\r\n{self._head}{len(body)}\r\n\r\n".encode() + body
        while self._idle:  # a pooled connection may have been closed by the server meanwhile: retry fresh
            conn = self._idle.pop()
            if not conn.reusable:
                conn.close()
                continue
            try:
                return await self._exchange(conn, request)
            except _StaleConnection:
                continue
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(min(self.timeout_s, 10.0)):
            _, conn = await loop.create_connection(_Connection, self.host, self.port)
        return await self._exchange(conn, request)

    async def _exchange(self, conn: _Connection, request: bytes) -> tuple[int, bytes]:
        try:
            result = await conn.send(request, self.timeout_s)
        except BaseException:  # timed out, cancelled, or the connection broke: never reuse it
            conn.close()
            raise
        if conn.reusable and len(self._idle) < self.max_idle:
            self._idle.append(conn)
        else:
            conn.close()
        return result

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
