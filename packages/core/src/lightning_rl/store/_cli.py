"""``lightning-rl store serve``: run a store server for runners on other processes or machines.

Kept free of heavy imports: FastAPI, uvicorn and the database drivers load only when the command
runs, so ``lightning-rl --help`` stays instant.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

from lightning_rl.credentials import STORE_TOKEN_ENV as TOKEN_ENV

__all__ = ["register", "TOKEN_ENV"]


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


def _serve(args: argparse.Namespace) -> int:
    from lightning_rl.credentials import refuse_exposed_without_token, resolve_token
    from lightning_rl.extras import require_extra

    token = resolve_token(TOKEN_ENV, flag=args.token, flag_file=args.token_file)
    how = f"Set {TOKEN_ENV} (or pass --token-file PATH)"
    refuse_exposed_without_token(args.host, token, "the store", "read and write your rollouts", how)
    if args.backend == "postgres" and not args.dsn:
        raise ValueError("--backend postgres needs --dsn postgresql://user@host:port/database.")
    drivers = [args.backend] if args.backend in ("postgres", "redis") else []
    require_extra("server", *drivers, feature="lightning-rl store serve")
    asyncio.run(_run(args, token))
    return 0


async def _run(args: argparse.Namespace, token: str | None) -> None:
    from lightning_rl.store import open_store
    from lightning_rl.store.base import LightningStore
    from lightning_rl.store.server import serve_store

    store: LightningStore
    if args.backend == "postgres":
        from lightning_rl.store.postgres import PostgresStore

        store = await PostgresStore.open(args.dsn, schema=args.schema)
        where = f"postgres (schema {args.schema or 'public'})"
    elif args.backend == "redis":
        from lightning_rl.store.redis import DEFAULT_URL, RedisStore

        store = redis = await RedisStore.open(args.redis_url or DEFAULT_URL, prefix=args.prefix)
        where = f"redis (prefix {redis.prefix!r}, appendonly {redis.server_settings.get('appendonly', '?')})"
    elif args.backend == "memory":
        store, where = await open_store("memory://"), "memory (not durable)"
    else:
        store, where = await open_store(f"sqlite:///{args.path}"), f"sqlite {os.path.abspath(args.path)}"

    def ready(url: str) -> None:
        # Tests and scripts read this line to learn the port when --port 0.
        print(f"lightning-rl store: serving {where} at {url}", flush=True)
        print(f"lightning-rl store: OTLP/HTTP traces at {url}/v1/traces; Ctrl-C to stop", file=sys.stderr, flush=True)

    try:
        await serve_store(store, host=args.host, port=args.port, token=token, on_ready=ready)
    finally:
        await store.close()
