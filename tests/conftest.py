"""Fixtures shared by every test folder.

``store`` runs a test once per store backend (memory, SQLite, PostgreSQL, Redis, the HTTP client in
front of a SQLite-backed server, and the toy backend of tests/core/store/toy_backend.py, which
implements only the storage primitives), which is how the backends are kept from drifting apart.
``postgres_dsn`` gives a PostgreSQL DSN: from ``LIGHTNING_TEST_POSTGRES_DSN`` when set (then it
must work: CI sets it), otherwise the local default, skipping only when that cannot connect.
``redis_url`` does the same for Redis (``LIGHTNING_TEST_REDIS_URL``), and ``redis_prefix`` gives each
test its own key prefix, deleted afterwards, so tests sharing one server never see each other's keys.
"""

from __future__ import annotations

import importlib.util
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lightning_rl.store.base import LightningStore
from lightning_rl.store.memory import MemoryStore

DEFAULT_POSTGRES_DSN = "postgresql://postgres@127.0.0.1:5432/test"
POSTGRES_ENV = "LIGHTNING_TEST_POSTGRES_DSN"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
REDIS_ENV = "LIGHTNING_TEST_REDIS_URL"

STORE_BACKENDS = [
    "memory",
    "sqlite",
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("redis", marks=pytest.mark.redis),
    "http",
    "toy",
]


def _probe_postgres(dsn: str) -> str | None:
    """None if ``dsn`` accepts a connection, else why not."""
    try:
        import psycopg
    except ImportError as exc:
        return f"psycopg is not installed ({exc}); install lightning-rl[postgres]"
    try:
        with psycopg.connect(dsn, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return f"cannot connect to PostgreSQL at {dsn}: {exc}".strip()
    return None


def _server_address(env: str, default: str, probe: Callable[[str], str | None]) -> str:
    """The address in ``env`` if it answers, else ``default`` if it answers. Fails (not skips) when
    ``env`` is set but unusable: CI sets it, and a broken server there must not pass as a skip."""
    address = os.environ.get(env)
    if address:
        problem = probe(address)
        if problem:
            pytest.fail(f"{env} is set but unusable: {problem}")
        return address
    problem = probe(default)
    if problem:
        pytest.skip(f"{env} is unset and the default address does not work: {problem}")
    return default


@pytest.fixture
def smollm2() -> None:
    """Skip the test unless the smollm2 extra (SmolLM2-135M-Instruct's GGUF file) is installed."""
    try:
        from lightning_rl.engine.smollm2 import smollm2_gguf_path

        smollm2_gguf_path()
    except (ImportError, FileNotFoundError) as exc:
        pytest.skip(f"the smollm2 extra is not installed: {exc}")


@pytest.fixture(scope="session")
def postgres_dsn() -> str:
    """A PostgreSQL DSN that works (see ``_server_address``)."""
    return _server_address(POSTGRES_ENV, DEFAULT_POSTGRES_DSN, _probe_postgres)


@pytest.fixture
def postgres_schema(postgres_dsn: str) -> Iterator[str]:
    """A fresh, empty PostgreSQL schema name for one test; dropped (with its tables) afterwards."""
    import psycopg
    from psycopg import sql

    name = f"lt_{uuid.uuid4().hex[:16]}"
    yield name
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def _probe_redis(url: str) -> str | None:
    """None if ``url`` answers PING, else why not."""
    try:
        import redis
    except ImportError as exc:
        return f"redis-py is not installed ({exc}); install lightning-rl[redis]"
    try:
        with redis.Redis.from_url(url, socket_connect_timeout=3) as client:
            client.ping()
    except redis.RedisError as exc:
        return f"cannot connect to Redis at {url}: {exc}".strip()
    return None


@pytest.fixture(scope="session")
def redis_url() -> str:
    """A Redis URL that works (see ``_server_address``)."""
    return _server_address(REDIS_ENV, DEFAULT_REDIS_URL, _probe_redis)


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    """A fresh key prefix for one test; every key under it is deleted afterwards."""
    import redis

    name = f"lt-{uuid.uuid4().hex[:16]}:"
    yield name
    with redis.Redis.from_url(redis_url) as client:
        keys = list(client.scan_iter(match=f"{name}*", count=1000))
        for start in range(0, len(keys), 1000):
            client.delete(*keys[start : start + 1000])


def _toy_backend() -> Any:
    """tests/core/store/toy_backend.py (test modules are not importable by name under importlib mode)."""
    path = Path(__file__).parent / "core" / "store" / "toy_backend.py"
    spec = importlib.util.spec_from_file_location("lightning_tests_toy_backend", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(params=STORE_BACKENDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[LightningStore]:
    """A fresh, empty store of each backend kind."""
    kind: str = request.param
    if kind == "memory":
        memory = MemoryStore()
        yield memory
        await memory.close()
    elif kind == "sqlite":
        from lightning_rl.store.sqlite import SQLiteStore

        sqlite = SQLiteStore(tmp_path / "store.db")
        yield sqlite
        await sqlite.close()
    elif kind == "postgres":
        from lightning_rl.store.postgres import PostgresStore

        dsn: str = request.getfixturevalue("postgres_dsn")
        schema: str = request.getfixturevalue("postgres_schema")
        pg = await PostgresStore.open(dsn, schema=schema)
        yield pg
        await pg.close()
    elif kind == "redis":
        from lightning_rl.store.redis import RedisStore

        url: str = request.getfixturevalue("redis_url")
        prefix: str = request.getfixturevalue("redis_prefix")
        rs = await RedisStore.open(url, prefix=prefix)
        yield rs
        await rs.close()
    elif kind == "toy":
        yield _toy_backend().ToyStore()
    else:
        try:
            from lightning_rl.store.client import StoreClient
            from lightning_rl.store.server import running_store_server
        except ImportError as exc:
            pytest.skip(f"HTTP store server/client not importable yet: {exc}")
        from lightning_rl.store.sqlite import SQLiteStore

        backend = SQLiteStore(tmp_path / "http-store.db")
        try:
            async with running_store_server(backend) as url:
                client = StoreClient(url)
                try:
                    yield client
                finally:
                    await client.close()
        finally:
            await backend.close()
