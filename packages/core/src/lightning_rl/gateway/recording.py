"""Build the ``llm.call`` spans the trainer learns from, and hand them to the ``SpanWriter``.

One span per choice (so ``n > 1`` gives ``n`` transitions), carrying exactly what the engine
consumed and sampled: prompt ids, response ids, the sampling logprobs, the weights version, the
parsed tool calls with their ids (AIR joins tool results on them) and the response id (plugins join
their role spans on it). Spans are built without validation (every field is produced here) and
submitted without awaiting the store, so recording costs microseconds.

The gateway's ``AttemptBinder`` resolves every call of a rollout to its running attempt before the
call is served, so a call reaching ``Recorder.record`` without an attempt id has no store to be
recorded into and is only served.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel

from lightning_rl import semconv as sc
from lightning_rl.gateway.protocol import dumps
from lightning_rl.gateway.upstreams import CallResult
from lightning_rl.spans import SpanWriter
from lightning_rl.types import Span, SpanStatus

__all__ = ["CallContext", "CallInfo", "Recorder", "build_llm_spans"]


@dataclass(frozen=True, slots=True)
class CallContext:
    """Where a call belongs: from the URL path or the ``X-Lightning-*`` headers."""

    rollout_id: str | None = None
    attempt_id: str | None = None
    role: str | None = None
    key: str | None = None
    """The attempt's key (``Attempt.gateway_key``) the call carried, checked before it is served."""


@dataclass(slots=True)
class CallInfo:
    """What the request asked for, recorded next to what the model produced."""

    api: str
    operation: str
    request_model: str | None
    response_model: str
    response_id: str
    stream: bool
    start_ns: int
    end_ns: int
    temperature: float
    top_p: float
    max_tokens: int | None
    inputs: Any


_SPAN_FIELDS = frozenset(Span.model_fields)
_STATUS_FIELDS = frozenset(SpanStatus.model_fields)
_new_object = object.__new__
_set = object.__setattr__
_M = TypeVar("_M", bound=BaseModel)


def _construct(cls: type[_M], fields: dict[str, Any], names: frozenset[str]) -> _M:
    """``cls.model_construct(**fields)`` for a dict holding every field (``names``), in a third of the
    time: the four attributes pydantic sets, without its per-field defaults and aliases (tested)."""
    model = _new_object(cls)
    _set(model, "__dict__", fields)
    _set(model, "__pydantic_fields_set__", set(names))
    _set(model, "__pydantic_extra__", None)
    _set(model, "__pydantic_private__", None)
    return model


def build_llm_spans(ctx: CallContext, attempt_id: str, info: CallInfo, result: CallResult) -> list[Span]:
    """One ``llm.call`` span per choice of ``result``."""
    assert ctx.rollout_id is not None
    trace_id = info.response_id.rsplit("-", 1)[-1].rsplit("_", 1)[-1][:32] or os.urandom(16).hex()
    latency = (info.end_ns - info.start_ns) / 1e9
    inputs = dumps(info.inputs)
    common: dict[str, Any] = {
        sc.ROLLOUT_ID: ctx.rollout_id,
        sc.ATTEMPT_ID: attempt_id,
        sc.GEN_AI_OPERATION_NAME: info.operation,
        sc.GEN_AI_REQUEST_MODEL: info.request_model,
        sc.GEN_AI_RESPONSE_MODEL: info.response_model,
        sc.GEN_AI_RESPONSE_ID: info.response_id,
        sc.GEN_AI_REQUEST_TEMPERATURE: info.temperature,
        sc.GEN_AI_REQUEST_TOP_P: info.top_p,
        sc.GEN_AI_REQUEST_MAX_TOKENS: info.max_tokens,
        sc.GEN_AI_USAGE_INPUT_TOKENS: result.prompt_tokens,
        sc.PROMPT_TOKEN_IDS: result.prompt_ids,
        sc.TOKENS_EXACT: result.tokens_exact,
        sc.LATENCY_S: latency,
        sc.API: info.api,
        sc.STREAM: info.stream,
        sc.GEN_AI_INPUT_MESSAGES: inputs,
    }
    if ctx.role is not None:
        common[sc.ROLE] = ctx.role
    spans: list[Span] = []
    for choice in result.choices:
        attrs = dict(common)
        attrs[sc.CHOICE_INDEX] = choice.index
        attrs[sc.RESPONSE_TOKEN_IDS] = choice.token_ids
        attrs[sc.RESPONSE_LOGPROBS] = choice.logprobs
        attrs[sc.MODEL_VERSION] = choice.model_version
        if choice.adapter is not None:
            attrs[sc.ADAPTER] = choice.adapter
            attrs[sc.ADAPTER_VERSION] = choice.adapter_version
        attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS] = [choice.finish_reason]
        attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] = len(choice.token_ids) if choice.token_ids is not None else None
        calls = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in choice.tool_calls]
        attrs[sc.TOOL_CALLS] = dumps(calls) if calls else "[]"
        attrs[sc.RESPONSE_TEXT] = choice.text
        attrs[sc.RESPONSE_CONTENT] = choice.content  # the message content the client saw (capture joins on it)
        if choice.parse_error is not None:
            attrs[sc.TOOL_CALL_PARSE_ERROR] = choice.parse_error
        spans.append(
            _construct(
                Span,
                {
                    "trace_id": trace_id,
                    "span_id": f"{random.getrandbits(64):016x}",  # as new_call_id: no system call
                    "parent_id": None,
                    "name": sc.SPAN_LLM_CALL,
                    "kind": "client",
                    "start_ns": info.start_ns,
                    "end_ns": info.end_ns,
                    "attributes": attrs,
                    "events": [],
                    "status": _construct(SpanStatus, {"code": "ok", "message": None}, _STATUS_FIELDS),
                    "rollout_id": ctx.rollout_id,
                    "attempt_id": attempt_id,
                    "seq": 0,
                },
                _SPAN_FIELDS,
            )
        )
    return spans


class Recorder:
    """Records calls made inside a rollout's attempt; calls outside any rollout are served and not recorded."""

    def __init__(self, writer: SpanWriter | None) -> None:
        self.writer = writer
        self.recorded = 0

    def record(self, ctx: CallContext, info: CallInfo, result: CallResult) -> None:
        if self.writer is None or ctx.attempt_id is None:
            return
        self.writer.submit_many(build_llm_spans(ctx, ctx.attempt_id, info, result))
        self.recorded += len(result.choices)
