"""Row mapping and lifecycle steps shared by the SQL backends.

The SQLite and PostgreSQL stores differ in how they lock and talk to the database, not in what a
claim, a finish or an expiry *does*. That part lives here, as plain functions over the pydantic
models, written as a line-by-line mirror of ``MemoryStore`` (the reference backend). A backend
loads rows, calls these functions, and writes the changed models back, so its semantics cannot
drift from the in-memory store's.

Column order is fixed by the ``*_COLUMNS`` tuples: both backends select exactly these columns and
build models with ``rollout_from_row`` / ``attempt_from_row``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TypeVar

from pydantic import BaseModel

from lightning_rl.errors import ConflictError, InvalidRequestError, NotFoundError
from lightning_rl.store._spanjson import dump_span
from lightning_rl.store.base import (
    attempt_deadline,
    attempt_outcome,
    attempt_timeout,
    check_batch,
    check_reward,
    same_request,
    set_rollout_status,
)
from lightning_rl.types import (
    TERMINAL_ROLLOUT,
    Attempt,
    AttemptStatus,
    Resources,
    RetryReason,
    Rollout,
    RolloutConfig,
    RolloutRequest,
    RolloutStatus,
    Span,
    Task,
    check_attempt_transition,
    check_rollout_transition,
    new_id,
)

__all__ = [
    "ROLLOUT_COLUMNS",
    "ATTEMPT_COLUMNS",
    "SPAN_COLUMNS",
    "WAITING",
    "TERMINAL",
    "rollout_from_row",
    "rollout_insert_params",
    "rollout_update_params",
    "attempt_from_row",
    "attempt_insert_params",
    "attempt_update_params",
    "span_insert_params",
    "span_from_data",
    "resources_to_data",
    "resources_from_data",
    "normalised",
    "check_resend",
    "check_claim_args",
    "check_finish_status",
    "check_finish",
    "check_span_targets",
    "open_attempt",
    "end_attempt",
    "cancel_rollout",
    "unshared",
    "rollout_not_found",
    "attempt_not_found",
    "resources_not_found",
]

ROLLOUT_COLUMNS = (
    "seq",
    "id",
    "task",
    "group_id",
    "mode",
    "resources_version",
    "config",
    "metadata",
    "status",
    "attempt_count",
    "created_at",
    "updated_at",
    "ended_at",
    "final_reward",
    "error",
)
"""Columns of the rollouts table, in the order ``rollout_from_row`` reads them."""

ATTEMPT_COLUMNS = (
    "id",
    "rollout_id",
    "number",
    "worker_id",
    "status",
    "started_at",
    "heartbeat_at",
    "ended_at",
    "deadline",
    "error",
    "reward",
    "timeout_s",
    "gateway_key",
)
"""Columns of the attempts table that make an ``Attempt`` (the table also has ``seq`` and ``span_count``)."""

SPAN_COLUMNS = ("trace_id", "span_id", "rollout_id", "attempt_id", "attempt_seq", "seq", "name", "data")
"""Columns of the spans table; ``data`` is the whole span as JSON, the rest are for lookups and order."""

WAITING: tuple[str, ...] = (RolloutStatus.QUEUED.value, RolloutStatus.REQUEUED.value)
"""Statuses a claim takes rollouts from (SQL literals, also used in partial index predicates)."""

TERMINAL: tuple[str, ...] = tuple(sorted(s.value for s in TERMINAL_ROLLOUT))
"""Statuses after which a rollout never changes again."""


# --------------------------------------------------------------------------------------------
# Row mapping
# --------------------------------------------------------------------------------------------


def _json_text(value: Any) -> str:
    # A driver may hand back a JSON column as text (SQLite) or as already-parsed data.
    return value if isinstance(value, str) else json.dumps(value)


def rollout_from_row(row: Sequence[Any]) -> Rollout:
    """Build a ``Rollout`` from a row selected as ``ROLLOUT_COLUMNS``."""
    metadata = row[7]
    return Rollout(
        seq=row[0],
        id=row[1],
        task=Task.model_validate_json(_json_text(row[2])),
        group_id=row[3],
        mode=row[4],
        resources_version=row[5],
        config=RolloutConfig.model_validate_json(_json_text(row[6])),
        metadata=json.loads(metadata) if isinstance(metadata, str) else metadata,
        status=RolloutStatus(row[8]),
        attempt_count=row[9],
        created_at=row[10],
        updated_at=row[11],
        ended_at=row[12],
        final_reward=row[13],
        error=row[14],
    )


def rollout_insert_params(r: Rollout) -> tuple[Any, ...]:
    """Values for every ``ROLLOUT_COLUMNS`` column except ``seq`` (JSON columns as text)."""
    return (
        r.id,
        r.task.model_dump_json(),
        r.group_id,
        r.mode,
        r.resources_version,
        r.config.model_dump_json(),
        json.dumps(r.metadata),
        r.status.value,
        r.attempt_count,
        r.created_at,
        r.updated_at,
        r.ended_at,
        r.final_reward,
        r.error,
    )


def rollout_update_params(r: Rollout) -> tuple[Any, ...]:
    """``(status, attempt_count, updated_at, ended_at, final_reward, error, id)`` for an UPDATE."""
    return (r.status.value, r.attempt_count, r.updated_at, r.ended_at, r.final_reward, r.error, r.id)


def attempt_from_row(row: Sequence[Any]) -> Attempt:
    """Build an ``Attempt`` from a row selected as ``ATTEMPT_COLUMNS``."""
    return Attempt(
        id=row[0],
        rollout_id=row[1],
        number=row[2],
        worker_id=row[3],
        status=AttemptStatus(row[4]),
        started_at=row[5],
        heartbeat_at=row[6],
        ended_at=row[7],
        deadline=row[8],
        error=row[9],
        reward=row[10],
        timeout_s=row[11],
        gateway_key=row[12],
    )


def attempt_insert_params(a: Attempt) -> tuple[Any, ...]:
    """Values for every ``ATTEMPT_COLUMNS`` column, in order."""
    return (
        a.id,
        a.rollout_id,
        a.number,
        a.worker_id,
        a.status.value,
        a.started_at,
        a.heartbeat_at,
        a.ended_at,
        a.deadline,
        a.error,
        a.reward,
        a.timeout_s,
        a.gateway_key,
    )


def attempt_update_params(a: Attempt) -> tuple[Any, ...]:
    """``(status, heartbeat_at, ended_at, deadline, error, reward, id)`` for an UPDATE."""
    return (a.status.value, a.heartbeat_at, a.ended_at, a.deadline, a.error, a.reward, a.id)


def span_insert_params(span: Span, attempt_seq: int, seq: int) -> tuple[Any, ...]:
    """Values for ``SPAN_COLUMNS``; the stored JSON carries the store-assigned ``seq``."""
    data = dump_span(span, seq)
    return (span.trace_id, span.span_id, span.rollout_id, span.attempt_id, attempt_seq, seq, span.name, data)


def span_from_data(data: Any) -> Span:
    """Rebuild a span from its ``data`` column."""
    return Span.model_validate_json(_json_text(data))


def resources_to_data(res: Resources) -> str:
    return res.model_dump_json()


def resources_from_data(data: Any) -> Resources:
    return Resources.model_validate_json(_json_text(data))


# --------------------------------------------------------------------------------------------
# Checks (same messages as MemoryStore)
# --------------------------------------------------------------------------------------------


def normalised(request: RolloutRequest) -> RolloutRequest:
    """The request as it reads back after a trip through JSON columns (tuples become lists, …),
    so an idempotent re-send compares equal to what the database holds."""
    return RolloutRequest.model_validate_json(request.model_dump_json())


def check_resend(stored: Rollout, request: RolloutRequest) -> None:
    """Raise ``ConflictError`` unless a re-sent ``request`` matches the stored rollout."""
    if not same_request(stored, request):
        raise ConflictError(
            f"rollout id {request.id} already exists with a different task or config; use a new id for a new rollout."
        )


def check_claim_args(worker_id: str, n: int, timeout_s: float | None = None) -> None:
    attempt_timeout(RolloutConfig(), timeout_s)
    if n < 1:
        raise InvalidRequestError(f"claim n must be >= 1, got {n}.")
    check_batch("claim", n)
    if not worker_id:
        raise InvalidRequestError("worker_id must be a non-empty string.")


def check_finish_status(status: AttemptStatus) -> None:
    if status not in (AttemptStatus.SUCCEEDED, AttemptStatus.FAILED, AttemptStatus.TIMED_OUT):
        raise InvalidRequestError(f"finish_attempt status must be succeeded, failed or timed_out, not {status}.")


def check_finish(status: AttemptStatus, reward: float | None) -> None:
    """``check_finish_status`` plus a finite reward (see ``check_reward``)."""
    check_finish_status(status)
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


M = TypeVar("M", bound=BaseModel)


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
# Lifecycle steps (mutate the models in place, like MemoryStore does under its lock)
# --------------------------------------------------------------------------------------------


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
    outcome = attempt_outcome(rollout, status, reason, error)
    set_rollout_status(rollout, outcome.rollout_status, outcome.error, t)
    attempt.status = status
    attempt.ended_at = t
    attempt.error = error
    attempt.reward = reward
    attempt.deadline = None
    if status is AttemptStatus.SUCCEEDED:
        rollout.final_reward = reward


def cancel_rollout(rollout: Rollout, running: Attempt | None, t: float) -> bool:
    """Cancel a rollout that has not ended (and its running attempt); return whether it changed."""
    if rollout.status in TERMINAL_ROLLOUT:
        return False
    if running is not None:
        end_attempt(rollout, running, AttemptStatus.CANCELLED, None, "cancelled", None, t)
    else:
        set_rollout_status(rollout, RolloutStatus.CANCELLED, "cancelled", t)
    return True
