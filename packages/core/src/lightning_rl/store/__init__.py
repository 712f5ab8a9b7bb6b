"""Where rollouts, attempts, spans and resources live.

``open_store(url)`` picks a backend from a URL: ``memory://``, a SQLite path or ``sqlite:///path``,
``postgresql://…``, ``redis://…`` (``rediss://`` for TLS; ``?prefix=`` sets the key prefix), or
``http(s)://…`` for a store server. Backends import their drivers lazily, so
``import lightning_rl.store`` stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from lightning_rl.store.base import LightningStore
from lightning_rl.store.memory import MemoryStore

if TYPE_CHECKING:
    from lightning_rl.store.client import StoreClient
    from lightning_rl.store.postgres import PostgresStore
    from lightning_rl.store.redis import RedisStore
    from lightning_rl.store.sqlite import SQLiteStore

__all__ = [
    "LightningStore",
    "MemoryStore",
    "SQLiteStore",
    "PostgresStore",
    "RedisStore",
    "StoreClient",
    "open_store",
]


_LAZY = {"SQLiteStore": "sqlite", "PostgresStore": "postgres", "RedisStore": "redis", "StoreClient": "client"}
"""Where the backends that import a driver live: loaded on first use."""


def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(name)
    return getattr(importlib.import_module(f"lightning_rl.store.{_LAZY[name]}"), name)


async def open_store(url: str, *, token: str | None = None) -> LightningStore:
    """Open a store from a URL or path (see the module docstring)."""
    if url in ("memory", "memory://"):
        return MemoryStore()
    if url.startswith(("http://", "https://")):
        from lightning_rl.store.client import StoreClient

        return StoreClient(url, token=token)
    if url.startswith(("postgresql://", "postgres://")):
        from lightning_rl.store.postgres import PostgresStore

        return await PostgresStore.open(url)
    if url.startswith(("redis://", "rediss://")):
        from lightning_rl.store.redis import RedisStore

        return await RedisStore.open(url)
    path = url.removeprefix("sqlite:///").removeprefix("sqlite://")
    from lightning_rl.store.sqlite import SQLiteStore

    return SQLiteStore(path)
