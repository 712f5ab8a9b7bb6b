"""``VerlBackend``: the LightningRL policy backend that trains through VeRL's worker groups on Ray.

The trainer stays ours (store, runners, gateway, adapter, credit assignment); VeRL does what it is
best at: sharded actor/reference models (FSDP/Megatron engines) and vLLM rollout replicas with
weight sync and sleep/wake (the hybrid engine). One ``update(transitions)`` is the part of VeRL's
``RayPPOTrainer.fit`` step after generation, driven with our transitions:

1. transitions -> ``DataProto`` (``batch.py``), padded to a multiple of dp size x mini-batches
   (x the micro-batch size, with VeRL's static micro-batches);
2. the rollout replicas go to sleep (the hybrid engine frees their GPU memory for training);
3. ``old_log_probs``: the engine's sampled logprobs (VeRL's "bypass" mode, default) or
   recomputed by the actor; ``ref_log_prob`` when a KL loss is configured;
4. ``actor_wg.update_actor`` on the no-padding ``TensorDict``, exactly as VeRL's trainer calls it.

``publish()`` is ``CheckpointEngineManager.update_weights``: it wakes the replicas and pushes the
new weights into vLLM; the gateway is then told the new version so spans record it.

Everything VeRL-side is reached through two small protocols (``ActorWorkerGroup``,
``RolloutControl``) that VeRL's ``RayWorkerGroup`` and ``CheckpointEngineManager`` satisfy;
``cluster.start_verl_workers`` builds the real ones from a VeRL config.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import torch

from lightning_rl.backends.verl._require import require_verl
from lightning_rl.backends.verl.batch import BatchConfig, Overlong, VerlBatch, transitions_to_dataproto
from lightning_rl.types import Transition

require_verl()

from tensordict import TensorDict  # noqa: E402  # pyright: ignore[reportMissingImports]

from verl.utils import tensordict_utils as tu  # noqa: E402  # pyright: ignore[reportMissingImports]
from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding  # noqa: E402  # pyright: ignore[reportMissingImports]

__all__ = ["ActorWorkerGroup", "RolloutControl", "VerlWorkers", "VerlBackendConfig", "VerlBackend"]

log = logging.getLogger(__name__)


class ActorWorkerGroup(Protocol):
    """The methods of VeRL's ``ActorRolloutRefWorker`` group (``RayWorkerGroup``) the backend calls."""

    def compute_log_prob(self, data: TensorDict) -> TensorDict: ...  # pyright: ignore[reportUnknownParameterType]

    def compute_ref_log_prob(self, data: TensorDict) -> TensorDict: ...  # pyright: ignore[reportUnknownParameterType]

    def update_actor(self, data: TensorDict) -> TensorDict: ...  # pyright: ignore[reportUnknownParameterType]

    def save_checkpoint(
        self, local_path: str, hdfs_path: str | None = None, global_step: int = 0, max_ckpt_to_keep: int | None = None
    ) -> Any: ...

    def load_checkpoint(
        self, local_path: str, hdfs_path: str | None = None, del_local_after_load: bool = False
    ) -> Any: ...


class RolloutControl(Protocol):
    """What VeRL's ``CheckpointEngineManager`` offers: weight sync (which wakes the replicas) and sleep."""

    def update_weights(self, global_steps: int | None = None) -> Any: ...

    def sleep_replicas(self) -> Any: ...


@dataclass
class VerlWorkers:
    """Handles on a started VeRL deployment (see ``cluster.start_verl_workers``)."""

    actor: ActorWorkerGroup
    dp_size: int
    """Data-parallel size of the actor; every batch is a multiple of it."""
    rollout: RolloutControl | None = None
    """None when nothing serves rollouts from these weights (e.g. tests, offline updates)."""
    server_addresses: list[str] = field(default_factory=list[str])
    """``host:port`` of each vLLM replica's OpenAI server: the gateway's upstreams."""
    shutdown: Callable[[], None] | None = None


@dataclass
class VerlBackendConfig:
    """Settings of the update; model, optimizer and parallelism live in VeRL's own config."""

    mini_batches: int = 1
    """Optimizer steps per epoch (the batch is split into this many mini-batches)."""
    micro_batch_size: int = 1
    """Rows per micro-batch on each rank when VeRL's actor uses static micro-batches
    (``actor.use_dynamic_bsz=false``): set it to ``actor.ppo_micro_batch_size_per_gpu`` (and keep
    ``rollout.log_prob_micro_batch_size_per_gpu`` a divisor of it). VeRL asserts that each rank's
    rows divide into micro-batches (``prepare_micro_batches``), so the batch is padded to a
    multiple of dp size x ``mini_batches`` x this. 1 with dynamic batch sizes (the GPU default)."""
    ppo_epochs: int = 1
    old_logprobs: Literal["sampled", "recompute"] = "sampled"
    """``sampled``: the engine's logprobs at sampling time (VeRL bypass mode); ``recompute``: the actor's."""
    use_kl_loss: bool = False
    """Compute reference logprobs for VeRL's KL loss (``actor.use_kl_loss`` must match in VeRL's config)."""
    calculate_entropy: bool = False
    temperature: float = 1.0
    """Sampling temperature of the rollouts (VeRL divides logits by it)."""
    max_prompt_length: int | None = None
    max_response_length: int | None = None
    overlong: Overlong = "error"
    """What to do with a sample over the limits: raise, or ``drop`` it and count it. Never truncated."""
    pad_token_id: int = 0
    shuffle: bool = False
    seed: int = 0
    sleep_rollout_during_update: bool = True
    """Hybrid engine: put the vLLM replicas to sleep before the update (``publish`` wakes them)."""

    def __post_init__(self) -> None:
        if self.mini_batches < 1 or self.ppo_epochs < 1 or self.micro_batch_size < 1:
            raise ValueError("mini_batches, micro_batch_size and ppo_epochs must be >= 1.")
        if self.old_logprobs not in ("sampled", "recompute"):
            raise ValueError(f"old_logprobs must be 'sampled' or 'recompute', got {self.old_logprobs!r}.")


VersionListener = Callable[[int], Awaitable[None]]
"""Told the new model version after the weights reached the replicas (e.g. the gateway backend)."""


class VerlBackend:
    """A ``PolicyBackend`` over VeRL worker groups (see the module docstring)."""

    def __init__(
        self,
        workers: VerlWorkers,
        config: VerlBackendConfig | None = None,
        *,
        version: int = 1,
        on_publish: VersionListener | None = None,
    ) -> None:
        self.workers = workers
        self.config = config or VerlBackendConfig()
        self.version = version
        self.step = 0
        self.on_publish = on_publish

    # --- batches ------------------------------------------------------------------------------
    def build_batch(self, transitions: Sequence[Transition], *, require_logprobs: bool | None = None) -> VerlBatch:
        cfg = self.config
        need = cfg.old_logprobs == "sampled" if require_logprobs is None else require_logprobs
        return transitions_to_dataproto(
            transitions,
            BatchConfig(
                pad_token_id=cfg.pad_token_id,
                max_prompt_length=cfg.max_prompt_length,
                max_response_length=cfg.max_response_length,
                overlong=cfg.overlong,
                size_divisor=self.workers.dp_size * cfg.mini_batches * cfg.micro_batch_size,
                require_logprobs=need,
                temperature=cfg.temperature,
            ),
        )

    def _infer(self, batch: VerlBatch, *, ref: bool) -> torch.Tensor:
        """Padded ``[rows, response width]`` logprobs from the actor (or the reference)."""
        td = left_right_2_no_padding(batch.data.to_tensordict())
        meta: dict[str, Any] = {"calculate_entropy": False, "compute_loss": False}
        tu.assign_non_tensor(td, **meta)
        out = self.workers.actor.compute_ref_log_prob(td) if ref else self.workers.actor.compute_log_prob(td)
        return no_padding_2_padding(tu.get(out, "log_probs"), td).float()

    # --- PolicyBackend ------------------------------------------------------------------------
    def logprobs(self, transitions: Sequence[Transition]) -> list[list[float]]:
        batch = self.build_batch(transitions, require_logprobs=False)
        logp = self._infer(batch, ref=False)
        out: dict[int, list[float]] = {}
        for row, t in enumerate(batch.transitions):
            out[id(t)] = logp[row, : len(t.response_ids)].tolist()
        return [out.get(id(t), []) for t in transitions]

    def update(self, transitions: Sequence[Transition]) -> dict[str, float]:
        cfg = self.config
        started = time.perf_counter()
        batch = self.build_batch(transitions)
        if cfg.sleep_rollout_during_update and self.workers.rollout is not None:
            self.workers.rollout.sleep_replicas()
        data = batch.data
        if cfg.old_logprobs == "recompute":
            data.batch["old_log_probs"] = self._infer(batch, ref=False)
        else:
            data.batch["old_log_probs"] = data.batch["rollout_log_probs"].clone()
        if cfg.use_kl_loss:
            data.batch["ref_log_prob"] = self._infer(batch, ref=True)
        td = left_right_2_no_padding(data.to_tensordict())
        mini = batch.n_rows // cfg.mini_batches
        tu.assign_non_tensor(
            td,
            calculate_entropy=cfg.calculate_entropy,
            distillation_use_topk=False,
            distillation_only=False,
            global_batch_size=mini,
            mini_batch_size=mini,
            epochs=cfg.ppo_epochs,
            seed=cfg.seed + self.step,
            dataloader_kwargs={"shuffle": cfg.shuffle},
            compute_loss=True,
            temperature=cfg.temperature,
            multi_turn=False,
        )
        output = self.workers.actor.update_actor(td)
        raw: dict[str, Any] = tu.get(output, "metrics") or {}
        self.step += 1
        elapsed = time.perf_counter() - started
        metrics = {f"train/{k}": v for k, v in _flatten_metrics(raw).items()}
        if "train/actor/pg_loss" in metrics:
            metrics["train/loss"] = metrics["train/actor/pg_loss"]
        n_tokens = sum(len(t.response_ids) for t in batch.transitions)
        metrics.update({f"train/{k}": v for k, v in batch.metrics().items()})
        metrics["train/update_s"] = elapsed
        metrics["train/update_tokens_per_s"] = n_tokens * cfg.ppo_epochs / elapsed if elapsed > 0 else 0.0
        return metrics

    async def publish(self) -> int:
        """Push the actor's weights into the vLLM replicas (waking them); returns the new version."""
        self.version += 1
        if self.workers.rollout is not None:
            # CheckpointEngineManager's methods are auto-awaited: run without an event loop, in a thread
            await asyncio.to_thread(self.workers.rollout.update_weights, self.version)
        if self.on_publish is not None:
            await self.on_publish(self.version)
        return self.version

    def save_checkpoint(self, directory: str | Path) -> Path:
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        self.workers.actor.save_checkpoint(str(path / "actor"), None, self.step, None)
        state = path / "lightning_state.json"
        state.write_text(json.dumps({"step": self.step, "version": self.version, "backend": "verl"}))
        return state

    def load_checkpoint(self, directory: str | Path) -> None:
        path = Path(directory)
        state = path / "lightning_state.json"
        if not state.exists():
            raise FileNotFoundError(f"no VeRL checkpoint at {path}; pass the folder a previous run saved.")
        self.workers.actor.load_checkpoint(str(path / "actor"), None, False)
        saved: dict[str, Any] = json.loads(state.read_text())
        self.step = int(saved["step"])
        self.version = int(saved["version"])


def _flatten_metrics(raw: dict[str, Any]) -> dict[str, float]:
    """VeRL returns lists (one value per micro/mini-batch) or scalars; report their mean."""
    out: dict[str, float] = {}
    for key, value in raw.items():
        values: list[Any] = list(value) if isinstance(value, list | tuple) else [value]  # pyright: ignore[reportUnknownArgumentType]
        numbers = [float(v) for v in values if isinstance(v, int | float | torch.Tensor)]
        if numbers:
            out[key] = sum(numbers) / len(numbers)
    return out
