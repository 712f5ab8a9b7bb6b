"""What the store's operations *do*, as plain functions over the pydantic models.

Every backend's primitives load rows, call these functions, and save the changed models back, so a
claim, a finish, a cancel or an expiry means the same on every backend: ``attempt_outcome`` alone
decides what an ending attempt does to its rollout, ``attempt_deadline`` when an attempt times out.
The argument checks and error messages every backend (and the HTTP client) shares are here too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

from pydantic import BaseModel

from lightning_rl.errors import ConflictError, InvalidRequestError, NotFoundError, StoreUnavailableError
from lightning_rl.store.base import DEFAULT_HEARTBEAT_TIMEOUT_S, MAX_BATCH, MAX_PAGE
from lightning_rl.types import (
    TERMINAL_ROLLOUT,
    Attempt,
    AttemptStatus,
    RetryReason,
    Rollout,
    RolloutConfig,
    RolloutRequest,
    RolloutStatus,
    Span,
    check_attempt_transition,
    check_rollout_transition,
    new_id,
)

__all__ = [
    "WAITING",
    "LAYOUT_VERSION",
    "check_layout",
    "attempt_outcome",
    "attempt_timeout",
    "attempt_deadline",
    "expiry_reason",
    "check_batch",
    "check_page",
    "check_reward",
    "normalised",
    "plan_enqueue",
    "check_resend",
    "check_claim_args",
    "check_finish",
    "check_span_targets",
    "open_attempt",
    "end_attempt",
    "beat",
    "cancel",
    "expire",
    "unshared",
    "rollout_not_found",
    "attempt_not_found",
    "resources_not_found",
]

WAITING = (RolloutStatus.QUEUED, RolloutStatus.REQUEUED)
"""Statuses a claim takes rollouts from."""
LAYOUT_VERSION = 1
"""The layout of stored rows and keys this Lightning reads and writes; every backend keeps it beside the data."""

M = TypeVar("M", bound=BaseModel)


# --------------------------------------------------------------------------------------------
# Decisions
# --------------------------------------------------------------------------------------------


def attempt_outcome(
    rollout: Rollout,
    attempt_status: AttemptStatus,
    reason: RetryReason | None,
    error: str | None,
) -> tuple[RolloutStatus, str | None]:
    """The rollout's next status (and error) when its current attempt ends.

    ``reason`` is ``heartbeat`` when the store declared the worker lost. A retryable ending with
    attempts left requeues the rollout; otherwise the rollout ends: a lost worker ends it ``failed``
    (the work itself did not run out of time), a timeout ends it ``timed_out``.
    """
    if attempt_status is AttemptStatus.SUCCEEDED:
        return RolloutStatus.SUCCEEDED, None
    if attempt_status is AttemptStatus.CANCELLED:
        return RolloutStatus.CANCELLED, error
    retry_reason: RetryReason = reason or ("timed_out" if attempt_status is AttemptStatus.TIMED_OUT else "failed")
    if retry_reason in rollout.config.retry_on and rollout.attempt_count < rollout.config.max_attempts:
        return RolloutStatus.REQUEUED, error
    if rollout.attempt_count > 1:
        error = f"gave up after {rollout.attempt_count} attempts; last: {error}"
    if retry_reason == "heartbeat" or attempt_status is AttemptStatus.FAILED:
        return RolloutStatus.FAILED, error
    return RolloutStatus.TIMED_OUT, error


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


# --------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------


def check_layout(found: object, where: str, instead: str) -> None:
    """Refuse data that another Lightning version laid out (``found``: the version stored at ``where``)."""
    if str(found) != str(LAYOUT_VERSION):
        raise StoreUnavailableError(
            f"{where} has layout version {found}, this Lightning expects {LAYOUT_VERSION}; "
            f"use {instead} or the matching Lightning version."
        )


def check_batch(what: str, n: int) -> None:
    if n > MAX_BATCH:
        raise InvalidRequestError(f"{what}: {n} items in one call; send at most {MAX_BATCH} per call.")


def check_page(limit: int, offset: int) -> None:
    if not 0 < limit <= MAX_PAGE:
        raise InvalidRequestError(f"limit must be between 1 and {MAX_PAGE}, got {limit}.")
    if offset < 0:
        raise InvalidRequestError(f"offset must be >= 0, got {offset}.")


def check_reward(reward: float | None) -> None:
    """Refuse a reward that is not a finite number: NaN or infinity would be stored as null next to
    a ``succeeded`` status, and would poison every advantage of its group."""
    if reward is not None and not math.isfinite(reward):
        raise InvalidRequestError(
            f"reward must be a finite number, got {reward!r}; clip or replace NaN/inf before finishing the attempt."
        )


def normalised(request: RolloutRequest) -> RolloutRequest:
    """The request as it reads back after a trip through JSON (tuples become lists, …), so an
    idempotent re-send compares equal to what a backend holds."""
    return RolloutRequest.model_validate_json(request.model_dump_json())


def check_resend(stored: Rollout, request: RolloutRequest) -> None:
    """Raise ``ConflictError`` unless a re-sent ``request`` carries the content of the stored rollout."""
    fields = ("task", "group_id", "mode", "resources_version", "config", "metadata")
    if not all(getattr(stored, f) == getattr(request, f) for f in fields):
        raise ConflictError(
            f"rollout id {request.id} already exists with a different task or config; use a new id for a new rollout."
        )


def plan_enqueue(requests: Sequence[RolloutRequest], found: dict[str, Rollout], t: float) -> list[Rollout]:
    """The new rollouts to insert for ``requests`` (``seq`` left to the backend), given the stored
    ones in ``found`` (updated with the new ones). Checks every re-send first: all or nothing."""
    fresh: list[Rollout] = []
    for req in requests:
        stored = found.get(req.id)
        if stored is not None:
            check_resend(stored, req)
            continue
        rollout = Rollout(**req.model_dump(), created_at=t, updated_at=t)
        found[req.id] = rollout
        fresh.append(rollout)
    return fresh


def check_claim_args(worker_id: str, n: int, timeout_s: float | None = None) -> None:
    if n < 1:
        raise InvalidRequestError(f"claim n must be >= 1, got {n}.")
    check_batch("claim", n)
    if not worker_id:
        raise InvalidRequestError("worker_id must be a non-empty string.")
    attempt_timeout(RolloutConfig(), timeout_s)  # refuse a bad timeout before claiming anything


def check_finish(status: AttemptStatus, reward: float | None) -> None:
    """Only a worker's endings (not ``cancelled``), with a finite reward (see ``check_reward``)."""
    if status not in (AttemptStatus.SUCCEEDED, AttemptStatus.FAILED, AttemptStatus.TIMED_OUT):
        raise InvalidRequestError(f"finish_attempt status must be succeeded, failed or timed_out, not {status}.")
    check_reward(reward)


def check_span_targets(spans: Sequence[Span], attempt_rollout: dict[str, str]) -> None:
    """Raise ``NotFoundError`` for the first span whose attempt does not exist or belongs to
    another rollout. ``attempt_rollout`` maps each existing attempt id to its rollout id."""
    for span in spans:
        if attempt_rollout.get(span.attempt_id) != span.rollout_id:
            raise NotFoundError(
                f"span {span.span_id} names attempt {span.attempt_id} of rollout {span.rollout_id}, "
                "which does not exist; spans must belong to a claimed attempt."
            )


def unshared(items: Sequence[M]) -> list[M]:
    """``items`` with every repeated object replaced by a deep copy (a caller may list one id twice),
    so no two returned models alias each other. Fresh objects are not copied: that is the hot path."""
    seen: set[int] = set()
    out: list[M] = []
    for item in items:
        out.append(item.model_copy(deep=True) if id(item) in seen else item)
        seen.add(id(item))
    return out


def rollout_not_found(rollout_id: str) -> NotFoundError:
    return NotFoundError(f"rollout {rollout_id} does not exist.")


def attempt_not_found(attempt_id: str) -> NotFoundError:
    return NotFoundError(f"attempt {attempt_id} does not exist.")


def resources_not_found(version: int | None, latest: int) -> NotFoundError:
    if version is None or latest == 0:
        return NotFoundError("no resources published yet; call add_resources first.")
    return NotFoundError(f"resources version {version} does not exist (latest is {latest}).")


# --------------------------------------------------------------------------------------------
# Lifecycle steps (mutate the models in place; the backend saves them)
# --------------------------------------------------------------------------------------------


def _set_status(rollout: Rollout, status: RolloutStatus, error: str | None, t: float) -> None:
    """Apply a checked status change to ``rollout`` (``ended_at`` is set when it ends)."""
    check_rollout_transition(rollout.id, rollout.status, status)
    rollout.status = status
    rollout.updated_at = t
    rollout.error = error
    if status in TERMINAL_ROLLOUT:
        rollout.ended_at = t


def open_attempt(rollout: Rollout, worker_id: str, t: float, worker_timeout_s: float | None = None) -> Attempt:
    """Move a waiting rollout to running and return the attempt opened for it (see ``attempt_timeout``)."""
    check_rollout_transition(rollout.id, rollout.status, RolloutStatus.RUNNING)
    rollout.status = RolloutStatus.RUNNING
    rollout.attempt_count += 1
    rollout.updated_at = t
    timeout = attempt_timeout(rollout.config, worker_timeout_s)
    return Attempt(
        id=new_id("at-"),
        rollout_id=rollout.id,
        number=rollout.attempt_count,
        worker_id=worker_id,
        started_at=t,
        heartbeat_at=t,
        deadline=attempt_deadline(rollout.config, t, t, timeout),
        timeout_s=timeout,
    )


def end_attempt(
    rollout: Rollout,
    attempt: Attempt,
    status: AttemptStatus,
    reason: RetryReason | None,
    error: str | None,
    reward: float | None,
    t: float,
) -> None:
    """End ``attempt`` with ``status`` and move ``rollout`` on as ``attempt_outcome`` decides.

    Raises ``IllegalTransitionError`` (changing nothing) if the attempt already ended.
    """
    check_attempt_transition(attempt.id, attempt.status, status)
    _set_status(rollout, *attempt_outcome(rollout, status, reason, error), t)
    attempt.status = status
    attempt.ended_at = t
    attempt.error = error
    attempt.reward = reward
    attempt.deadline = None
    if status is AttemptStatus.SUCCEEDED:
        rollout.final_reward = reward


def beat(rollout: Rollout, attempt: Attempt, t: float) -> None:
    """A heartbeat: push a running attempt's deadline out (``IllegalTransitionError`` if it ended)."""
    if attempt.status is not AttemptStatus.RUNNING:
        check_attempt_transition(attempt.id, attempt.status, AttemptStatus.RUNNING)
    attempt.heartbeat_at = t
    attempt.deadline = attempt_deadline(rollout.config, attempt.started_at, t, attempt.timeout_s)


def cancel(rollout: Rollout, running: Attempt | None, t: float) -> bool:
    """Cancel a rollout that has not ended (and its running attempt); return whether it changed."""
    if rollout.status in TERMINAL_ROLLOUT:
        return False
    if running is not None:
        end_attempt(rollout, running, AttemptStatus.CANCELLED, None, "cancelled", None, t)
    else:
        _set_status(rollout, RolloutStatus.CANCELLED, "cancelled", t)
    return True


def expire(rollout: Rollout, attempt: Attempt, t: float, ended_at: float) -> None:
    """Time out an attempt found past its deadline at ``t`` (``expiry_reason`` says why)."""
    reason, message = expiry_reason(rollout.config, attempt, t)
    end_attempt(rollout, attempt, AttemptStatus.TIMED_OUT, reason, message, None, ended_at)
