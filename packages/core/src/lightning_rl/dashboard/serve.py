"""Run the dashboard with uvicorn: in the foreground (the CLI) or inside a test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import uvicorn

from lightning_rl._serving import serving, stop_on_signals
from lightning_rl.dashboard._settings import find_run_dir, load_credit_settings
from lightning_rl.dashboard.app import DashboardState, create_dashboard_app
from lightning_rl.store import open_store

__all__ = ["running_dashboard", "serve_dashboard", "store_label"]


def store_label(url: str) -> str:
    """``url`` without a password, fit to show on a page."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


@contextlib.asynccontextmanager
async def running_dashboard(
    store_url: str,
    *,
    run_dir: Path | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    store_token: str | None = None,
    poll_s: float = 2.0,
) -> AsyncGenerator[str]:
    """Serve the dashboard of ``store_url`` in this event loop; yield its base URL (``port=0``: any free port).

    ``run_dir`` (default: the SQLite store's folder when it holds a run) gives the curves and the
    credit settings. The store is opened here and closed on exit.
    """
    run = run_dir if run_dir is not None else find_run_dir(store_url)
    if run is not None and not run.is_dir():
        raise FileNotFoundError(f"run folder {run} does not exist; pass --run with a trainer's run_dir.")
    settings = load_credit_settings(run)
    store = await open_store(store_url, token=store_token)
    try:
        state = DashboardState(store=store, store_label=store_label(store_url), settings=settings, run_dir=run)
        app = create_dashboard_app(state, token=token, poll_s=poll_s)
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan="on")
        async with serving(config, host, f"dashboard could not start on {host}:{port} (address in use?)") as started:
            yield started[0]
    finally:
        await store.close()


async def serve_dashboard(
    store_url: str,
    *,
    run_dir: Path | None = None,
    host: str = "127.0.0.1",
    port: int = 4748,
    token: str | None = None,
    store_token: str | None = None,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve until SIGINT or SIGTERM (``lightning-rl dashboard``)."""
    stop = asyncio.Event()
    stop_on_signals(stop.set)
    async with running_dashboard(
        store_url, run_dir=run_dir, host=host, port=port, token=token, store_token=store_token
    ) as url:
        if on_ready is not None:
            on_ready(url)
        await stop.wait()
