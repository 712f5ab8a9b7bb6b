"""A lean HTTP/1.1 keep-alive client for the gateway's non-streamed upstream calls.

Profiling the upstream mode showed ``httpx`` spending ~1 ms of CPU per forwarded call (URL
parsing, cookies, header models, h11 state machine): the biggest share of the gateway's overhead.
This client does only what the hot path needs: ``POST`` a JSON body over a pooled keep-alive
connection and read a ``Content-Length``, chunked or close-delimited response. Each connection is
a bare ``asyncio.Protocol`` that parses the response as bytes arrive and reports to its client
once per call (``start``): no stream reader, future, task or timer per call (one sweep per client
checks the deadlines), so a forwarded call costs a few microseconds of Python on top of the two
system calls; an answer that arrives in one read is sliced out of it, uncopied. Everything else
(streams, model listing) still goes through ``httpx``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial
from typing import TypeVar, cast
from urllib.parse import urlsplit

__all__ = ["LeanHTTPClient", "OnDone", "resolve"]

_T = TypeVar("_T")
_MAX_HEAD = 64 * 1024
_SWEEP_S = 1.0
"""Longest interval between two deadline checks (shorter for short timeouts: a quarter of it)."""


class _StaleConnection(ConnectionError):
    """A pooled connection the server had closed: nothing came back, so the call may be retried."""


OnDone = Callable[[int, bytes, BaseException | None], None]
"""Told how an exchange ended: ``(status, body, None)``, or ``(0, b"", error)``."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time; it reports to ``client``."""

    def __init__(self, client: LeanHTTPClient) -> None:
        self.client = client
        self.transport: asyncio.Transport | None = None
        self.reusable = False
        self.deadline = 0.0
        self.request: bytes | None = None  # kept while in flight on a pooled connection: resent if stale
        self.on_done: OnDone | None = None
        self._buf = b""  # the head, until it is complete
        self._parts: list[bytes] = []  # the body's pieces so far (sized and close-delimited answers)
        self._got = 0  # bytes of body in _parts
        self._chunked_buf = bytearray()
        self._status = 0
        self._head_done = False
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
        if self.on_done is None:
            self.reusable = False  # bytes nobody asked for: this connection is out of step
            return
        self._received = True
        try:
            if not self._head_done:
                if self._buf:
                    data = self._buf + data
                end = data.find(b"\r\n\r\n")
                if end < 0:
                    if len(data) > _MAX_HEAD:
                        raise ValueError("response head too large")
                    self._buf = data
                    return
                self._buf = b""
                self._head(data[:end])
                data = data[end + 4 :]
            self._body(data)
        except (ValueError, IndexError) as exc:
            self._fail(ConnectionError(f"the upstream sent a malformed HTTP response ({exc})"))

    def eof_received(self) -> bool | None:
        self.reusable = False
        if self._until_eof and self.on_done is not None and self._head_done:
            self._done(b"".join(self._parts))
        return None  # let the transport close itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        if self._until_eof and exc is None and self._head_done:
            self._done(b"".join(self._parts))
        elif not self._received:
            self._fail(_StaleConnection(f"the upstream closed the connection ({exc or 'EOF'})"))
        else:
            self._fail(ConnectionError(f"the upstream closed the connection mid-response ({exc or 'EOF'})"))

    # --- one exchange -----------------------------------------------------------------------
    def send(self, request: bytes, deadline: float, on_done: OnDone, resend: bool) -> None:
        """Write ``request``; ``on_done`` is called once, synchronously, when the exchange ends
        (``deadline``, in loop time, is enforced by the client's sweep)."""
        assert self.transport is not None
        self.on_done = on_done
        self.deadline = deadline
        self.request = request if resend else None
        self._head_done = self._chunked = self._until_eof = self._received = False
        self._keep_alive = True
        self._length = None
        self.transport.write(request)

    def _head(self, head: bytes) -> None:
        """Status and framing from the response head (header names matched case-insensitively)."""
        status_line, _, _ = head.partition(b"\r\n")
        self._status = status = int(status_line.split(None, 2)[1])
        low = head.lower()
        length = _field(low, b"\r\ncontent-length:")
        if length is not None:
            self._length = int(length)
        encoding = _field(low, b"\r\ntransfer-encoding:")
        if encoding is not None and b"chunked" in encoding:
            self._chunked = True
        connection = _field(low, b"\r\nconnection:")
        if connection is not None and b"close" in connection:
            self._keep_alive = False
        if status in (204, 304) or status < 200:
            self._length, self._chunked = 0, False  # no body, whatever the headers say
        elif self._chunked:
            self._length = None
            self._chunked_buf = bytearray()
        elif self._length is None:
            self._until_eof = True
            self._keep_alive = False
        self._head_done = True
        self._parts = []
        self._got = 0

    def _body(self, data: bytes) -> None:
        length = self._length
        if length is not None:
            got = self._got + len(data)
            if got < length:
                if data:
                    self._parts.append(data)
                    self._got = got
                return
            if got > length:
                self._keep_alive = False  # extra bytes: this connection is out of step
                data = data[: length - self._got]
            body = data if not self._parts else b"".join([*self._parts, data])
            self._done(body)
        elif self._chunked:
            self._chunked_buf += data
            body = self._dechunk()
            if body is not None:
                self._done(body)
        elif data:  # close-delimited
            self._parts.append(data)

    def _dechunk(self) -> bytes | None:
        """The whole chunked body once its last chunk arrived, else ``None``."""
        buf = self._chunked_buf
        pos = 0
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
            self.client.settle(self, on_done, self._status, body, None)

    def _fail(self, exc: BaseException) -> None:
        self.reusable = False
        on_done = self._finish()
        if self.transport is not None:
            self.transport.abort()
        if on_done is not None:
            self.client.settle(self, on_done, 0, b"", exc)

    def _finish(self) -> OnDone | None:
        on_done, self.on_done = self.on_done, None
        self._buf = b""
        self._parts = []
        return on_done

    def timed_out(self, timeout_s: float) -> None:
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
        fixed = f"Host: {host_header}\r\n{extra}".replace("%", "%%")  # %-formatted per call below
        self._request_head = f"POST {self.prefix.replace('%', '%%')}%s HTTP/1.1\r\n{fixed}"
        self._request_head += "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        self.timeout_s = timeout_s
        self.max_idle = max_idle
        self._sweep_s = min(_SWEEP_S, timeout_s / 4)
        self._idle: list[_Connection] = []
        self._busy: set[_Connection] = set()
        self._connecting: set[asyncio.Task[None]] = set()
        self._sweep: asyncio.TimerHandle | None = None
        self._closed = False

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        """Send ``body``; returns (status, response body). Raises ``OSError`` when the origin is unreachable."""
        future: asyncio.Future[tuple[int, bytes]] = asyncio.get_running_loop().create_future()
        self.start(path, body, lambda status, data, exc: resolve(future, (status, data), exc))
        return await future

    def start(self, path: str, body: bytes, on_done: OnDone) -> None:
        """Send ``body`` and return at once; ``on_done`` is called from the connection's callback when
        the answer is in or the call failed (no task on a pooled connection). A started call always
        runs to its end (read, or closed by the timeout); a caller no longer interested ignores it."""
        if self._closed:
            raise RuntimeError("this LeanHTTPClient is closed; create a new one.")
        self._send((self._request_head % (path, len(body))).encode() + body, on_done)

    def _send(self, request: bytes, on_done: OnDone) -> None:
        while self._idle:  # a pooled connection may have been closed by the server meanwhile: retry fresh
            conn = self._idle.pop()
            if conn.reusable:
                self._dispatch(conn, request, on_done, True)
                return
            conn.close()
        task = asyncio.get_running_loop().create_task(self._connect_and_send(request, on_done))
        self._connecting.add(task)
        task.add_done_callback(self._connecting.discard)

    def _dispatch(self, conn: _Connection, request: bytes, on_done: OnDone, resend: bool) -> None:
        loop = asyncio.get_running_loop()
        self._busy.add(conn)
        if self._sweep is None:
            self._sweep = loop.call_later(self._sweep_s, self._check_deadlines)
        conn.send(request, loop.time() + self.timeout_s, on_done, resend)

    async def _connect_and_send(self, request: bytes, on_done: OnDone) -> None:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(min(self.timeout_s, 10.0)):
                _, conn = await loop.create_connection(partial(_Connection, self), self.host, self.port)
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
        self._dispatch(conn, request, on_done, False)

    def _check_deadlines(self) -> None:
        """The sweep: fail the calls past their deadline; runs while any call is in flight."""
        self._sweep = None
        if not self._busy:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        for conn in [c for c in self._busy if c.deadline <= now]:
            conn.timed_out(self.timeout_s)
        if self._busy and not self._closed:
            self._sweep = loop.call_later(self._sweep_s, self._check_deadlines)

    def settle(self, conn: _Connection, on_done: OnDone, status: int, body: bytes, exc: BaseException | None) -> None:
        """An exchange ended: pool or close its connection, retry a stale pooled one, tell the caller."""
        self._busy.discard(conn)
        request, conn.request = conn.request, None
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
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        for conn in list(self._busy):
            conn.abort()
        for task in list(self._connecting):
            task.cancel()


def _field(head: bytes, name: bytes) -> bytes | None:
    """The value of header ``name`` (``b"\\r\\nname:"``, lower case) in a lower-cased head, or ``None``."""
    at = head.find(name)
    if at < 0:
        return None
    start = at + len(name)
    end = head.find(b"\r\n", start)
    return head[start:] if end < 0 else head[start:end]


def resolve(future: asyncio.Future[_T], value: _T | None, exc: BaseException | None) -> None:
    """Settle ``future`` from a callback's ``(value, None)`` or ``(None, error)`` (unless its caller left)."""
    if future.done():
        return  # the caller was cancelled meanwhile
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(cast(_T, value))
