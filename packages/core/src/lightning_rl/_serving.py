"""HTTP serving details shared by the store server and the gateway.

uvicorn writes a response's head and body separately: two ``send`` calls and two wake-ups of the
client per response on loopback. ``http_protocol()`` is uvicorn's HTTP/1.1 protocol (httptools when
installed, else h11) wrapped so the head leaves together with the body written after it. uvicorn
is imported only when the protocol class is built.
"""

from __future__ import annotations

import asyncio
import importlib.util
from typing import Any, cast

__all__ = ["http_protocol"]


class _CoalescingTransport:
    """A transport that sends a response's head together with the body written after it.

    A write that starts a response (``HTTP/``) is held; the next write (the body, normally in the
    same loop step) sends both in one ``send``. If no body follows in this step (a stream whose
    first chunk comes later), the head leaves at the end of the step. Any other write goes out at
    once, after whatever is held, so the byte order never changes.
    """

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._buffer: list[bytes] = []
        self._loop = asyncio.get_running_loop()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if self._buffer:  # the held head: send it with this write, now
            self._buffer.append(bytes(data))
            self._flush()
        elif data[:5] == b"HTTP/":
            self._buffer.append(bytes(data))
            self._loop.call_soon(self._flush)
        else:
            self._transport.write(data)

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

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
    """uvicorn's HTTP/1.1 protocol (httptools when installed, else h11) with coalesced writes."""
    base: type[Any]
    if importlib.util.find_spec("httptools") is not None:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        base = HttpToolsProtocol
    else:
        from uvicorn.protocols.http.h11_impl import H11Protocol

        base = H11Protocol

    class _Coalescing(base):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            # no isinstance check: uvloop's transports do not subclass asyncio.Transport
            wrapped = _CoalescingTransport(cast(asyncio.Transport, transport))
            super().connection_made(cast(asyncio.Transport, wrapped))

    return cast(type[asyncio.Protocol], _Coalescing)
