"""Start VeRL's actor/rollout workers and vLLM replicas on Ray, as VeRL's own trainer does.

This mirrors ``RayPPOTrainer.init_workers`` (verl 0.9.1, hybrid engine) minus everything
LightningRL does itself (dataset, reward loop, agent loop, validation): one resource pool of
``trainer.nnodes x trainer.n_gpus_per_node`` GPUs, VeRL's ``ActorRolloutRefWorker`` on it (actor
+ reference, FSDP/Megatron per VeRL's config), one vLLM OpenAI server per rollout replica
(``LLMServerManager``) and the ``CheckpointEngineManager`` that moves weights actor -> vLLM and
puts the replicas to sleep. The replicas' addresses become the gateway's upstreams.

Written against verl 0.9.1's source; it needs GPUs and vLLM and was not run in this repository's
CI (see docs/verl.md for what was and was not run).

``start_cpu_actor_workers`` starts the same ``ActorRolloutRefWorker`` (role ``actor``: FSDP2 actor
and its checkpoint engine, no vLLM) on CPU, gloo, through VeRL's platform and checkpoint-engine
extension points (``cpu.py``, ``replicas.py``); rollouts then come from LightningRL gateways over
the embedded engine. That path runs in this repository's CI (``tests/core/verl/test_cpu_workers.py``).
"""

from __future__ import annotations

from typing import Any

from lightning_rl.backends.verl._require import require_verl
from lightning_rl.backends.verl.backend import VerlWorkers

require_verl()

__all__ = ["start_verl_workers", "start_cpu_actor_workers", "actor_dp_size"]

_RAY_START_ATTEMPTS = 3


def actor_dp_size(worker_group: Any) -> int:
    """Data-parallel size of the actor mesh, as VeRL's trainer queries it (``_get_dp_size``)."""
    info: Any = worker_group._query_dispatch_info("actor")  # noqa: SLF001  # pyright: ignore[reportUnknownMemberType]
    return int(max(info)) + 1


def start_verl_workers(config: Any) -> VerlWorkers:
    """Start the workers described by a VeRL ``ppo_trainer`` config (an OmegaConf ``DictConfig``)."""
    import ray  # pyright: ignore[reportMissingImports]
    from omegaconf import OmegaConf  # pyright: ignore[reportMissingImports]

    from verl.checkpoint_engine import CheckpointEngineManager  # pyright: ignore[reportMissingImports]
    from verl.single_controller.ray import RayClassWithInitArgs, RayWorkerGroup, ResourcePoolManager  # pyright: ignore[reportMissingImports]
    from verl.single_controller.ray.base import create_colocated_worker_cls  # pyright: ignore[reportMissingImports]
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env  # pyright: ignore[reportMissingImports]
    from verl.trainer.ppo.utils import Role, need_reference_policy  # pyright: ignore[reportMissingImports]
    from verl.utils.config import omega_conf_to_dataclass  # pyright: ignore[reportMissingImports]
    from verl.workers.engine_workers import ActorRolloutRefWorker  # pyright: ignore[reportMissingImports]
    from verl.workers.rollout.llm_server import LLMServerManager  # pyright: ignore[reportMissingImports]

    if not config.actor_rollout_ref.hybrid_engine:
        raise ValueError("the VeRL backend runs the hybrid engine: set actor_rollout_ref.hybrid_engine=true.")
    if not ray.is_initialized():  # pyright: ignore[reportUnknownMemberType]
        ray.init(runtime_env=OmegaConf.to_container(get_ppo_ray_runtime_env(config)))  # pyright: ignore[reportUnknownMemberType]
    role = Role.ActorRolloutRef if need_reference_policy(config) else Role.ActorRollout
    pools = ResourcePoolManager(
        resource_pool_spec={"global_pool": [config.trainer.n_gpus_per_node] * config.trainer.nnodes},
        mapping={role: "global_pool"},  # pyright: ignore[reportArgumentType]  # verl annotates dict[int, str]
    )
    pools.create_resource_pool()
    pool = pools.get_resource_pool(role)
    actor_cls = RayClassWithInitArgs(
        cls=ray.remote(ActorRolloutRefWorker),  # pyright: ignore[reportUnknownMemberType, reportUnknownArgumentType]
        config=config.actor_rollout_ref,
        distillation_config=config.get("distillation"),
        role=str(role),
    )
    colocated = create_colocated_worker_cls(class_dict={str(role): actor_cls})
    group = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=colocated, device_name=config.trainer.device)
    actor_wg: Any = group.spawn(prefix_set=[str(role)])[str(role)]
    actor_wg.init_model()
    servers: Any = LLMServerManager.create(config=config, worker_group=actor_wg, rollout_resource_pool=pool)
    # its methods are @auto_await: synchronous when called outside an event loop, as here
    checkpoint: Any = CheckpointEngineManager(
        config=omega_conf_to_dataclass(config.actor_rollout_ref.rollout.checkpoint_engine),
        actor_wg=actor_wg,
        replicas=servers.get_replicas(),
    )
    # the replicas start with the initial weights; sleep them until the first publish() wakes them
    checkpoint.sleep_replicas()
    return VerlWorkers(
        actor=actor_wg,
        dp_size=actor_dp_size(actor_wg),
        rollout=checkpoint,
        server_addresses=list(servers.get_addresses()),
        shutdown=ray.shutdown,  # pyright: ignore[reportUnknownMemberType, reportUnknownArgumentType]
    )


def _init_ray_on_cpu(num_cpus: int) -> None:
    """A local Ray instance whose workers select VeRL's CPU platform.

    With ``RAY_ADDRESS`` set, that cluster is joined instead. Ray waits a fixed 30 s for its
    raylet to register; on a loaded machine that can time out before the node is up, so start-up
    is tried a few times before giving up.
    """
    import os

    import ray  # pyright: ignore[reportMissingImports]

    from lightning_rl.backends.verl.cpu import cpu_runtime_env

    if os.environ.get("RAY_ADDRESS"):
        ray.init(runtime_env=cpu_runtime_env())  # pyright: ignore[reportUnknownMemberType]
        return
    for attempt in range(1, _RAY_START_ATTEMPTS + 1):
        try:
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, runtime_env=cpu_runtime_env())  # pyright: ignore[reportUnknownMemberType]
            return
        except Exception:
            ray.shutdown()  # pyright: ignore[reportUnknownMemberType]
            if attempt == _RAY_START_ATTEMPTS:
                raise


def start_cpu_actor_workers(config: Any, gateway_urls: list[str], *, admin_token: str | None = None) -> VerlWorkers:
    """VeRL's real actor worker group on CPU, publishing its weights to LightningRL gateways.

    ``config`` is a VeRL ``ppo_trainer`` config whose actor uses ``strategy=fsdp2`` and whose
    ``actor_rollout_ref.rollout.checkpoint_engine`` is ``replicas.file_engine_config(folder)``,
    ``folder`` being the gateways' weights folder; ``trainer.nnodes x trainer.n_gpus_per_node`` is
    the number of CPU worker processes (the data-parallel size). ``gateway_urls`` are gateways
    over the embedded engine: the rollout replicas. A Ray instance already running is used as is
    (its workers need ``cpu.cpu_runtime_env()``); otherwise one is started with one CPU per worker.
    """
    import ray  # pyright: ignore[reportMissingImports]

    from lightning_rl.backends.verl.cpu import CpuActorRolloutRefWorker, use_cpu_platform
    from lightning_rl.backends.verl.replicas import FILE_BACKEND, GatewayReplicaControl
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup  # pyright: ignore[reportMissingImports]

    backend = config.actor_rollout_ref.rollout.checkpoint_engine.backend
    if backend != FILE_BACKEND:
        raise ValueError(
            f"on CPU the actor publishes weights through the {FILE_BACKEND!r} checkpoint engine (got {backend!r}): "
            "set actor_rollout_ref.rollout.checkpoint_engine to replicas.file_engine_config(<the gateways' folder>)."
        )
    if config.actor_rollout_ref.actor.strategy != "fsdp2":
        raise ValueError("on CPU use actor_rollout_ref.actor.strategy=fsdp2 (FSDP1 pins parameters to a CUDA device).")
    per_node = int(config.trainer.n_gpus_per_node)
    nnodes = int(config.trainer.nnodes)
    use_cpu_platform()
    if not ray.is_initialized():  # pyright: ignore[reportUnknownMemberType]
        _init_ray_on_cpu(per_node * nnodes)
    # one CPU per worker: VeRL's default bundle asks for 10 (``max_colocate_count``)
    pool = RayResourcePool(process_on_nodes=[per_node] * nnodes, use_gpu=False, max_colocate_count=1)
    actor_cls = RayClassWithInitArgs(
        cls=ray.remote(CpuActorRolloutRefWorker),  # pyright: ignore[reportUnknownMemberType, reportUnknownArgumentType]
        config=config.actor_rollout_ref,
        role="actor",
    )
    actor_wg: Any = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=actor_cls, device_name="cpu")
    actor_wg.init_model()
    return VerlWorkers(
        actor=actor_wg,
        dp_size=actor_dp_size(actor_wg),
        rollout=GatewayReplicaControl(actor_wg, gateway_urls, admin_token=admin_token),
        server_addresses=list(gateway_urls),
        shutdown=ray.shutdown,  # pyright: ignore[reportUnknownMemberType, reportUnknownArgumentType]
    )
