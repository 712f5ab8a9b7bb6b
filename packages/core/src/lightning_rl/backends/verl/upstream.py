"""The gateway's upstream when VeRL serves rollouts: several vLLM replicas behind one backend.

VeRL starts one OpenAI-compatible vLLM server per rollout replica (``LLMServerManager``'s
``server_addresses``). The gateway needs exactly one ``GatewayBackend``; this one holds an
``UpstreamBackend`` per replica (each asks vLLM for ``return_token_ids`` and logprobs, so tokens
stay exact, and retries its own transient failures). ``load_weights`` only records the version:
VeRL's checkpoint engine moves the weights itself (``VerlBackend.publish``).

Which replica answers:

- a call of a rollout (``CallSpec.affinity``) goes to the replica its rollout id hashes to
  (rendezvous hashing over the replicas' URLs), so every turn of a conversation finds the previous
  ones in that server's prefix cache, and a replica that goes away moves only its own rollouts;
- any other call goes to the replica with the fewest calls in flight (ties round-robin);
- a replica that cannot be reached is skipped for ``down_for_s`` and the call goes to the next one
  in the same order (a stream only before its first piece was sent).
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import AsyncGenerator, Sequence

from lightning_rl.gateway.protocol import GatewayHTTPError
from lightning_rl.gateway.upstreams import CallResult, CallSpec, RetryPolicy, StreamPiece, UpstreamBackend

__all__ = ["ReplicaUpstream"]


class ReplicaUpstream:
    """A ``GatewayBackend`` over several OpenAI-compatible servers (see the module docstring).

    Args:
        addresses: The servers (``host:port`` or URLs).
        model: The served model's name (default: what the first replica lists).
        api_key: Sent to every replica.
        down_for_s: How long a replica that could not be reached is passed over.
        retry: Each replica's ``RetryPolicy``.
    """

    def __init__(
        self,
        addresses: Sequence[str],
        *,
        model: str | None = None,
        api_key: str | None = None,
        down_for_s: float = 5.0,
        retry: RetryPolicy | None = None,
    ) -> None:
        if not addresses:
            raise ValueError("ReplicaUpstream needs at least one server address (VeRL started no replica?).")
        urls = [a if a.startswith(("http://", "https://")) else f"http://{a}" for a in addresses]
        self.replicas = [UpstreamBackend(u, api_key, model=model, retry=retry) for u in urls]
        self.in_flight = [0] * len(self.replicas)
        self.down_until = [0.0] * len(self.replicas)
        self.down_for_s = down_for_s
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

    def _least_busy(self) -> int:
        """The replica with the fewest calls in flight; ties go round-robin."""
        n = len(self.replicas)
        order = [(self._next + k) % n for k in range(n)]
        best = min(order, key=lambda i: self.in_flight[i])
        self._next = (best + 1) % n
        return best

    def order(self, spec: CallSpec) -> list[int]:
        """The replicas to try for ``spec``, best first; those recently down come last."""
        n = len(self.replicas)
        if spec.affinity is None:
            first = self._least_busy()
            ranked = [first, *(i for i in range(n) if i != first)]
        else:
            key = spec.affinity.encode()
            ranked = sorted(range(n), key=lambda i: zlib.crc32(self.replicas[i].url.encode(), zlib.crc32(key)))
        now = time.monotonic()
        return sorted(ranked, key=lambda i: self.down_until[i] > now)  # stable: keeps the ranking

    def _failed(self, i: int, exc: GatewayHTTPError) -> None:
        """Pass over replica ``i`` for a while when it could not be reached; re-raise anything else."""
        if exc.code != "upstream_unavailable":
            raise exc
        self.down_until[i] = time.monotonic() + self.down_for_s

    async def run(self, spec: CallSpec) -> CallResult:
        order = self.order(spec)
        for k, i in enumerate(order):
            self.in_flight[i] += 1
            try:
                return await self.replicas[i].run(spec)
            except GatewayHTTPError as exc:
                self._failed(i, exc)
                if k == len(order) - 1:
                    raise
            finally:
                self.in_flight[i] -= 1
        raise AssertionError("unreachable: the last replica's failure is raised")

    async def stream(self, spec: CallSpec) -> AsyncGenerator[StreamPiece]:
        order = self.order(spec)
        for k, i in enumerate(order):
            self.in_flight[i] += 1
            sent = False
            try:
                async for piece in self.replicas[i].stream(spec):
                    sent = True
                    yield piece
                return
            except GatewayHTTPError as exc:
                if sent:
                    raise
                self._failed(i, exc)
                if k == len(order) - 1:
                    raise
            finally:
                self.in_flight[i] -= 1
