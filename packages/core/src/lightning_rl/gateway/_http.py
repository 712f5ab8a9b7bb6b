"""A lean HTTP/1.1 keep-alive client for the gateway's non-streamed upstream calls.

Profiling the upstream mode showed ``httpx`` spending ~1 ms of CPU per forwarded call (URL
parsing, cookies, header models, h11 state machine): the biggest share of the gateway's overhead.
This client does only what the hot path needs: ``POST`` a JSON body over a pooled keep-alive
connection and read a ``Content-Length`` or chunked response. Everything else (streams, model
listing) still goes through ``httpx``.
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit

__all__ = ["LeanHTTPClient"]


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
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        """Send ``body``; returns (status, response body). Raises ``OSError`` when the origin is unreachable."""
        request = f"POST {self.prefix}{path} HTTP/1.1\r\n{self._head}{len(body)}\r\n\r\n".encode() + body
        while self._idle:  # a pooled connection may have been closed by the server meanwhile: retry fresh
            conn = self._idle.pop()
            try:
                return await asyncio.wait_for(self._exchange(conn, request), self.timeout_s)
            except (OSError, asyncio.IncompleteReadError, ValueError):
                conn[1].close()
        conn = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), min(self.timeout_s, 10.0))
        try:
            return await asyncio.wait_for(self._exchange(conn, request), self.timeout_s)
        except asyncio.IncompleteReadError as exc:
            conn[1].close()
            raise ConnectionError("the upstream closed the connection mid-response") from exc
        except BaseException:
            conn[1].close()
            raise

    async def _exchange(
        self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], request: bytes
    ) -> tuple[int, bytes]:
        reader, writer = conn
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length: int | None = None
        chunked = False
        keep_alive = True
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "transfer-encoding" and "chunked" in value.lower():
                chunked = True
            elif name == "connection" and "close" in value.lower():
                keep_alive = False
        if chunked:
            parts: list[bytes] = []
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
                if size == 0:
                    await reader.readuntil(b"\r\n")
                    break
                parts.append(await reader.readexactly(size))
                await reader.readexactly(2)
            data = b"".join(parts)
        elif length is not None:
            data = await reader.readexactly(length)
        else:
            data = await reader.read()
            keep_alive = False
        if keep_alive and len(self._idle) < self.max_idle:
            self._idle.append(conn)
        else:
            writer.close()
        return status, data

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for _, writer in idle:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
