"""The services one APO run needs: a store, the gateway in front of the agent's model, a runner.

APO changes no weights, so unlike the trainer it needs no policy backend: only the ordinary
rollout path. The agent's model is either the embedded engine (``APOConfig.model``, e.g. ``tiny``,
offline) or any OpenAI-compatible server behind the gateway (``APOConfig.llm_base_url``, e.g. a
hosted model or vLLM); either way every model call of a rollout is recorded as spans, which is
what the optimiser later reads. The in-process runner claims rollouts from the store like any
other runner, ``concurrency`` at a time, so the candidates of a round run side by side.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_rl.agent import AgentFn
from lightning_rl.store.base import LightningStore

if TYPE_CHECKING:
    from lightning_rl.algorithms.apo import APOConfig

__all__ = ["APOServices", "start_apo_services"]


@dataclass
class APOServices:
    """What the APO loop talks to while it runs."""

    store: LightningStore
    gateway: Any
    """The gateway's state object (its recorder and span writer)."""
    gateway_url: str
    """The gateway root (agents get ``<root>/rollouts/.../v1``; plain calls use ``<root>/v1``)."""
    model_name: str
    """The model name the gateway serves to the agent."""

    async def flush_spans(self, timeout_s: float = 60.0) -> None:
        """Wait until every model call the gateway served so far is recorded in the store."""
        if self.gateway.writer is not None:
            await self.gateway.writer.flush(timeout=timeout_s)


def _backend(config: APOConfig) -> tuple[Any, Any]:
    """The gateway backend for the agent's model, and the engine to close afterwards (or None)."""
    if config.llm_base_url:
        from lightning_rl.gateway import UpstreamBackend

        return UpstreamBackend(config.llm_base_url, config.resolved_llm_api_key(), model=config.llm_model), None
    from lightning_rl.engine.hf import TransformersEngine
    from lightning_rl.engine.models import resolve_model, served_model_name

    engine = TransformersEngine.from_pretrained(
        resolve_model(config.model),
        device=config.device,
        max_batch_size=max(1, config.concurrency),
        model_name=served_model_name(config.model),
    )
    return engine, engine


@contextlib.asynccontextmanager
async def start_apo_services(
    config: APOConfig, agent: AgentFn, store: LightningStore | None = None
) -> AsyncGenerator[APOServices]:
    """Start the store (SQLite in ``run_dir`` unless ``store`` is given), the gateway and the runner.

    A ``store`` passed in is used as is and not closed (the caller owns it).
    """
    from lightning_rl.gateway import create_gateway_app, running_gateway
    from lightning_rl.runner import Runner

    own_store = store is None
    if store is None:
        from lightning_rl.store.sqlite import SQLiteStore

        store = SQLiteStore(Path(config.run_dir) / "store.sqlite")
    backend, engine = _backend(config)
    try:
        app = create_gateway_app(backend, store=store)
        gateway = app.state.gateway
        runner = Runner(
            store,
            agent,
            concurrency=config.concurrency,
            poll_interval_s=0.05,
            default_timeout_s=config.rollout_timeout_s,
        )
        stop = asyncio.Event()
        async with running_gateway(app) as url:
            runner_task = asyncio.create_task(runner.run(stop), name="lightning-apo-runner")
            try:
                yield APOServices(store=store, gateway=gateway, gateway_url=url, model_name=gateway.backend.model_name)
            finally:
                stop.set()
                try:
                    await asyncio.wait_for(runner_task, timeout=config.rollout_timeout_s + 10)
                except TimeoutError:
                    runner_task.cancel()
    finally:
        if engine is not None:
            engine.close()
        if own_store:
            await store.close()
