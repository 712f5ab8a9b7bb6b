"""The store protocol and the lifecycle rules every backend shares.

A backend implements ``LightningStore``; it does not decide *what* happens when an attempt ends
or expires — ``attempt_outcome`` does, for all of them — so the in-memory, SQLite, PostgreSQL and
HTTP stores cannot drift apart (one contract test suite runs against each).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from lightning_rl.errors import InvalidRequestError
from lightning_rl.types import (
    TERMINAL_ROLLOUT,
    Attempt,
    AttemptStatus,
    Claim,
    LLMResource,
    Resources,
    RetryReason,
    Rollout,
    RolloutConfig,
    RolloutRequest,
    RolloutStatus,
    Span,
    StoreStats,
    check_rollout_transition,
)

__all__ = [
    "LightningStore",
    "Outcome",
    "attempt_outcome",
    "attempt_deadline",
    "attempt_timeout",
    "expiry_reason",
    "check_reward",
    "DEFAULT_HEARTBEAT_TIMEOUT_S",
    "now",
    "same_request",
    "set_rollout_status",
    "MAX_BATCH",
    "MAX_PAGE",
    "check_batch",
    "check_page",
]

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


# --------------------------------------------------------------------------------------------
# Shared rules
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What an ending attempt does to its rollout."""

    rollout_status: RolloutStatus
    error: str | None


def attempt_outcome(
    rollout: Rollout,
    attempt_status: AttemptStatus,
    reason: RetryReason | None,
    error: str | None,
) -> Outcome:
    """Decide the rollout's next status when its current attempt ends.

    ``reason`` is ``heartbeat`` when the store declared the worker lost. A retryable ending with
    attempts left requeues the rollout; otherwise the rollout ends: a lost worker ends it ``failed``
    (the work itself did not run out of time), a timeout ends it ``timed_out``.
    """
    if attempt_status is AttemptStatus.SUCCEEDED:
        return Outcome(RolloutStatus.SUCCEEDED, None)
    if attempt_status is AttemptStatus.CANCELLED:
        return Outcome(RolloutStatus.CANCELLED, error)
    retry_reason: RetryReason = reason or ("timed_out" if attempt_status is AttemptStatus.TIMED_OUT else "failed")
    if retry_reason in rollout.config.retry_on and rollout.attempt_count < rollout.config.max_attempts:
        return Outcome(RolloutStatus.REQUEUED, error)
    if rollout.attempt_count > 1:
        error = f"gave up after {rollout.attempt_count} attempts; last: {error}"
    if retry_reason == "heartbeat" or attempt_status is AttemptStatus.FAILED:
        return Outcome(RolloutStatus.FAILED, error)
    return Outcome(RolloutStatus.TIMED_OUT, error)


def attempt_timeout(config: RolloutConfig, worker_timeout_s: float | None) -> float | None:
    """An attempt's wall-clock limit: the rollout's ``timeout_s``, else the claiming worker's."""
    if worker_timeout_s is not None and not (math.isfinite(worker_timeout_s) and worker_timeout_s > 0):
        raise InvalidRequestError(f"claim timeout_s must be a positive number of seconds, got {worker_timeout_s}.")
    return config.timeout_s if config.timeout_s is not None else worker_timeout_s


def _heartbeat_timeout(config: RolloutConfig) -> float:
    hb = config.heartbeat_timeout_s
    return hb if hb is not None else DEFAULT_HEARTBEAT_TIMEOUT_S


def attempt_deadline(
    config: RolloutConfig, started_at: float, heartbeat_at: float, timeout_s: float | None = None
) -> float:
    """The earliest time the store must time out an attempt.

    Every attempt has one: the heartbeat rule (the config's ``heartbeat_timeout_s`` or
    ``DEFAULT_HEARTBEAT_TIMEOUT_S``) always applies, and ``timeout_s`` (the attempt's own limit,
    see ``attempt_timeout``) may end it sooner.
    """
    deadline = heartbeat_at + _heartbeat_timeout(config)
    if timeout_s is not None:
        deadline = min(deadline, started_at + timeout_s)
    return deadline


def expiry_reason(config: RolloutConfig, attempt: Attempt, now: float) -> tuple[RetryReason, str]:
    """Why an attempt past its deadline expired, with a message that says what happened."""
    timeout = attempt.timeout_s
    if timeout is not None and now >= attempt.started_at + timeout:
        whose = "rollout" if config.timeout_s is not None else "worker's (--timeout)"
        return "timed_out", f"attempt ran past the {whose} timeout of {timeout:g} s"
    hb = _heartbeat_timeout(config)
    return "heartbeat", f"worker {attempt.worker_id} sent no heartbeat for {hb:g} s (worker lost?)"


def check_reward(reward: float | None) -> None:
    """Refuse a reward that is not a finite number: NaN or infinity would be stored as null next to
    a ``succeeded`` status, and would poison every advantage of its group."""
    if reward is not None and not math.isfinite(reward):
        raise InvalidRequestError(
            f"reward must be a finite number, got {reward!r}; clip or replace NaN/inf before finishing the attempt."
        )


def set_rollout_status(rollout: Rollout, status: RolloutStatus, error: str | None, t: float) -> None:
    """Apply a checked status change to ``rollout`` (``ended_at`` is set when it ends)."""
    check_rollout_transition(rollout.id, rollout.status, status)
    rollout.status = status
    rollout.updated_at = t
    rollout.error = error
    if status in TERMINAL_ROLLOUT:
        rollout.ended_at = t


def same_request(stored: Rollout, request: RolloutRequest) -> bool:
    """Whether a re-sent enqueue carries the same content as what is stored (idempotency check)."""
    fields = ("task", "group_id", "mode", "resources_version", "config", "metadata")
    return all(getattr(stored, f) == getattr(request, f) for f in fields)


def check_batch(what: str, n: int) -> None:
    if n > MAX_BATCH:
        raise InvalidRequestError(f"{what}: {n} items in one call; send at most {MAX_BATCH} per call.")


def check_page(limit: int, offset: int) -> None:
    if not 0 < limit <= MAX_PAGE:
        raise InvalidRequestError(f"limit must be between 1 and {MAX_PAGE}, got {limit}.")
    if offset < 0:
        raise InvalidRequestError(f"offset must be >= 0, got {offset}.")


def now() -> float:
    return time.time()
