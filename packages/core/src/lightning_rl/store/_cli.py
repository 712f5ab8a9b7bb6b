"""``lightning-rl store serve``: run a store server for runners on other processes or machines.

Kept free of heavy imports: FastAPI, uvicorn and the database drivers load only when the command
runs, so ``lightning-rl --help`` stays instant.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import ipaddress
import os
import sys
from typing import Any

__all__ = ["register", "is_loopback", "TOKEN_ENV"]

TOKEN_ENV = "LIGHTNING_STORE_TOKEN"
"""The store token's variable (``lightning_rl.credentials.STORE_TOKEN_ENV``; kept light to import)."""


def register(subparsers: Any) -> None:
    """Add ``store serve`` to the ``lightning-rl`` parser."""
    store: argparse.ArgumentParser = subparsers.add_parser("store", help="Run or manage a Lightning store.")
    sub = store.add_subparsers(dest="store_command", required=True, metavar="STORE_COMMAND")
    serve = sub.add_parser(
        "serve",
        help="Serve a store over HTTP (the store protocol and OTLP/HTTP at /v1/traces).",
        description="Serve a store over HTTP. Runners connect with StoreClient(url, token); OpenTelemetry "
        "exporters send spans to URL/v1/traces.",
    )
    serve.add_argument(
        "--backend", choices=("sqlite", "postgres", "redis", "memory"), default="sqlite", help="Storage backend."
    )
    serve.add_argument("--path", default="lightning-store.db", help="SQLite database file (--backend sqlite).")
    serve.add_argument(
        "--dsn", default=None, help="PostgreSQL DSN, e.g. postgresql://user@host/db (--backend postgres)."
    )
    serve.add_argument(
        "--schema", default=None, help="PostgreSQL schema for the tables, created if absent (default: public)."
    )
    serve.add_argument(
        "--redis-url",
        default=None,
        help="Redis URL, e.g. redis://host:6379/0 (--backend redis; default redis://127.0.0.1:6379/0). "
        "The server's persistence settings decide what survives a crash: see docs/stores.md.",
    )
    serve.add_argument(
        "--prefix", default=None, help="Redis key prefix, so one database can hold several stores (default lightning:)."
    )
    serve.add_argument("--host", default="127.0.0.1", help="Address to bind; anything but loopback needs --token.")
    serve.add_argument("--port", type=int, default=4747, help="Port to bind (0 picks a free one).")
    serve.add_argument(
        "--token-file",
        default=None,
        help=f"File holding the bearer token every request must carry (default: ${TOKEN_ENV}_FILE, else ${TOKEN_ENV}).",
    )
    serve.add_argument(
        "--token",
        default=None,
        help="The bearer token itself (visible in the process list: prefer --token-file or the variable).",
    )
    serve.set_defaults(handler=_serve)


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a hostname may resolve to a public address: treat it as exposed


def _serve(args: argparse.Namespace) -> int:
    from lightning_rl.credentials import resolve_token

    token = resolve_token(TOKEN_ENV, flag=args.token, flag_file=args.token_file)
    if not is_loopback(args.host) and not token:
        raise PermissionError(
            f"refusing to serve the store on {args.host} without a token: anyone who can reach it could read and "
            f"write your rollouts. Set {TOKEN_ENV} (or pass --token-file PATH), or bind 127.0.0.1."
        )
    if args.backend == "postgres" and not args.dsn:
        raise ValueError("--backend postgres needs --dsn postgresql://user@host:port/database.")
    missing = [
        m for m in ("fastapi", "uvicorn", "google.protobuf") if importlib.util.find_spec(m.split(".")[0]) is None
    ]
    if missing:
        raise ImportError(
            f"the store server needs {', '.join(missing)}: install the server extra, pip install 'lightning-rl[server]'"
        )
    where = args.redis_url if args.backend == "redis" else args.dsn
    schema = args.prefix if args.backend == "redis" else args.schema
    asyncio.run(_run(args.backend, args.path, where, schema, args.host, args.port, token))
    return 0


async def _run(
    backend: str, path: str, dsn: str | None, schema: str | None, host: str, port: int, token: str | None
) -> None:
    from lightning_rl.store import open_store
    from lightning_rl.store.base import LightningStore
    from lightning_rl.store.server import serve_store

    store: LightningStore
    if backend == "postgres":
        from lightning_rl.store.postgres import PostgresStore

        assert dsn is not None
        store = await PostgresStore.open(dsn, schema=schema)
        where = f"postgres (schema {schema or 'public'})"
    elif backend == "redis":
        from lightning_rl.store.redis import DEFAULT_URL, RedisStore

        redis = await RedisStore.open(dsn or DEFAULT_URL, prefix=schema)
        store, where = (
            redis,
            f"redis (prefix {redis.prefix!r}, appendonly {redis.server_settings.get('appendonly', '?')})",
        )
    elif backend == "memory":
        store, where = await open_store("memory://"), "memory (not durable)"
    else:
        store, where = await open_store(f"sqlite:///{path}"), f"sqlite {os.path.abspath(path)}"

    def ready(url: str) -> None:
        # Tests and scripts read this line to learn the port when --port 0.
        print(f"lightning-rl store: serving {where} at {url}", flush=True)
        print(f"lightning-rl store: OTLP/HTTP traces at {url}/v1/traces; Ctrl-C to stop", file=sys.stderr, flush=True)

    try:
        await serve_store(store, host=host, port=port, token=token, on_ready=ready)
    finally:
        await store.close()
