"""A lean HTTP/1.1 keep-alive client for the gateway's non-streamed upstream calls.

Profiling the upstream mode showed ``httpx`` spending ~1 ms of CPU per forwarded call (URL
parsing, cookies, header models, h11 state machine): the biggest share of the gateway's overhead.
This client does only what the hot path needs: ``POST`` a JSON body over a pooled keep-alive
connection and read a ``Content-Length``, chunked or close-delimited response. Each connection is
a bare ``asyncio.Protocol`` that parses the response as bytes arrive and calls back once per call
(no stream reader, no future, no task, one timer), so a forwarded call costs the gateway a few
microseconds of Python on top of the two system calls; the gateway's non-streamed path chains its
own callback on it (``start``), ``post`` wraps it in a future. Everything else (streams, model
listing) still goes through ``httpx``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial
from typing import cast
from urllib.parse import urlsplit

__all__ = ["LeanHTTPClient", "OnDone"]

_MAX_HEAD = 64 * 1024


class _StaleConnection(ConnectionError):
    """A pooled connection the server had closed: nothing came back, so the call may be retried."""


OnDone = Callable[[int, bytes, BaseException | None], None]
"""Told how an exchange ended: ``(status, body, None)``, or ``(0, b"", error)``."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.reusable = False
        self._on_done: OnDone | None = None
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
        if self._on_done is None:
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
        if self._until_eof and self._on_done is not None and self._body_at >= 0:
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
    def send(self, request: bytes, timeout_s: float, on_done: OnDone) -> None:
        """Write ``request``; ``on_done`` is called once, synchronously, when the exchange ends."""
        assert self.transport is not None
        self._on_done = on_done
        self._buf = bytearray()
        self._body_at = -1
        self._length = None
        self._chunked = self._until_eof = False
        self._keep_alive = True
        self._received = False
        self._timer = asyncio.get_running_loop().call_later(timeout_s, self._timed_out, timeout_s)
        self.transport.write(request)

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
        on_done = self._finish()
        if on_done is not None:
            self.reusable = self.reusable and self._keep_alive
            on_done(self._status, body, None)

    def _fail(self, exc: BaseException) -> None:
        self.reusable = False
        on_done = self._finish()
        if self.transport is not None:
            self.transport.abort()
        if on_done is not None:
            on_done(0, b"", exc)

    def _finish(self) -> OnDone | None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        on_done, self._on_done = self._on_done, None
        self._buf = bytearray()
        return on_done

    def _timed_out(self, timeout_s: float) -> None:
        self._timer = None
        self._fail(TimeoutError(f"the upstream did not answer within {timeout_s} s"))

    def close(self) -> None:
        self.reusable = False
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        """Drop the connection now; the exchange in flight fails."""
        self._fail(ConnectionError("the upstream client was closed"))


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
        self._busy: set[_Connection] = set()
        self._connecting: set[asyncio.Task[None]] = set()
        self._closed = False

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        """Send ``body``; returns (status, response body). Raises ``OSError`` when the origin is unreachable."""
        future: asyncio.Future[tuple[int, bytes]] = asyncio.get_running_loop().create_future()
        self.start(path, body, partial(_resolve, future))
        return await future

    def start(self, path: str, body: bytes, on_done: OnDone) -> None:
        """Send ``body`` and return at once; ``on_done`` is called when the answer is in (or the call
        failed), from the connection's callback: on a pooled connection no task is involved.

        A call that was started always runs to its end (its answer is read, or the timeout closes
        the connection); a caller no longer interested ignores ``on_done``.
        """
        if self._closed:
            raise RuntimeError("this LeanHTTPClient is closed; create a new one.")
        request = f"POST {self.prefix}{path} HTTP/1.1\r\n{self._head}{len(body)}\r\n\r\n".encode() + body
        self._send(request, on_done)

    def _send(self, request: bytes, on_done: OnDone) -> None:
        while self._idle:  # a pooled connection may have been closed by the server meanwhile: retry fresh
            conn = self._idle.pop()
            if conn.reusable:
                self._busy.add(conn)
                conn.send(request, self.timeout_s, partial(self._settle, conn, request, on_done))
                return
            conn.close()
        task = asyncio.get_running_loop().create_task(self._connect_and_send(request, on_done))
        self._connecting.add(task)
        task.add_done_callback(self._connecting.discard)

    async def _connect_and_send(self, request: bytes, on_done: OnDone) -> None:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(min(self.timeout_s, 10.0)):
                _, conn = await loop.create_connection(_Connection, self.host, self.port)
        except (OSError, TimeoutError) as exc:
            on_done(0, b"", exc)
            return
        except asyncio.CancelledError:
            on_done(0, b"", ConnectionError("the upstream client was closed"))
            raise
        if self._closed:
            conn.close()
            on_done(0, b"", ConnectionError("the upstream client was closed"))
            return
        self._busy.add(conn)
        conn.send(request, self.timeout_s, partial(self._settle, conn, None, on_done))

    def _settle(
        self,
        conn: _Connection,
        request: bytes | None,
        on_done: OnDone,
        status: int,
        body: bytes,
        exc: BaseException | None,
    ) -> None:
        """An exchange ended: pool or close its connection, retry a stale pooled one, tell the caller."""
        self._busy.discard(conn)
        if exc is None and conn.reusable and not self._closed and len(self._idle) < self.max_idle:
            self._idle.append(conn)
        else:
            conn.close()
        if isinstance(exc, _StaleConnection) and request is not None and not self._closed:
            self._send(request, on_done)  # nothing came back: send it again, on another connection
            return
        on_done(status, body, exc)

    async def aclose(self) -> None:
        """Close every connection; calls still in flight fail with ``ConnectionError``."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        for conn in list(self._busy):
            conn.abort()
        for task in list(self._connecting):
            task.cancel()


def _resolve(future: asyncio.Future[tuple[int, bytes]], status: int, body: bytes, exc: BaseException | None) -> None:
    if future.done():
        return  # the caller was cancelled meanwhile
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result((status, body))
