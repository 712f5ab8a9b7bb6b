"""Run a real HTTP server (uvicorn, 127.0.0.1) in a background thread for the synchronous fuzzers.

Hypothesis and schemathesis drive requests synchronously; the servers are asyncio apps. Each gets
its own event loop in a thread, started by an async context manager factory (``running_store_server``,
``running_gateway`` ...), and stops when the ``with`` block ends.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from typing import Any, TypeVar

__all__ = ["served_in_thread", "BackgroundLoop"]

T = TypeVar("T")


class BackgroundLoop:
    """An event loop in a daemon thread; ``run(coro)`` waits for a coroutine's result from any thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@contextmanager
def served_in_thread(factory: Callable[[], AbstractAsyncContextManager[T]]) -> Iterator[tuple[T, BackgroundLoop]]:
    """Enter ``factory()`` on a background loop; yield what it yields (a URL) and the loop."""
    bg = BackgroundLoop()
    started: asyncio.Queue[T] = asyncio.Queue()
    stop = asyncio.Event()

    async def hold() -> None:
        async with factory() as value:
            await started.put(value)
            await stop.wait()

    async def _get() -> T:
        return await started.get()

    async def make_primitives() -> None:
        nonlocal started, stop
        started, stop = asyncio.Queue(), asyncio.Event()

    bg.run(make_primitives())
    task = asyncio.run_coroutine_threadsafe(hold(), bg.loop)
    try:
        value = bg.run(_get(), 60)
        yield value, bg
    finally:
        bg.loop.call_soon_threadsafe(stop.set)
        task.result(60)
        bg.close()
