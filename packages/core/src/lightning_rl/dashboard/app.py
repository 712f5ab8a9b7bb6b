"""The dashboard's web server: a read-only JSON API over a store plus the page that renders it.

The page (``static/``: one HTML file, one script, one stylesheet, no third-party code) ships inside
the wheel and is served from here, so nothing is fetched from a CDN at run time. Every ``/api``
route reads; nothing writes to the store. With a token (required off loopback, as for the store
server) the API wants ``Authorization: Bearer <token>``; the page passes on the ``?token=`` it was
opened with, so the URL the command prints is the whole login.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Annotated, Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from lightning_rl._serving import BearerAuth
from lightning_rl.dashboard._settings import CreditSettings
from lightning_rl.dashboard.index import RolloutFilter, RolloutIndex
from lightning_rl.dashboard.views import rollout_detail
from lightning_rl.errors import LightningError, http_status
from lightning_rl.store.base import LightningStore

__all__ = ["DashboardState", "create_dashboard_app", "read_metrics", "CURVE_KEYS", "static_dir"]

CURVE_KEYS: tuple[tuple[str, str], ...] = (
    ("train/reward_mean", "reward (train, mean)"),
    ("val/reward_mean", "held-out reward"),
    ("train/loss", "loss"),
    ("train/kl_to_start", "KL to the start policy"),
    ("train/entropy", "policy entropy"),
    ("train/tool_call_rate", "tool-call rate (train)"),
)
"""Metrics plotted on the curves view, with their titles (``metrics.jsonl`` keys)."""


def static_dir() -> Path:
    """The folder of the page's files inside the installed package."""
    return Path(str(files("lightning_rl.dashboard") / "static"))


@dataclass
class DashboardState:
    """What the routes read: the store, its index, the run folder and the credit settings."""

    store: LightningStore
    store_label: str
    """The store's address with any password removed (shown on the page)."""
    settings: CreditSettings
    run_dir: Path | None
    index: RolloutIndex = field(init=False)
    _metrics: tuple[int, list[dict[str, float | None]]] = (0, [])

    def __post_init__(self) -> None:
        self.index = RolloutIndex(self.store, history_in_background=True)

    def metrics(self) -> list[dict[str, float | None]]:
        """``metrics.jsonl`` of the run folder, re-read only from where the last read stopped."""
        if self.run_dir is None:
            return []
        offset, rows = self._metrics
        new_offset, new_rows = read_metrics(self.run_dir / "metrics.jsonl", offset)
        if new_offset < offset:  # the file was replaced (a new run in the same folder)
            rows = []
        self._metrics = (new_offset, rows + new_rows)
        return self._metrics[1]


def read_metrics(path: Path, offset: int = 0) -> tuple[int, list[dict[str, float | None]]]:
    """Complete lines of ``path`` after byte ``offset``; returns the new offset and the parsed rows.

    A line still being written (no newline yet) is left for the next read. NaN/inf become None so the
    rows are valid JSON for the page. A file that shrank is read again from the start.
    """
    if not path.exists():
        return 0, []
    size = path.stat().st_size
    if size < offset:
        offset = 0
    with path.open("rb") as fh:
        fh.seek(offset)
        data = fh.read()
    end = data.rfind(b"\n") + 1
    rows: list[dict[str, float | None]] = []
    for line in data[:end].splitlines():
        if not line.strip():
            continue
        try:
            raw: Any = json.loads(line)
        except ValueError:
            continue
        if isinstance(raw, dict):
            rows.append(
                {
                    str(k): (float(v) if isinstance(v, int | float) and math.isfinite(v) else None)
                    for k, v in raw.items()  # pyright: ignore[reportUnknownVariableType]
                }
            )
    return offset + end, rows


def _refusal(_sent: bool) -> bytes:
    return json.dumps(
        {"detail": "missing or wrong token: open the URL that `lightning-rl dashboard` printed."}
    ).encode()


def create_dashboard_app(state: DashboardState, *, token: str | None = None, poll_s: float = 2.0) -> FastAPI:
    """The dashboard as an ASGI app. ``poll_s``: how often the page refreshes live views."""

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncGenerator[None]:
        await state.index.refresh(force=True)
        state.index.start_span_indexing()
        try:
            yield
        finally:
            await state.index.close()

    app = FastAPI(title="Lightning dashboard", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)

    @app.exception_handler(LightningError)
    async def _lightning_error(_request: Request, exc: LightningError) -> Response:  # pyright: ignore[reportUnusedFunction]
        return JSONResponse({"detail": str(exc), "kind": type(exc).__name__}, status_code=http_status(exc))

    @app.get("/api/info")
    async def info() -> dict[str, Any]:  # pyright: ignore[reportUnusedFunction]
        await state.index.refresh()
        return {
            "store": state.store_label,
            "run_dir": str(state.run_dir) if state.run_dir else None,
            "settings": state.settings.to_json(),
            "rollouts": len(state.index.rows),
            "span_progress": {"indexed": state.index.indexed, "known": len(state.index.rows)},
            "history_complete": state.index.history_complete,
            "poll_s": poll_s,
        }

    @app.get("/api/rollouts")
    async def rollouts(  # pyright: ignore[reportUnusedFunction]
        status: Annotated[list[str] | None, Query()] = None,
        mode: str | None = None,
        reward_min: float | None = None,
        reward_max: float | None = None,
        model_version: int | None = None,
        role: str | None = None,
        q: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> dict[str, Any]:
        statuses = frozenset(s for item in status or [] for s in item.split(",") if s)
        flt = RolloutFilter(
            status=statuses,
            mode=mode or None,
            reward_min=reward_min,
            reward_max=reward_max,
            model_version=model_version,
            role=role or None,
            q=q or None,
        )
        page = await state.index.page(flt, limit=limit, offset=offset)
        return page.to_json()

    @app.get("/api/rollouts/{rollout_id}")
    async def rollout(rollout_id: str) -> dict[str, Any]:  # pyright: ignore[reportUnusedFunction]
        return await rollout_detail(state.store, rollout_id, state.settings)

    @app.get("/api/curves")
    async def curves() -> dict[str, Any]:  # pyright: ignore[reportUnusedFunction]
        rows = state.metrics()
        series: list[dict[str, Any]] = []
        for key, title in CURVE_KEYS:
            points = [[r["step"], r[key]] for r in rows if r.get(key) is not None and r.get("step") is not None]
            series.append({"key": key, "title": title, "points": points})
        return {"run_dir": str(state.run_dir) if state.run_dir else None, "series": series, "rows": len(rows)}

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:  # pyright: ignore[reportUnusedFunction]
        return FileResponse(static_dir() / "index.html", headers={"Cache-Control": "no-cache"})

    app.mount("/static", StaticFiles(directory=static_dir()), name="static")
    if token:
        # 401 on the API only: the page and its scripts load without a token, then send the one in the URL
        app.add_middleware(BearerAuth, token=token, refusal=_refusal, guards=lambda path: path.startswith("/api"))
    return app
