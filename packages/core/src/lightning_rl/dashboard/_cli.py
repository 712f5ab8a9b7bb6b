"""``lightning-rl dashboard`` and ``lightning-rl inspect``.

Kept free of heavy imports: FastAPI, uvicorn and rich load only when a command runs, so
``lightning-rl --help`` stays instant.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["register", "TOKEN_ENV"]

TOKEN_ENV = "LIGHTNING_DASHBOARD_TOKEN"
_STORE_HELP = (
    "The store: a SQLite path (runs/demo/store.sqlite), postgresql://…, or http://host:port of a store server."
)


def _store_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", required=True, help=_STORE_HELP)
    parser.add_argument(
        "--run",
        type=Path,
        default=None,
        help="The trainer's run folder (config.json, metrics.jsonl); default: the SQLite store's folder.",
    )
    parser.add_argument(
        "--store-token", default=None, help="Bearer token of a store server (default: $LIGHTNING_STORE_TOKEN)."
    )


def register(subparsers: Any) -> None:
    """Add ``dashboard`` and ``inspect`` to the ``lightning-rl`` parser."""
    dash: argparse.ArgumentParser = subparsers.add_parser(
        "dashboard",
        help="Serve a read-only web page of a store: rollouts, spans, transitions with credit, training curves.",
        description="Serve a read-only web page of a store. Open the printed URL in a browser.",
    )
    _store_args(dash)
    dash.add_argument("--host", default="127.0.0.1", help="Address to bind; anything but loopback needs --token.")
    dash.add_argument("--port", type=int, default=4748, help="Port to bind (0 picks a free one).")
    dash.add_argument("--token", default=None, help=f"Token the page must carry (default: ${TOKEN_ENV}).")
    dash.set_defaults(handler=_dashboard)

    insp: argparse.ArgumentParser = subparsers.add_parser(
        "inspect",
        help="The dashboard's views in the terminal: rollouts, rollout ID, transitions ID, tail.",
        description="Show a store's rollouts, a rollout's span tree and calls, its transitions with credit.",
    )
    sub = insp.add_subparsers(dest="inspect_command", required=True, metavar="VIEW")
    ro = sub.add_parser("rollouts", help="List rollouts, newest first, with filters.")
    _store_args(ro)
    ro.add_argument("--status", action="append", default=[], help="succeeded, failed, timed_out, … (repeatable).")
    ro.add_argument("--mode", choices=("train", "val", "test"), default=None)
    ro.add_argument("--reward-min", type=float, default=None)
    ro.add_argument("--reward-max", type=float, default=None)
    ro.add_argument("--model-version", type=int, default=None)
    ro.add_argument("--role", default=None)
    ro.add_argument("-q", "--search", default=None, help="Text in the id, task, error or responses.")
    ro.add_argument("--limit", type=int, default=30)
    ro.add_argument("--offset", type=int, default=0)
    one = sub.add_parser("rollout", help="One rollout: attempts, span tree, every model call, tools, signals.")
    _store_args(one)
    one.add_argument("rollout_id")
    one.add_argument("--full", action="store_true", help="Print prompts and responses whole (default: cut).")
    tr = sub.add_parser("transitions", help="The transitions the adapter builds, with AIR reward and advantage.")
    _store_args(tr)
    tr.add_argument("rollout_id")
    tail = sub.add_parser("tail", help="Follow rollouts as they finish (Ctrl-C to stop).")
    _store_args(tail)
    tail.add_argument("--interval", type=float, default=1.0, help="Seconds between polls.")
    tail.add_argument("--last", type=int, default=10, help="Show this many already-ended rollouts first.")
    insp.set_defaults(handler=_inspect)


def _need(modules: tuple[str, ...], extra: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ImportError(f"this command needs {', '.join(missing)}: pip install 'lightning-rl[{extra}]'")


def _dashboard(args: argparse.Namespace) -> int:
    from lightning_rl.credentials import refuse_exposed_without_token

    token: str | None = args.token or os.environ.get(TOKEN_ENV) or None
    how = f"Pass --token SECRET (or set {TOKEN_ENV})"
    refuse_exposed_without_token(args.host, token, "the dashboard", "read your prompts and rollouts", how)
    _need(("fastapi", "uvicorn"), "dashboard")
    from lightning_rl.dashboard.serve import serve_dashboard

    def ready(url: str) -> None:
        shown = f"{url}/?token={token}" if token else f"{url}/"
        print(f"lightning-rl dashboard: {args.store} at {shown}", flush=True)
        print("lightning-rl dashboard: read-only; Ctrl-C to stop", file=sys.stderr, flush=True)

    asyncio.run(
        serve_dashboard(
            args.store,
            run_dir=args.run,
            host=args.host,
            port=args.port,
            token=token,
            store_token=args.store_token or os.environ.get("LIGHTNING_STORE_TOKEN"),
            on_ready=ready,
        )
    )
    return 0


def _inspect(args: argparse.Namespace) -> int:
    _need(("rich",), "dashboard")
    from lightning_rl.dashboard._inspect import run_inspect

    return asyncio.run(run_inspect(args))
