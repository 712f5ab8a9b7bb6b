"""One base model, one LoRA adapter per trainable role: selective multi-agent training without interference.

In a multi-agent app the roles usually call one model, so with one set of trained weights an update
for one role moves every other role too: a frozen planner drifts, and two trainable roles (a SQL
writer and its rewriter) pull one policy in two directions. ``PerRoleAdaptersBackend`` gives each
trainable role its own LoRA adapter over one frozen base:

* ``update(transitions)`` groups the transitions by role and runs the ordinary PPO-clip / GRPO
  update (``TorchBackend.update``) once per role, with that role's adapter active and that role's
  own AdamW optimiser; the advantages come in already computed (per rollout, in its task group,
  as always). An adapter is created, as a no-op (LoRA's ``B = 0``), the first time its role has
  transitions; transitions of calls that named no role are left out (the base answered them).
* ``publish()`` sends only the adapters that changed since the last publish, as PEFT state dicts,
  to the engine (``TransformersEngine.load_adapters``: the engine decodes every role's rows in one
  batch, each with its own adapter, see ``lightning_rl.engine.lora``). Frozen roles and calls of no
  role are served by the base weights, which never change.
* Checkpoints hold every adapter, its optimiser state and version; each adapter is also written in
  PEFT format (``<checkpoint>/adapters/<role>/``), loadable by ``peft.PeftModel.from_pretrained``
  and by vLLM's LoRA serving (docs/adapters.md).

The base model is frozen, so the trainer may hold the very tensors the engine serves
(``share_base_weights``): one copy of the base in memory, where ``untrainable_roles="frozen"`` keeps
three (the policy, the engine, the frozen engine) plus a full optimiser state.
"""

from __future__ import annotations

import zlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from lightning_rl.backends.torch_backend import (
    TorchBackend,
    TorchBackendConfig,
    load_checkpoint_file,
    lora_config,
    save_checkpoint_file,
)
from lightning_rl.engine.lora import AdapterWeights
from lightning_rl.roles import adapter_name
from lightning_rl.types import Transition

__all__ = ["PerRoleAdaptersBackend", "AdapterPublisher", "adapter_publisher", "share_base_weights"]

AdapterPublisher = Callable[[Mapping[str, AdapterWeights], int], Awaitable[None]]
"""Receives the changed adapters (by name) and the new model version (e.g. ``engine.load_adapters``)."""

_SUMMED = ("train/update_s", "train/optimizer_steps")
"""Per-adapter metrics that add up over the adapters; the others are averaged, weighted by transitions."""


def adapter_publisher(engine: Any) -> AdapterPublisher:
    """Publish adapters into a ``TransformersEngine`` in this process (between batches)."""

    async def publish(adapters: Mapping[str, AdapterWeights], version: int) -> None:
        await engine.load_adapters(adapters, version)

    return publish


def share_base_weights(model: torch.nn.Module, served: torch.nn.Module) -> int:
    """Make ``model``'s parameters use the storage of ``served``'s parameters of the same name; returns
    the bytes no longer held twice.

    Only for a frozen base (per-role adapters): both models then read the same tensors, the engine on
    its thread and the trainer on its own, and neither writes them. Parameters whose shape, dtype or
    device differ (a bfloat16 engine beside a float32 trainer) keep their own copy."""
    theirs = dict(served.named_parameters())
    saved = 0
    with torch.no_grad():
        for name, param in model.named_parameters():
            other = theirs.get(name)
            if other is None or other.shape != param.shape or other.dtype != param.dtype:
                continue
            if other.device != param.device or other.data_ptr() == param.data_ptr():
                continue
            param.data = other.data
            saved += param.numel() * param.element_size()
    return saved


class PerRoleAdaptersBackend(TorchBackend):
    """A frozen base model with one LoRA adapter and one optimiser per trainable role (module docstring).

    Args:
        model: The base causal LM (its weights are never trained here).
        config: ``lora_rank > 0`` is required: the rank, ``lora_alpha`` and ``lora_targets`` of every
            adapter. The other settings apply to each role's update as in ``TorchBackend``.
        pad_token_id: The tokenizer's pad id.
        publisher: Where ``publish()`` sends changed adapters (``adapter_publisher(engine)``).
        version: The model version the engine serves now.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        config: TorchBackendConfig | None = None,
        *,
        pad_token_id: int = 0,
        publisher: AdapterPublisher | None = None,
        version: int = 1,
    ) -> None:
        cfg = config or TorchBackendConfig()
        if cfg.lora_rank <= 0:
            raise ValueError(
                "per-role adapters train one LoRA adapter per role: set backend.lora_rank > 0 (e.g. lora_rank = 8)."
            )
        try:
            import peft  # pyright: ignore[reportMissingImports, reportUnusedImport]  # noqa: F401
        except ImportError as exc:
            raise ImportError("per-role adapters need peft: pip install 'lightning-rl[lora]'") from exc
        # the parent wraps nothing (no adapter exists yet); adapters are added per role as they appear
        super().__init__(model, replace(cfg, lora_rank=0), pad_token_id=pad_token_id, version=version)
        self.config = cfg
        self.model.requires_grad_(False)
        self.adapter_publisher = publisher
        self.roles: dict[str, str] = {}
        """Adapter name -> the role it serves."""
        self.adapter_versions: dict[str, int] = {}
        """Adapter name -> how many publishes changed it (the engine reports the same number)."""
        self._optimizers: dict[str, torch.optim.Optimizer] = {}
        self._changed: set[str] = set()  # trained since the last publish: sent, and their version goes up
        self._unsent: set[str] = set()  # restored from a checkpoint: sent at their saved version

    # --- adapters -----------------------------------------------------------------------------
    @property
    def scale(self) -> float:
        """LoRA's scale ``lora_alpha / r``, which the engine needs next to the factors."""
        return self.config.lora_alpha / self.config.lora_rank

    def _lora_config(self) -> Any:
        return lora_config(self.config, self.model)

    def adapter_for(self, role: str) -> str:
        """The adapter of ``role``, created (a no-op, seeded by the backend's seed and its name) if new."""
        name = adapter_name(role)
        owner = self.roles.get(name)
        if owner is not None:
            if owner != role:
                raise ValueError(
                    f"roles {owner!r} and {role!r} map to one adapter name {name!r}; rename one of them "
                    "(characters outside [A-Za-z0-9_-] become '_')."
                )
            return name
        from peft import PeftModel, get_peft_model  # pyright: ignore[reportMissingImports]

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.config.seed * 1_000_003 + zlib.crc32(name.encode()))
            if isinstance(self.model, PeftModel):
                self.model.add_adapter(name, self._lora_config())  # pyright: ignore[reportUnknownMemberType]
            else:
                self.model = get_peft_model(self.model, self._lora_config(), adapter_name=name)  # pyright: ignore[reportUnknownVariableType, reportAttributeAccessIssue]
        self.model.to(self.device)
        ends = (f".lora_A.{name}.weight", f".lora_B.{name}.weight")
        params = [p for n, p in self.model.named_parameters() if n.endswith(ends)]  # float32, as PEFT makes them
        cfg = self.config
        self._optimizers[name] = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
        self.roles[name] = role
        self.adapter_versions.setdefault(name, 0)
        return name

    def _activate(self, name: str) -> None:
        """Train (and compute logprobs with) adapter ``name`` only: its factors take gradients, its optimiser steps."""
        self.model.set_adapter(name)  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType, reportCallIssue]
        self.optimizer = self._optimizers[name]

    def adapter_state(self, name: str) -> dict[str, torch.Tensor]:
        """Adapter ``name`` as a PEFT state dict (``base_model.model.<module>.lora_A.weight`` ...), copies on CPU."""
        from peft import get_peft_model_state_dict  # pyright: ignore[reportMissingImports]

        state: dict[str, torch.Tensor] = get_peft_model_state_dict(self.model, adapter_name=name)  # pyright: ignore[reportUnknownVariableType]
        return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}

    def export_adapters(self, directory: str | Path) -> dict[str, Path]:
        """Write every adapter in PEFT format to ``directory/<adapter>/`` (``adapter_config.json`` and
        ``adapter_model.safetensors``); returns role -> folder. ``PeftModel.from_pretrained(base, folder)``
        loads one, and so does vLLM (``--enable-lora --lora-modules <role>=<folder>``, docs/adapters.md)."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        folders: dict[str, Path] = {}
        for name, role in self.roles.items():
            self.model.save_pretrained(str(out), selected_adapters=[name])  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType, reportCallIssue]
            folders[role] = out / name
        return folders

    # --- update -------------------------------------------------------------------------------
    def update(self, transitions: Sequence[Transition]) -> dict[str, float]:
        """One update per role present, each on its own adapter with its own optimiser.

        Metrics: per adapter ``train/adapter/<name>/<metric>`` (the ``TorchBackend.update`` metrics of
        that role's update), and over all roles the usual ``train/<metric>``: times and optimiser
        steps summed, the rest averaged weighted by each role's transitions.
        ``train/adapter_skipped_transitions`` counts transitions of calls without a role."""
        groups: dict[str, list[Transition]] = {}
        skipped = 0
        for t in transitions:
            if not t.role:
                skipped += 1
                continue
            if t.prompt_ids and t.response_ids:  # as TorchBackend.update keeps them (a role may have none)
                groups.setdefault(self.adapter_for(t.role), []).append(t)
        if not groups:
            raise ValueError(
                "update() got no transition of a named role; per-role adapters train each role on its own "
                "adapter, and calls that name no role are answered by the base weights (route the agent's "
                "calls through a plugin, or give each client its role)."
            )
        step = self.step
        out: dict[str, float] = {"train/adapter_skipped_transitions": float(skipped)}
        weighted: dict[str, list[tuple[float, int]]] = {}
        for name in sorted(groups):
            self._activate(name)
            self.step = step  # every role's update of this step shuffles with the same seed, as one update would
            metrics = super().update(groups[name])
            self._changed.add(name)
            n = len(groups[name])
            for key, value in metrics.items():
                out[f"train/adapter/{name}/{key.removeprefix('train/')}"] = value
                weighted.setdefault(key, []).append((value, n))
        self.step = step + 1
        for key, values in weighted.items():
            if key in _SUMMED:
                out[key] = sum(v for v, _ in values)
            else:
                total = sum(n for _, n in values)
                out[key] = sum(v * n for v, n in values) / total
        return out

    def logprobs(self, transitions: Sequence[Transition]) -> list[list[float]]:
        """Each transition's logprobs under its role's adapter (the base for a role without one)."""
        out: list[list[float]] = [[] for _ in transitions]
        groups: dict[str | None, list[int]] = {}
        for i, t in enumerate(transitions):
            name = adapter_name(t.role) if t.role else None
            groups.setdefault(name if name in self._optimizers else None, []).append(i)
        for name, idx in groups.items():
            picked = [transitions[i] for i in idx]
            if name is None:
                values = self._base_logprobs(picked)
            else:
                self._activate(name)
                values = self._logprobs_of(self.model, picked)
            for i, v in zip(idx, values, strict=True):
                out[i] = v
        return out

    def _base_logprobs(self, transitions: Sequence[Transition]) -> list[list[float]]:
        from peft import PeftModel  # pyright: ignore[reportMissingImports]

        if not isinstance(self.model, PeftModel):
            return self._logprobs_of(self.model, transitions)
        with self.model.disable_adapter():  # pyright: ignore[reportUnknownMemberType]
            return self._logprobs_of(self.model, transitions)

    def sft(self, *args: Any, **kwargs: Any) -> list[float]:
        raise NotImplementedError(
            "per-role adapters train with policy gradient only; warm-start the base model before (sft_on_chats)."
        )

    def preference_update(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        raise NotImplementedError("per-role adapters train with policy gradient only (update_rule='policy_gradient').")

    # --- weights ------------------------------------------------------------------------------
    def state_dict_for_inference(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError(
            "per-role adapters have no single set of weights to serve: use adapter_state(name) or export_adapters()."
        )

    async def publish(self) -> int:
        """Send the adapters that changed since the last publish to the engine; returns the new model version.

        Unchanged adapters are not sent (the engine keeps them), and neither is the base; after
        ``load_checkpoint`` every adapter is sent once, at the version it was saved with."""
        self.version += 1
        for name in self._changed:
            self.adapter_versions[name] += 1
        send = sorted(self._changed | self._unsent)
        if self.adapter_publisher is not None:
            adapters = {
                name: AdapterWeights(self.adapter_state(name), self.scale, self.adapter_versions[name]) for name in send
            }
            await self.adapter_publisher(adapters, self.version)
        self._changed.clear()
        self._unsent.clear()
        return self.version

    def save_checkpoint(self, directory: str | Path) -> Path:
        """Every adapter (and its optimiser state and version), the step and model version, the RNG
        states; and each adapter in PEFT format under ``directory/adapters/``."""
        path = Path(directory)
        save_checkpoint_file(
            path,
            {
                "adapters": {name: self.adapter_state(name) for name in self.roles},
                "roles": dict(self.roles),
                "optimizers": {name: opt.state_dict() for name, opt in self._optimizers.items()},
                "adapter_versions": dict(self.adapter_versions),
                "step": self.step,
                "version": self.version,
                "config": asdict(self.config),
                "torch_rng": torch.get_rng_state(),
            },
        )
        if self.roles:
            self.export_adapters(path / "adapters")
        return path / "policy.pt"

    def load_checkpoint(self, directory: str | Path) -> None:
        """Restore what ``save_checkpoint`` wrote; the next ``publish()`` sends every adapter to the engine."""
        from peft import set_peft_model_state_dict  # pyright: ignore[reportMissingImports]

        path = Path(directory) / "policy.pt"
        state = load_checkpoint_file(directory, self.device)
        if "adapters" not in state:
            raise ValueError(f"{path} holds no per-role adapters; it was written without adapters='per_role'.")
        for name, role in state["roles"].items():
            if self.adapter_for(role) != name:
                raise ValueError(f"checkpoint adapter {name!r} does not match role {role!r}.")
            set_peft_model_state_dict(self.model, state["adapters"][name], adapter_name=name)  # pyright: ignore[reportUnknownVariableType]
            self._optimizers[name].load_state_dict(state["optimizers"][name])
        self.adapter_versions = {k: int(v) for k, v in state["adapter_versions"].items()}
        self._changed.clear()
        self._unsent = set(self.roles)
        self.step = int(state["step"])
        self.version = int(state["version"])
        torch.set_rng_state(state["torch_rng"])
