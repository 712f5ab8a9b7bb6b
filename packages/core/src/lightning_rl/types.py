"""The data model shared by the store, the gateway, the runner and the trainer.

Everything that crosses a process boundary is one of these pydantic models, so the HTTP store,
the SQL backends and the in-memory store serialise identically. Rollouts and attempts are state
machines: ``check_rollout_transition`` / ``check_attempt_transition`` are the only gate through
which a status changes, so a rollout that timed out can never be reported as succeeded.
"""

from __future__ import annotations

import re
import secrets
import time
import uuid
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from lightning_rl.errors import IllegalTransitionError

__all__ = [
    # statuses
    "RolloutStatus",
    "AttemptStatus",
    "RetryReason",
    "TERMINAL_ROLLOUT",
    "check_rollout_transition",
    "check_attempt_transition",
    # records
    "Task",
    "RolloutConfig",
    "RolloutRequest",
    "Rollout",
    "Attempt",
    "Claim",
    "SpanStatus",
    "SpanEvent",
    "Span",
    "LLMResource",
    "Resources",
    "Transition",
    "TransitionText",
    "StoreStats",
    "new_id",
]


_URL_SAFE_ID = re.compile(r"[A-Za-z0-9_.:-]+")
"""Rollout ids appear in gateway URL paths, so they stay URL-safe."""


def new_id(prefix: str = "") -> str:
    """A random, URL-safe id (``prefix`` + 32 hex chars)."""
    return f"{prefix}{uuid.uuid4().hex}"


def new_gateway_key() -> str:
    """A fresh attempt key (``Attempt.gateway_key``): 144 random bits, URL-safe."""
    return secrets.token_urlsafe(18)


# --------------------------------------------------------------------------------------------
# Statuses
# --------------------------------------------------------------------------------------------


class RolloutStatus(StrEnum):
    """Lifecycle of a rollout. ``requeued`` means an attempt ended and another one will run."""

    QUEUED = "queued"
    RUNNING = "running"
    REQUEUED = "requeued"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"


class AttemptStatus(StrEnum):
    """Lifecycle of one try of a rollout by one worker."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"


TERMINAL_ROLLOUT: frozenset[RolloutStatus] = frozenset(
    {RolloutStatus.SUCCEEDED, RolloutStatus.FAILED, RolloutStatus.TIMED_OUT, RolloutStatus.CANCELLED}
)

_ROLLOUT_NEXT: dict[RolloutStatus, frozenset[RolloutStatus]] = {
    RolloutStatus.QUEUED: frozenset({RolloutStatus.RUNNING, RolloutStatus.CANCELLED}),
    RolloutStatus.REQUEUED: frozenset({RolloutStatus.RUNNING, RolloutStatus.CANCELLED}),
    RolloutStatus.RUNNING: frozenset(
        {
            RolloutStatus.SUCCEEDED,
            RolloutStatus.FAILED,
            RolloutStatus.TIMED_OUT,
            RolloutStatus.CANCELLED,
            RolloutStatus.REQUEUED,
        }
    ),
}

_ATTEMPT_NEXT: dict[AttemptStatus, frozenset[AttemptStatus]] = {
    AttemptStatus.RUNNING: frozenset(
        {AttemptStatus.SUCCEEDED, AttemptStatus.FAILED, AttemptStatus.TIMED_OUT, AttemptStatus.CANCELLED}
    ),
}


def check_rollout_transition(rollout_id: str, old: RolloutStatus, new: RolloutStatus) -> None:
    """Raise ``IllegalTransitionError`` unless ``old -> new`` is allowed for a rollout."""
    if new not in _ROLLOUT_NEXT.get(old, frozenset()):
        raise IllegalTransitionError(
            f"rollout {rollout_id} cannot go from {old.value} to {new.value}: "
            + ("it has already ended." if old in TERMINAL_ROLLOUT else "that transition is not allowed.")
        )


def check_attempt_transition(attempt_id: str, old: AttemptStatus, new: AttemptStatus) -> None:
    """Raise ``IllegalTransitionError`` unless ``old -> new`` is allowed for an attempt."""
    if new not in _ATTEMPT_NEXT.get(old, frozenset()):
        raise IllegalTransitionError(
            f"attempt {attempt_id} is already {old.value} and cannot become {new.value}; "
            "the store may have timed it out (check its error) - start no more work on it."
        )


RetryReason = Literal["failed", "timed_out", "heartbeat"]
"""Why an attempt ended, as far as retries are concerned: the agent raised (``failed``), it ran
past the rollout timeout (``timed_out``), or its worker stopped heartbeating (``heartbeat``)."""


# --------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


class Task(_Model):
    """One input for the agent: any JSON value plus an optional id and metadata."""

    input: Any = Field(description="The agent's input; any JSON-serialisable value.")
    id: str | None = Field(default=None, description="Stable id, used to group rollouts of one task (GRPO).")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Free-form, e.g. the reference answer.")


class RolloutConfig(_Model):
    """Per-rollout limits enforced by the store itself (not by the worker, which may die)."""

    timeout_s: float | None = Field(default=None, gt=0, description="Wall-clock limit of one attempt.")
    heartbeat_timeout_s: float | None = Field(
        default=None, gt=0, description="An attempt with no heartbeat for this long is declared lost."
    )
    max_attempts: int = Field(default=1, ge=1, le=100, description="Attempts before the rollout gives up.")
    retry_on: list[RetryReason] = Field(
        default_factory=lambda: ["timed_out", "heartbeat"],
        description="Which attempt endings are retried (while attempts remain).",
    )


class RolloutRequest(_Model):
    """What a client enqueues. ``id`` is the idempotency key: enqueueing it again is a no-op."""

    id: str = Field(default_factory=lambda: new_id("ro-"), min_length=1, max_length=200)
    task: Task
    group_id: str | None = Field(default=None, description="Rollouts compared together by GRPO.")
    mode: Literal["train", "val", "test"] = "train"
    resources_version: int | None = Field(default=None, description="Resources to run with; None = latest.")
    config: RolloutConfig = Field(default_factory=RolloutConfig)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("id")
    @classmethod
    def _id_is_url_safe(cls, v: str) -> str:
        if _URL_SAFE_ID.fullmatch(v) is None:
            raise ValueError("rollout id may contain only ASCII letters, digits and - _ . :")
        return v


class Rollout(RolloutRequest):
    """A rollout as stored: the request plus its lifecycle."""

    status: RolloutStatus = RolloutStatus.QUEUED
    attempt_count: int = 0
    created_at: float = Field(default_factory=time.time)
    updated_at: float = Field(default_factory=time.time)
    ended_at: float | None = None
    final_reward: float | None = None
    error: str | None = None
    seq: int = Field(default=0, description="Insertion order, assigned by the store (stable paging).")


class Attempt(_Model):
    """One try of a rollout by one worker."""

    id: str
    rollout_id: str
    number: int = Field(ge=1, description="1 for the first attempt of the rollout.")
    worker_id: str
    status: AttemptStatus = AttemptStatus.RUNNING
    started_at: float
    heartbeat_at: float
    ended_at: float | None = None
    deadline: float | None = Field(default=None, description="When the store times the attempt out.")
    timeout_s: float | None = Field(
        default=None,
        description="The attempt's wall-clock limit: the rollout's timeout_s, else the claiming worker's (None: none).",
    )
    gateway_key: str | None = Field(
        default_factory=new_gateway_key,
        repr=False,
        description="The attempt's own key for the gateway, minted with the attempt: the gateway records a call into "
        "this attempt only when the call carries it (in its base URL), so a rollout's id is not enough to write into "
        "it. None for attempts opened by an older Lightning.",
    )
    error: str | None = None
    reward: float | None = None


class Claim(_Model):
    """What a worker gets from ``claim``: the rollout and the attempt opened for it."""

    rollout: Rollout
    attempt: Attempt


class SpanStatus(_Model):
    code: Literal["unset", "ok", "error"] = "unset"
    message: str | None = None


class SpanEvent(_Model):
    name: str
    time_ns: int
    attributes: dict[str, Any] = Field(default_factory=dict)


class Span(_Model):
    """An OpenTelemetry-shaped span tied to a rollout attempt.

    ``seq`` is assigned by the store in arrival order within the attempt; readers order by it.
    Writes are idempotent on ``(trace_id, span_id)``.
    """

    trace_id: str = Field(default_factory=lambda: uuid.uuid4().hex, min_length=1, max_length=64)
    span_id: str = Field(default_factory=lambda: uuid.uuid4().hex[:16], min_length=1, max_length=64)
    parent_id: str | None = None
    name: str = Field(min_length=1, max_length=500)
    kind: str = "internal"
    start_ns: int = Field(default_factory=time.time_ns, ge=0)
    end_ns: int | None = None
    attributes: dict[str, Any] = Field(default_factory=dict)
    events: list[SpanEvent] = Field(default_factory=list)
    status: SpanStatus = Field(default_factory=SpanStatus)
    rollout_id: str
    attempt_id: str
    seq: int = 0


class LLMResource(_Model):
    """Where and how the agent should call its model."""

    base_url: str
    model: str
    api_key: str = "lightning"
    sampling: dict[str, Any] = Field(default_factory=dict, description="e.g. temperature, max_tokens.")


class Resources(_Model):
    """An immutable, versioned bundle the agent runs with (model endpoint, prompts, anything)."""

    version: int = Field(ge=1)
    created_at: float = Field(default_factory=time.time)
    llm: LLMResource | None = None
    prompts: dict[str, str] = Field(default_factory=dict)
    extra: dict[str, Any] = Field(default_factory=dict)


class TransitionText(_Model):
    """The text of one LLM call, in OpenAI chat shape: what SFT and APO use as it is.

    Every transition carries it when the call's text was recorded (the gateway always records it;
    an OpenTelemetry capture records nothing else). ``messages`` are the conversation sent, each
    ``{"role", "content"}`` plus ``tool_calls`` (``[{"id", "name", "arguments"}]``), ``tool_call_id``
    or ``name`` where present; ``response`` is the assistant's text and ``tool_calls`` what it asked
    for. ``retokenized_with`` names the tokenizer that turned this text into the transition's token
    ids for RL (None: the ids are the engine's own, or not built yet).
    """

    messages: list[dict[str, Any]] = Field(default_factory=list[dict[str, Any]])
    response: str = ""
    tool_calls: list[dict[str, Any]] = Field(default_factory=list[dict[str, Any]])
    tools: list[dict[str, Any]] | None = Field(default=None, description="Tool definitions sent, OpenAI shape.")
    model: str | None = None
    response_id: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    source: str = Field(default="gateway", description="gateway, openllmetry or openinference.")
    retokenized_with: str | None = None


class Transition(_Model):
    """One LLM call of a trainable role, ready for a policy update."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_logprobs: list[float] | None = None
    model_version: int | None = None
    adapter: str | None = None
    """The LoRA adapter that served the call (per-role adapters; None: the base weights)."""
    adapter_version: int | None = None
    role: str | None = None
    reward: float = 0.0
    return_: float = Field(default=0.0, alias="return")
    advantage: float = 0.0
    exact_tokens: bool = True
    truncated: bool = False
    rollout_id: str
    attempt_id: str
    task_id: str | None = None
    group_id: str | None = None
    step_index: int = 0
    span_id: str | None = None
    tool_call_ids: list[str] = Field(default_factory=list)
    text: TransitionText | None = Field(
        default=None,
        description="The call as text (messages, response, tool calls). A text-only capture (exact_tokens False) has "
        "empty token ids until lightning_rl.capture.retokenize fills them with the policy's tokenizer.",
    )
    response_mask: list[int] | None = Field(
        default=None,
        description="Which response tokens the loss trains on (1) and which are context the policy did not "
        "write (0): a tool result spliced between two calls when a rollout's calls are concatenated into one "
        "sequence (lightning_rl.sequences). None: every response token is the policy's own.",
    )

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @model_validator(mode="after")
    def _mask_fits(self) -> Transition:
        mask = self.response_mask
        if mask is not None:
            if len(mask) != len(self.response_ids):
                raise ValueError(f"response_mask has {len(mask)} entries for {len(self.response_ids)} response tokens.")
            if any(m not in (0, 1) for m in mask):
                raise ValueError("response_mask entries must be 0 or 1.")
        return self

    @property
    def trained_tokens(self) -> int:
        """Response tokens the loss trains on (those ``response_mask`` keeps; all of them without one)."""
        return len(self.response_ids) if self.response_mask is None else sum(self.response_mask)


class StoreStats(_Model):
    rollouts_by_status: dict[str, int]
    attempts_by_status: dict[str, int]
    spans: int
    resources_versions: int
