"""Lightning gateways over the embedded engine as VeRL's rollout replicas: weights actor -> file -> gateway.

On GPUs VeRL serves rollouts from vLLM replicas and moves the actor's weights into them with its
checkpoint engine (``CheckpointEngineManager.update_weights`` -> ``actor_wg.update_weights`` ->
``CheckpointEngine.send_weights``). Without vLLM, a LightningRL gateway over the embedded
transformers engine is an OpenAI server that returns vLLM's ``prompt_token_ids``/``token_ids``,
so ``ReplicaUpstream`` serves the loop from it unchanged. This module closes the loop through
VeRL's public extension points:

* ``FileCheckpointEngine`` is a VeRL checkpoint engine (``CheckpointEngineRegistry`` backend
  ``lightning_file``; the actor workers import this module through the config key
  ``actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module``). Every actor rank runs
  VeRL's ``get_per_tensor_param()`` (FSDP gathers full tensors collectively); rank 0 writes the
  state dict with ``torch.save`` into the replicas' weights folder.
* ``GatewayReplicaControl`` is the backend's ``RolloutControl``: ``update_weights(version)`` calls
  VeRL's ``actor_wg.update_weights`` and then each gateway's ``POST /admin/weights`` with that file.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from lightning_rl.backends.verl._require import require_verl

require_verl()

from verl.checkpoint_engine import CheckpointEngine, CheckpointEngineRegistry  # noqa: E402  # pyright: ignore[reportMissingImports]

__all__ = ["FILE_BACKEND", "FileCheckpointEngine", "GatewayReplicaControl", "weights_file_name", "file_engine_config"]

FILE_BACKEND = "lightning_file"
"""The checkpoint-engine backend name (``actor_rollout_ref.rollout.checkpoint_engine.backend``)."""


def weights_file_name(version: int) -> str:
    """The file one published version is written to, relative to the weights folder."""
    return f"policy_v{version:06d}.pt"


def file_engine_config(directory: str | Path) -> dict[str, Any]:
    """The ``actor_rollout_ref.rollout.checkpoint_engine`` keys that select ``FileCheckpointEngine``."""
    return {
        "backend": FILE_BACKEND,
        "custom_backend_module": __name__,
        "engine_kwargs": {FILE_BACKEND: {"directory": str(directory)}},
    }


@CheckpointEngineRegistry.register(FILE_BACKEND)  # pyright: ignore[reportUntypedClassDecorator, reportUnknownMemberType]
class FileCheckpointEngine(CheckpointEngine):  # pyright: ignore[reportUntypedBaseClass]
    """VeRL checkpoint engine that writes the actor's full weights to a file (rank 0) per version.

    The process-group methods of VeRL's interface serve engines that stream into rollout workers
    (NCCL, NIXL); here the receiver is a gateway reading a file, so they are never called.
    """

    def __init__(self, bucket_size: int, is_master: bool = False, directory: str = "") -> None:
        if not directory:
            raise ValueError(
                f"the {FILE_BACKEND!r} checkpoint engine needs a folder: set "
                f"actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.{FILE_BACKEND}.directory."
            )
        self.bucket_size = bucket_size
        self.is_master = is_master
        self.directory = Path(directory)

    async def send_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]], global_steps: int | None = None
    ) -> dict[str, float]:
        if global_steps is None:
            raise ValueError("FileCheckpointEngine needs the version: call update_weights(global_steps=<version>).")
        state: dict[str, torch.Tensor] = {}
        for name, tensor in weights:  # every rank iterates: the full tensors are gathered collectively
            if self.is_master:
                state[name] = tensor.detach().to("cpu", copy=True).contiguous()
        if not self.is_master:
            return {}
        self.directory.mkdir(parents=True, exist_ok=True)
        target = self.directory / weights_file_name(global_steps)
        partial = target.with_suffix(".partial")
        torch.save(state, partial)
        os.replace(partial, target)  # a reader never sees half a file
        return {"weights/tensors": float(len(state))}

    async def receive_weights(self, global_steps: int | None = None) -> Any:
        raise NotImplementedError("the gateway reads the file FileCheckpointEngine wrote; nothing receives here.")

    def prepare(self) -> dict[str, Any]:
        return {}

    @classmethod
    def build_topology(cls, *args: Any, **kwargs: Any) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        return {}, {}

    def init_process_group(self, **kwargs: Any) -> None:
        return None

    def finalize(self) -> None:
        return None


class GatewayReplicaControl:
    """``RolloutControl`` for gateways over the embedded engine (see the module docstring).

    ``sleep_replicas`` does nothing: the embedded engine has no sleep mode (vLLM's frees GPU memory
    for the update); the gateways keep serving, and their spans record the version they served.
    """

    def __init__(
        self, actor: Any, gateway_urls: Sequence[str], *, admin_token: str | None = None, timeout_s: float = 120.0
    ) -> None:
        if not gateway_urls:
            raise ValueError("GatewayReplicaControl needs at least one gateway URL.")
        self.actor = actor
        self.gateway_urls = [u.rstrip("/") for u in gateway_urls]
        self.admin_token = admin_token
        self.timeout_s = timeout_s
        self.published: list[int] = []

    def update_weights(self, global_steps: int | None = None) -> dict[str, Any]:
        """VeRL's actor writes version ``global_steps``; every gateway loads it and serves it from then on."""
        import httpx
        import ray  # pyright: ignore[reportMissingImports]

        if global_steps is None:
            raise ValueError("update_weights needs the version to publish (global_steps).")
        ray.get(self.actor.update_weights(global_steps=global_steps, mode=FILE_BACKEND))  # pyright: ignore[reportUnknownMemberType]
        headers = {"Authorization": f"Bearer {self.admin_token}"} if self.admin_token else {}
        body = {"path": weights_file_name(global_steps), "version": global_steps}
        with httpx.Client(timeout=self.timeout_s, headers=headers) as client:
            for url in self.gateway_urls:
                reply = client.post(f"{url}/admin/weights", json=body)
                if reply.status_code != 200:
                    raise RuntimeError(f"the gateway at {url} did not load version {global_steps}: {reply.text}")
        self.published.append(global_steps)
        return {}

    def sleep_replicas(self) -> None:
        return None
