"""Serve the roles that are not trained from weights that training never touches.

In a multi-agent app trained one role at a time, every role usually calls the same model. With one
set of weights the untrained roles change too: each update to the trainable role also moves what
the planner or the writer says, and a frozen role that drifts can break the whole run (it stops
handing off, or formats its messages differently). ``FrozenRolesBackend`` answers each call from one
of two upstreams by the call's role: the policy under training, or a second copy of the starting
weights that ``publish()`` never reaches. Weight loads go to the policy only, so the frozen side's
calls keep recording the starting version.

It is a plain ``GatewayBackend``: the gateway formats and records its calls like any other.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable

from lightning_rl.gateway.upstreams import CallResult, CallSpec, GatewayBackend, OnResult, StreamPiece, call_starter

__all__ = ["FrozenRolesBackend"]


class FrozenRolesBackend:
    """Route each call to ``policy`` or, when ``is_frozen(call's role)``, to ``frozen``.

    Args:
        policy: Serves the trainable roles (and role-less calls ``is_frozen`` keeps); it names the
            served model and takes weight loads.
        frozen: Serves the frozen roles; its weights never change here.
        is_frozen: ``role -> bool`` (``None``: no role), asked per call, so a plugin's
            ``instrument(trainable=...)`` made after the gateway started still counts.
    """

    def __init__(self, policy: GatewayBackend, frozen: GatewayBackend, is_frozen: Callable[[str | None], bool]) -> None:
        self.policy = policy
        self.frozen = frozen
        self.is_frozen = is_frozen
        self.frozen_calls = 0
        """Calls answered from the frozen weights (for metrics and tests)."""

    @property
    def model_name(self) -> str:
        return self.policy.model_name

    @property
    def version(self) -> int | None:
        return self.policy.version

    def _pick(self, spec: CallSpec) -> GatewayBackend:
        if self.is_frozen(spec.role):
            self.frozen_calls += 1
            return self.frozen
        return self.policy

    async def start(self) -> None:
        await self.policy.start()
        await self.frozen.start()

    async def aclose(self) -> None:
        results = await asyncio.gather(self.policy.aclose(), self.frozen.aclose(), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def run(self, spec: CallSpec) -> CallResult:
        return await self._pick(spec).run(spec)

    def start_call(self, spec: CallSpec, on_done: OnResult) -> None:
        """The callback form (see ``GatewayBackend``), kept when the chosen side has it."""
        call_starter(self._pick(spec))(spec, on_done)

    def stream(self, spec: CallSpec) -> AsyncGenerator[StreamPiece]:
        return self._pick(spec).stream(spec)

    async def load_weights(self, path: str | None, version: int) -> None:
        """New weights for the policy; the frozen side keeps its own."""
        await self.policy.load_weights(path, version)

    def body_bound(self) -> int | None:
        """The smaller of the two sides' bounds (see ``EngineBackend.body_bound``), if both know one."""
        bounds: list[int | None] = []
        for side in (self.policy, self.frozen):
            bound: Callable[[], int | None] | None = getattr(side, "body_bound", None)
            bounds.append(bound() if bound is not None else None)
        known = [b for b in bounds if b is not None]
        return min(known) if len(known) == len(bounds) else None
