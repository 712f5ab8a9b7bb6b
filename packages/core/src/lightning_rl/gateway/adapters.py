"""Serve each trainable role from its own LoRA adapter, in one engine over one copy of the base weights.

With per-role adapters (``TrainerConfig.adapters = "per_role"``) the trainer keeps one LoRA adapter per
trainable role and publishes them into the engine by name (``TransformersEngine.load_adapters``).
``RoleAdaptersBackend`` picks, per call, the adapter of the call's role when the engine has one, and
otherwise the base weights: a frozen role, a call that named no role, or a trainable role before
its first update (a fresh adapter is a no-op, so the base is exactly what it would say). The choice
travels with the request (``SamplingParams.adapter``), so the engine decodes the rows of every role
together in one batch; the engine reports the adapter and its version, which the gateway records on
the call's span (``lightning.adapter``, ``lightning.adapter_version``).

It is an ``EngineBackend`` that routes (new weights from ``POST /admin/weights`` replace the base;
the adapters stay loaded over them): the gateway formats and records its calls like any other.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from dataclasses import replace
from typing import Any

from lightning_rl.gateway.upstreams import CallResult, CallSpec, EngineBackend, StreamPiece
from lightning_rl.roles import adapter_name

__all__ = ["RoleAdaptersBackend"]


class RoleAdaptersBackend(EngineBackend):
    """Route each call of ``engine_backend``'s engine to its role's adapter (see the module docstring).

    Args:
        engine_backend: Serves the engine, which must have adapters enabled (``enable_adapters``).
        is_trainable: ``role -> bool``, asked per call; a role it refuses is answered by the base even
            if an adapter of its name is loaded. Default: every role with a loaded adapter.
    """

    def __init__(self, engine_backend: EngineBackend, is_trainable: Callable[[str | None], bool] | None = None) -> None:
        super().__init__(engine_backend.engine, owns_engine=engine_backend.owns_engine)
        self.is_trainable = is_trainable
        self.adapter_calls = 0
        """Calls answered by an adapter (for metrics and tests); the others were answered by the base."""

    def adapter_for(self, role: str | None) -> str | None:
        """The adapter that answers a call of ``role`` now, or None for the base weights."""
        if not role or (self.is_trainable is not None and not self.is_trainable(role)):
            return None
        name = adapter_name(role)
        engine: Any = self.engine  # an engine with adapters (``TransformersEngine``)
        return name if name in engine.adapter_names else None

    def _routed(self, spec: CallSpec) -> CallSpec:
        name = self.adapter_for(spec.role)
        if name is None:
            return spec
        self.adapter_calls += 1
        return replace(spec, params=replace(spec.params, adapter=name))

    async def run(self, spec: CallSpec) -> CallResult:
        return await super().run(self._routed(spec))

    def stream(self, spec: CallSpec) -> AsyncGenerator[StreamPiece]:
        return super().stream(self._routed(spec))
