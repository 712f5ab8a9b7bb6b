"""The store protocol: every backend and the HTTP client implement ``LightningStore``.

A backend does not decide *what* happens when an attempt ends or expires — ``store._rules`` does,
for all of them — so the in-memory, SQLite, PostgreSQL, Redis and HTTP stores cannot drift apart
(one contract test suite runs against each).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from lightning_rl.types import (
    Attempt,
    AttemptStatus,
    Claim,
    LLMResource,
    Resources,
    Rollout,
    RolloutRequest,
    RolloutStatus,
    Span,
    StoreStats,
)

__all__ = ["LightningStore", "DEFAULT_HEARTBEAT_TIMEOUT_S", "MAX_BATCH", "MAX_PAGE", "now"]

MAX_BATCH = 10_000
"""Most items in one enqueue / add_spans / claim call."""
MAX_PAGE = 10_000
"""Most items one query returns."""
DEFAULT_HEARTBEAT_TIMEOUT_S = 60.0
"""How long an attempt may go without a heartbeat when its rollout's config sets no
``heartbeat_timeout_s``. Without it, an attempt whose worker died (kill -9, a lost machine) would
stay ``running`` forever; with it, every attempt has a deadline. The runner heartbeats at least
every third of it, and the trainer's own default is the same 60 s."""


@runtime_checkable
class LightningStore(Protocol):
    """Where rollouts, attempts, spans and resources live. Every method is safe to call concurrently."""

    # --- rollouts ---------------------------------------------------------------------------
    async def enqueue(self, requests: Sequence[RolloutRequest]) -> list[Rollout]:
        """Queue rollouts. Idempotent on ``request.id``: re-sending an id returns the stored rollout;
        re-sending it with a different task raises ``ConflictError``."""
        ...

    async def claim(self, worker_id: str, n: int = 1, *, timeout_s: float | None = None) -> list[Claim]:
        """Atomically take up to ``n`` queued rollouts (oldest first) and open an attempt on each.

        ``timeout_s`` is the worker's own limit (``lightning-rl runner --timeout``): it becomes the
        attempt's timeout where the rollout's config sets none, so the store enforces the limit the
        worker runs with even when the worker dies."""
        ...

    async def heartbeat(self, attempt_id: str) -> Attempt:
        """Keep a running attempt alive; raises ``IllegalTransitionError`` if it already ended."""
        ...

    async def finish_attempt(
        self,
        attempt_id: str,
        status: AttemptStatus,
        *,
        error: str | None = None,
        reward: float | None = None,
    ) -> Rollout:
        """End an attempt (succeeded, failed or timed_out) and move its rollout on accordingly."""
        ...

    async def cancel(self, rollout_ids: Sequence[str]) -> list[Rollout]:
        """Cancel rollouts that have not ended; ended ones are returned unchanged."""
        ...

    async def get_rollout(self, rollout_id: str) -> Rollout: ...

    async def query_rollouts(
        self,
        *,
        ids: Sequence[str] | None = None,
        status: Sequence[RolloutStatus] | None = None,
        group_id: str | None = None,
        mode: str | None = None,
        limit: int = 1000,
        offset: int = 0,
    ) -> list[Rollout]:
        """Rollouts matching every given filter, in enqueue order."""
        ...

    async def wait_for_rollouts(self, ids: Sequence[str], timeout_s: float) -> list[Rollout]:
        """Block until every rollout in ``ids`` has ended or ``timeout_s`` passed; return the ended ones."""
        ...

    # --- attempts ---------------------------------------------------------------------------
    async def get_attempt(self, attempt_id: str) -> Attempt: ...

    async def query_attempts(self, rollout_id: str) -> list[Attempt]:
        """Attempts of a rollout, first attempt first."""
        ...

    # --- spans ------------------------------------------------------------------------------
    async def add_spans(self, spans: Sequence[Span]) -> int:
        """Store spans; idempotent on ``(trace_id, span_id)``. Returns how many were new."""
        ...

    async def query_spans(
        self,
        *,
        rollout_id: str | None = None,
        attempt_id: str | None = None,
        name: str | None = None,
        limit: int = 10_000,
        offset: int = 0,
    ) -> list[Span]:
        """Spans in arrival order (``seq``) within each attempt."""
        ...

    # --- resources --------------------------------------------------------------------------
    async def add_resources(
        self,
        *,
        llm: LLMResource | None = None,
        prompts: dict[str, str] | None = None,
        extra: dict[str, object] | None = None,
    ) -> Resources:
        """Publish a new immutable resources version (1, 2, ...)."""
        ...

    async def get_resources(self, version: int | None = None) -> Resources:
        """A given version, or the latest when ``version`` is None. ``NotFoundError`` if none."""
        ...

    # --- housekeeping -----------------------------------------------------------------------
    async def expire(self, now: float | None = None) -> int:
        """Time out attempts past their deadline (timeout or missed heartbeat); returns how many.
        Backends call this themselves before claims and queries; servers also run it periodically."""
        ...

    async def prune(self, older_than: float) -> int:
        """Delete ended rollouts (with attempts and spans) that ended before ``older_than``."""
        ...

    async def stats(self) -> StoreStats: ...

    async def close(self) -> None: ...


def now() -> float:
    return time.time()
