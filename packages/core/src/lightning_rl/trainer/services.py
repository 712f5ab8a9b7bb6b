"""The embedded services one training run needs, started and stopped together.

A SQLite store in the run folder (durable: a crash loses no acknowledged data), the inference
engine behind the OpenAI-compatible gateway on a free loopback port, the torch policy backend
(a second copy of the weights that ``publish()`` swaps into the engine), and an in-process runner
executing the agent (unless ``concurrency=0``: then runner processes started separately work
from the same SQLite file, which is safe across processes). Everything shares one event loop; the
engine decodes on its own thread and the update runs in a worker thread, so the gateway keeps
answering throughout.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sys
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from lightning_rl.agent import AgentFn
from lightning_rl.backends.base import PolicyBackend
from lightning_rl.backends.publish import engine_publisher
from lightning_rl.backends.torch_backend import TorchBackend
from lightning_rl.errors import StoreUnavailableError
from lightning_rl.store.base import LightningStore
from lightning_rl.trainer.config import TrainerConfig
from lightning_rl.types import LLMResource, Resources

__all__ = ["Services", "start_services", "serving_rollouts", "resolve_model", "publish_resources"]

_SWITCH_INTERVAL_S = 0.0005


@dataclass
class Services:
    store: LightningStore
    backend: PolicyBackend
    engine: Any
    gateway: Any
    gateway_url: str
    model_name: str
    run_id: str
    console: Console

    async def flush_spans(self, timeout_s: float = 60.0) -> None:
        """Wait until every LLM call the gateway served so far is recorded in the store."""
        if self.gateway.writer is not None:
            await self.gateway.writer.flush(timeout=timeout_s)


def resolve_model(model: str, cache_dir: Path | None = None) -> Path:
    """``tiny``, ``smollm2-135m``, a ``.gguf`` file, an HF folder or hub name -> what ``from_pretrained``
    loads (see ``lightning_rl.engine.models.resolve_model``)."""
    from lightning_rl.engine.models import resolve_model as resolve

    return resolve(model, cache_dir)


@contextlib.asynccontextmanager
async def serving_rollouts(
    config: TrainerConfig,
    agent: AgentFn | None,
    store: LightningStore,
    app: Any,
    services: Callable[[str], Services],
    on_serving: Callable[[], Awaitable[object]] | None = None,
) -> AsyncGenerator[Services]:
    """Serve the gateway ``app`` on loopback and run the in-process runner (unless ``concurrency=0``)
    for as long as the block runs; the shared part of every backend's services.

    ``services(url)`` builds what the trainer sees; ``on_serving`` runs once the gateway answers
    (VeRL wakes its replicas there). On exit the runner gets ``rollout_timeout_s`` + 10 s to finish.
    """
    from lightning_rl.gateway.server import running_gateway
    from lightning_rl.runner import Runner

    runner = None
    if config.concurrency > 0:
        if agent is None:
            raise ValueError("fit() needs the agent when the trainer runs it (concurrency > 0).")
        runner = Runner(store, agent, concurrency=config.concurrency, poll_interval_s=0.05, heartbeat_interval_s=5.0)
    stop = asyncio.Event()
    async with running_gateway(app) as url:
        if on_serving is not None:
            await on_serving()
        runner_task = asyncio.create_task(runner.run(stop), name="lightning-runner") if runner else None
        try:
            yield services(url)
        finally:
            stop.set()
            if runner_task is not None:
                try:
                    await asyncio.wait_for(runner_task, timeout=config.rollout_timeout_s + 10)
                except TimeoutError:
                    runner_task.cancel()


@contextlib.asynccontextmanager
async def start_services(
    config: TrainerConfig, agent: AgentFn | None, is_frozen: Callable[[str | None], bool] | None = None
) -> AsyncGenerator[Services]:
    """The services of one run. With ``is_frozen`` (``role -> bool``), the roles it names are answered
    by a second engine on the starting weights (``TrainerConfig.untrainable_roles == "frozen"``)."""
    import torch
    from transformers import AutoModelForCausalLM

    from lightning_rl.engine.hf import TransformersEngine
    from lightning_rl.engine.models import served_model_name
    from lightning_rl.gateway import GatewayConfig, create_gateway_app
    from lightning_rl.seeding import CallSeeds
    from lightning_rl.store import open_store
    from lightning_rl.store.sqlite import SQLiteStore

    run_dir = Path(config.run_dir)
    model_path = resolve_model(config.model)
    torch.manual_seed(config.seed)
    if config.store and config.store.startswith(("http://", "https://")):
        from lightning_rl.store.client import StoreClient

        # a store server restarting (or its database) must not end a run of hours: retry through it
        store: LightningStore = StoreClient(config.store, retry_for_s=config.store_retry_s)
    else:
        store = await open_store(config.store) if config.store else SQLiteStore(run_dir / "store.sqlite")

    def load_engine() -> TransformersEngine:
        return TransformersEngine.from_pretrained(
            model_path,
            device=config.device,
            max_batch_size=1 if config.deterministic else config.concurrency or config.engine_batch_size,
            model_name=served_model_name(config.model),
            dtype="bfloat16" if config.precision == "bfloat16" else None,
        )

    engine = load_engine()
    # loaded in the backend's dtype: no transient float32 copy of a bfloat16 base
    policy = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, config.backend.dtype))

    frozen_engine = None
    frozen_base: Any = None
    served: Any = engine
    backend: PolicyBackend
    if config.adapters == "per_role":
        backend, served = _per_role_adapters(config, engine, policy)
    else:
        backend = TorchBackend(
            policy,
            config.backend,
            pad_token_id=int(engine.tokenizer.pad_token_id or 0),
            publisher=engine_publisher(engine),
            version=engine.version,
        )
        if config.backend.lora_rank > 0:
            # under LoRA the trainer's base never changes: the engines serve its tensors, not copies
            # (a publish gives the merged layers tensors of their own: engine.borrow_weights)
            adapted: Any = backend.model
            frozen_base = adapted.get_base_model()
            engine.borrow_weights(frozen_base)
    if is_frozen is not None and config.adapters != "per_role":
        from lightning_rl.gateway.frozen import FrozenRolesBackend
        from lightning_rl.gateway.upstreams import EngineBackend

        frozen_engine = load_engine()  # the starting weights again: no publish reaches this copy
        if frozen_base is not None:
            frozen_engine.borrow_weights(frozen_base)
        served = FrozenRolesBackend(EngineBackend(engine), EngineBackend(frozen_engine), is_frozen)
    run_id = uuid.uuid4().hex[:8]  # in rollout ids; removed again before seeds are derived from them
    gateway_config = GatewayConfig(call_seeds=CallSeeds(config.seed, rollout_prefix=f"{run_id}-"))
    app = create_gateway_app(served, store=store, config=gateway_config)

    def services(url: str) -> Services:
        return Services(
            store=store,
            backend=backend,
            engine=engine,
            gateway=app.state.gateway,
            gateway_url=url,
            model_name=engine.model_name,
            run_id=run_id,
            console=Console(),
        )

    try:
        with _interpreter_tuned_for_serving():
            async with serving_rollouts(config, agent, store, app, services) as svc:
                yield svc
    finally:
        engine.close()
        if frozen_engine is not None:
            frozen_engine.close()
        await store.close()


def _per_role_adapters(config: TrainerConfig, engine: Any, policy: Any) -> tuple[PolicyBackend, Any]:
    """The backend and gateway backend of ``adapters="per_role"``: the engine serves each role's
    adapter per row, over the base weights the trainer shares with it (one copy in memory)."""
    from lightning_rl.backends.per_role import PerRoleAdaptersBackend, adapter_publisher, share_base_weights
    from lightning_rl.gateway.adapters import RoleAdaptersBackend
    from lightning_rl.gateway.upstreams import EngineBackend

    engine.enable_adapters(config.backend.lora_targets)
    backend = PerRoleAdaptersBackend(
        policy,
        config.backend,
        pad_token_id=int(engine.tokenizer.pad_token_id or 0),
        publisher=adapter_publisher(engine),
        version=engine.version,
    )
    share_base_weights(backend.model, engine.model)  # after the backend's own dtype/device cast
    return backend, RoleAdaptersBackend(EngineBackend(engine))


@contextlib.contextmanager
def _interpreter_tuned_for_serving() -> Generator[None]:
    """Interpreter settings for one process serving the engine, the gateway and the agents; undone on exit.

    * The garbage collector stays off the start-up heap. torch, transformers and the models leave a
      few hundred thousand long-lived objects, and every full collection walks them all again:
      ~0.3 s with the GIL held, which stalls the engine, the gateway and the agents at once
      (measured in the demo's rollouts, one every few steps). The rollouts allocate many
      short-lived objects (the agents' SDK, the gateway), so the youngest generation may also grow
      (see ``freeze_startup_heap``).
    * A shorter GIL switch interval (0.5 ms instead of 5 ms). The engine thread gives up the GIL
      around every torch operation (hundreds per forward pass of a small model) and, while the
      event loop runs Python (an agent's SDK, the gateway), waits up to the interval to get it
      back: a forward pass could stretch by up to 5 ms per operation, and the engine is the
      bottleneck of the rollouts. Demo rollout tokens/s, two alternating pairs of runs on a busy
      2-core host: 1270 -> 1671 and 1632 -> 2034.
    """
    from lightning_rl.gateway.server import freeze_startup_heap

    thresholds = gc.get_threshold()
    interval = sys.getswitchinterval()
    freeze_startup_heap()
    sys.setswitchinterval(min(interval, _SWITCH_INTERVAL_S))
    try:
        yield
    finally:
        sys.setswitchinterval(interval)
        gc.unfreeze()
        gc.set_threshold(*thresholds)


async def publish_resources(
    store: LightningStore, *, llm: LLMResource, extra: dict[str, object], retry_s: float
) -> Resources:
    """``store.add_resources``, retried for ``retry_s`` while the store is unavailable.

    The store client never retries ``add_resources`` on its own once the request may have reached
    the server (a retry could publish a second version). The trainer can: a duplicate version is
    harmless, since every rollout names the version it was enqueued with, while giving up ends the
    run. Without this, a store server whose database was restarting answered 503 and the trainer
    died (found by benchmarks/chaos.py).
    """
    deadline = time.monotonic() + retry_s
    delay = 0.25
    while True:
        try:
            return await store.add_resources(llm=llm, extra=extra)
        except StoreUnavailableError:
            if time.monotonic() + delay > deadline:
                raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
