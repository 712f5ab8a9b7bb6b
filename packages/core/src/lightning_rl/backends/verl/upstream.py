"""The gateway's upstream when VeRL serves rollouts: several vLLM replicas behind one backend.

VeRL starts one OpenAI-compatible vLLM server per rollout replica (``LLMServerManager``'s
``server_addresses``). The gateway needs exactly one ``GatewayBackend``; this one holds an
``UpstreamBackend`` per replica (each asks vLLM for ``return_token_ids`` and logprobs, so tokens
stay exact) and sends each call to the replica with the fewest calls in flight (ties round-robin). ``load_weights``
only records the version: VeRL's checkpoint engine moves the weights itself (``VerlBackend.publish``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence

from lightning_rl.gateway.upstreams import CallResult, CallSpec, StreamPiece, UpstreamBackend

__all__ = ["ReplicaUpstream"]


class ReplicaUpstream:
    """A ``GatewayBackend`` over several OpenAI-compatible servers (least calls in flight wins)."""

    def __init__(self, addresses: Sequence[str], *, model: str | None = None, api_key: str | None = None) -> None:
        if not addresses:
            raise ValueError("ReplicaUpstream needs at least one server address (VeRL started no replica?).")
        urls = [a if a.startswith(("http://", "https://")) else f"http://{a}" for a in addresses]
        self.replicas = [UpstreamBackend(u, api_key, model=model) for u in urls]
        self.in_flight = [0] * len(self.replicas)
        self._model = model
        self._version = 0
        self._next = 0

    @property
    def model_name(self) -> str:
        """The served model (by default what the first replica's ``/v1/models`` lists, after ``start``)."""
        return self._model or self.replicas[0].model_name

    @property
    def version(self) -> int | None:
        return self._version

    async def start(self) -> None:
        await asyncio.gather(*(r.start() for r in self.replicas))

    async def aclose(self) -> None:
        await asyncio.gather(*(r.aclose() for r in self.replicas))

    async def load_weights(self, path: str | None, version: int) -> None:
        self._version = version
        await asyncio.gather(*(r.load_weights(path, version) for r in self.replicas))

    def _pick(self) -> int:
        """The replica with the fewest calls in flight; ties go round-robin."""
        n = len(self.replicas)
        order = [(self._next + k) % n for k in range(n)]
        best = min(order, key=lambda i: self.in_flight[i])
        self._next = (best + 1) % n
        return best

    async def run(self, spec: CallSpec) -> CallResult:
        i = self._pick()
        self.in_flight[i] += 1
        try:
            return await self.replicas[i].run(spec)
        finally:
            self.in_flight[i] -= 1

    async def stream(self, spec: CallSpec) -> AsyncGenerator[StreamPiece]:
        i = self._pick()
        self.in_flight[i] += 1
        try:
            async for piece in self.replicas[i].stream(spec):
                yield piece
        finally:
            self.in_flight[i] -= 1
