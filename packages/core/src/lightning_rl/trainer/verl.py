"""The LightningRL loop with VeRL doing the training and the serving.

Everything about rollouts stays ours: the store, the runners executing the user's unchanged agent,
the gateway recording exact token ids, the adapter, credit assignment and rollout-level GRPO. What
changes is behind the gateway and behind ``backend.update``:

* the gateway's upstream is VeRL's vLLM replicas (``ReplicaUpstream`` over
  ``LLMServerManager.get_addresses()``; vLLM's ``return_token_ids`` keeps tokens exact);
* ``backend`` is a ``VerlBackend``: ``update`` sleeps the replicas and runs VeRL's actor update,
  ``publish`` runs VeRL's checkpoint engine (weights actor -> vLLM, replicas woken up) and tells
  the gateway the new version.

``VerlTrainer`` reuses ``Trainer``'s step, validation and checkpoint code unchanged; only the
services differ (``verl_services``, through ``Trainer._services``). It lives next to the loop it
extends: the VeRL backend (``lightning_rl.backends.verl``) knows nothing of the trainer. See
docs/verl.md for the launch commands.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncGenerator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

from rich.console import Console

from lightning_rl.agent import AgentFn
from lightning_rl.backends.verl.backend import VerlBackend, VerlBackendConfig, VerlWorkers
from lightning_rl.backends.verl.upstream import ReplicaUpstream
from lightning_rl.trainer.config import TrainerConfig
from lightning_rl.trainer.loop import Trainer
from lightning_rl.trainer.services import Services, serving_rollouts

__all__ = ["verl_services", "VerlTrainer"]


@contextlib.asynccontextmanager
async def verl_services(
    config: TrainerConfig, workers: VerlWorkers, backend_config: VerlBackendConfig, agent: AgentFn | None
) -> AsyncGenerator[Services]:
    """Store + gateway over VeRL's vLLM replicas + runner, with a ``VerlBackend`` as the policy backend."""
    from lightning_rl.gateway import create_gateway_app
    from lightning_rl.store.sqlite import SQLiteStore

    store = SQLiteStore(Path(config.run_dir) / "store.sqlite")
    upstream = ReplicaUpstream(workers.server_addresses)
    app = create_gateway_app(upstream, store=store)

    async def tell_gateway(version: int) -> None:
        await upstream.load_weights(None, version)

    backend = VerlBackend(workers, backend_config, version=1, on_publish=tell_gateway)

    def services(url: str) -> Services:
        return Services(
            store=store,
            backend=backend,
            engine=None,
            gateway=app.state.gateway,
            gateway_url=url,
            model_name=upstream.model_name,
            run_id=uuid.uuid4().hex[:8],
            console=Console(),
        )

    try:
        # the replicas sleep after start-up: the first publish wakes them with the actor's weights
        async with serving_rollouts(config, agent, store, app, services, on_serving=backend.publish) as svc:
            yield svc
    finally:
        await store.close()


class VerlTrainer(Trainer):
    """``Trainer`` whose services are VeRL's workers (started by ``cluster.start_verl_workers``)."""

    def __init__(
        self,
        config: TrainerConfig,
        workers: VerlWorkers,
        backend_config: VerlBackendConfig | None = None,
        *,
        trainable: Any = None,
    ) -> None:
        if config.untrainable_roles != "shared":
            raise ValueError(
                "VeRL's rollout replicas serve one set of weights, so untrainable_roles='frozen' is not "
                "available with VerlTrainer; use untrainable_roles='shared' or the torch backend (Trainer)."
            )
        super().__init__(config, trainable=trainable)
        self.workers = workers
        self.backend_config = backend_config or VerlBackendConfig(temperature=config.temperature)

    def _services(self, agent: AgentFn | None) -> AbstractAsyncContextManager[Services]:
        """VeRL's workers behind the gateway instead of the embedded engine and torch backend."""
        return verl_services(self.config, self.workers, self.backend_config, agent)
