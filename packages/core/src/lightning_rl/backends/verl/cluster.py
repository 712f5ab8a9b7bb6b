"""Start VeRL's actor/rollout workers and vLLM replicas on Ray, as VeRL's own trainer does.

This mirrors ``RayPPOTrainer.init_workers`` (verl 0.9.1, hybrid engine) minus everything
LightningRL does itself (dataset, reward loop, agent loop, validation): one resource pool of
``trainer.nnodes x trainer.n_gpus_per_node`` GPUs, VeRL's ``ActorRolloutRefWorker`` on it (actor
+ reference, FSDP/Megatron per VeRL's config), one vLLM OpenAI server per rollout replica
(``LLMServerManager``) and the ``CheckpointEngineManager`` that moves weights actor -> vLLM and
puts the replicas to sleep. The replicas' addresses become the gateway's upstreams.

Written against verl 0.9.1's source; it needs GPUs and vLLM and was not run in this repository's
CI (see docs/verl.md for what was and was not run).
"""

from __future__ import annotations

from typing import Any

from lightning_rl.backends.verl._require import require_verl
from lightning_rl.backends.verl.backend import VerlWorkers

require_verl()

__all__ = ["start_verl_workers", "actor_dp_size"]


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
