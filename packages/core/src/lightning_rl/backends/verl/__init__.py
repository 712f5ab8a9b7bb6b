"""The VeRL policy backend (optional extra ``lightning-rl[verl]``), imported lazily.

``import lightning_rl.backends.verl`` never imports VeRL; the first attribute you use does, and
raises ``ImportError`` with the install command when VeRL is missing. See docs/verl.md. The loop
over these workers is ``lightning_rl.trainer.verl.VerlTrainer``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lightning_rl.backends.verl._require import INSTALL_HINT, SUPPORTED, require_verl

if TYPE_CHECKING:
    from lightning_rl.backends.verl.advantages import verl_compute_advantages, verl_rollout_advantages
    from lightning_rl.backends.verl.backend import (
        ActorWorkerGroup,
        RolloutControl,
        VerlBackend,
        VerlBackendConfig,
        VerlWorkers,
    )
    from lightning_rl.backends.verl.batch import BatchConfig, VerlBatch, transitions_to_dataproto
    from lightning_rl.backends.verl.cluster import start_cpu_actor_workers, start_verl_workers
    from lightning_rl.backends.verl.replicas import GatewayReplicaControl, file_engine_config
    from lightning_rl.backends.verl.upstream import ReplicaUpstream

__all__ = [
    "INSTALL_HINT",
    "SUPPORTED",
    "require_verl",
    "ActorWorkerGroup",
    "RolloutControl",
    "VerlWorkers",
    "VerlBackend",
    "VerlBackendConfig",
    "BatchConfig",
    "VerlBatch",
    "transitions_to_dataproto",
    "verl_rollout_advantages",
    "verl_compute_advantages",
    "start_verl_workers",
    "start_cpu_actor_workers",
    "GatewayReplicaControl",
    "file_engine_config",
    "ReplicaUpstream",
]

_WHERE = {
    "ActorWorkerGroup": "backend",
    "RolloutControl": "backend",
    "VerlWorkers": "backend",
    "VerlBackend": "backend",
    "VerlBackendConfig": "backend",
    "BatchConfig": "batch",
    "VerlBatch": "batch",
    "transitions_to_dataproto": "batch",
    "verl_rollout_advantages": "advantages",
    "verl_compute_advantages": "advantages",
    "start_verl_workers": "cluster",
    "start_cpu_actor_workers": "cluster",
    "GatewayReplicaControl": "replicas",
    "file_engine_config": "replicas",
    "ReplicaUpstream": "upstream",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    require_verl()
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
