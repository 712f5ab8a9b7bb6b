"""Run a gateway (or any ASGI app) with uvicorn inside the current event loop.

Tests, examples and the trainer start a gateway next to their own async code; running uvicorn as a
task of the current loop (instead of a thread or a subprocess) keeps the engine, the store and the
agent on one loop and makes start-up and shutdown deterministic.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from typing import Any

__all__ = ["running_gateway"]


@asynccontextmanager
async def running_gateway(
    app: Any, host: str = "127.0.0.1", port: int = 0, **uvicorn_options: Any
) -> AsyncGenerator[str]:
    """Serve ``app`` on ``host:port`` (``port=0`` picks a free one) and yield its base URL.

    The URL has no ``/v1`` suffix: OpenAI clients take ``f"{url}/v1"``; a rollout's base URL is
    ``f"{url}/rollouts/{rollout_id}/attempts/{attempt_id}/v1"``.
    """
    import uvicorn

    options: dict[str, Any] = {"log_level": "warning", "access_log": False, "lifespan": "on"}
    options.update(uvicorn_options)
    config = uvicorn.Config(app, host=host, port=port, **options)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(), name=f"gateway-{host}:{port}")
    try:
        while not server.started:
            if task.done():
                task.result()  # raises the start-up error (port in use, lifespan failure)
                raise RuntimeError(f"the server on {host}:{port} stopped during start-up.")
            await asyncio.sleep(0.01)
        sockets = [s for srv in server.servers for s in srv.sockets]
        bound_port = sockets[0].getsockname()[1] if sockets else port
        shown = f"[{host}]" if ":" in host else host
        yield f"http://{shown}:{bound_port}"
    finally:
        server.should_exit = True
        await task
