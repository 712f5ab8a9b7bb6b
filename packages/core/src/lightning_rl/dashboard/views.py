"""What the dashboard and ``lightning-rl inspect`` show about one rollout, as plain JSON-able dicts.

Both front ends (the web page and the terminal) render the same data, built here from the store's
public API and the trainer's own adapter and credit code, so what they show is what training did:

* ``rollout_detail``: the rollout, its attempts, each attempt's span tree with timeline offsets,
  every model call (prompt, response, token counts, exact-token flag, tool calls), tool spans,
  signals and rewards;
* ``credit_view``: the transitions the adapter builds from the attempt the trainer used (its last),
  with role, trainable flag, AIR reward, return and advantage under the run's credit settings.
  Advantages are relative to the rollout's task group, so the group's other rollouts are read too.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, cast

from lightning_rl import semconv
from lightning_rl.adapter import adapt_attempt, final_reward
from lightning_rl.capture import call_spans
from lightning_rl.credit import RolloutSample, compute_advantages, rollout_advantages
from lightning_rl.dashboard._settings import CreditSettings
from lightning_rl.store.base import LightningStore
from lightning_rl.types import Attempt, Rollout, RolloutStatus, Span

__all__ = ["rollout_detail", "credit_view", "span_tree", "call_row", "parse_json_attr", "TEXT_LIMIT"]

TEXT_LIMIT = 20_000
"""Characters of a prompt or response sent to the page (a very long prompt is cut, and says so)."""

_MAX_GROUP = 1_000


def parse_json_attr(value: Any) -> Any:
    """A span attribute that may hold JSON text (``lightning.tool_calls``, ``gen_ai.input.messages``)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _cut(text: str) -> str:
    return text if len(text) <= TEXT_LIMIT else text[:TEXT_LIMIT] + f"\n… [{len(text) - TEXT_LIMIT} more characters]"


def _prompt(attrs: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's messages as ``[{"role", "content"}]`` (a completions prompt is one user message)."""
    raw = parse_json_attr(attrs.get(semconv.GEN_AI_INPUT_MESSAGES))
    if raw is None:
        return []
    if isinstance(raw, str):
        return [{"role": "prompt", "content": _cut(raw)}]
    if not isinstance(raw, list):
        return [{"role": "prompt", "content": _cut(json.dumps(raw))}]
    out: list[dict[str, Any]] = []
    for item in cast(list[Any], raw):
        if not isinstance(item, dict):
            out.append({"role": "prompt", "content": _cut(str(item))})
            continue
        message = cast(dict[str, Any], item)
        content = message.get("content")
        text = content if isinstance(content, str) else json.dumps(content) if content is not None else ""
        extra = {k: v for k, v in message.items() if k not in ("role", "content")}
        if extra:
            text = (text + "\n" if text else "") + json.dumps(extra)
        out.append({"role": str(message.get("role", "?")), "content": _cut(text)})
    return out


def call_row(span: Span, t0_ns: int) -> dict[str, Any]:
    """One model call as the views show it."""
    attrs = span.attributes
    tool_calls = parse_json_attr(attrs.get(semconv.TOOL_CALLS))
    finish = attrs.get(semconv.GEN_AI_RESPONSE_FINISH_REASONS)
    prompt_ids = attrs.get(semconv.PROMPT_TOKEN_IDS)
    response_ids = attrs.get(semconv.RESPONSE_TOKEN_IDS)
    return {
        "span_id": span.span_id,
        "role": attrs.get(semconv.ROLE),
        "model_version": attrs.get(semconv.MODEL_VERSION),
        "adapter": attrs.get(semconv.ADAPTER),
        "adapter_version": attrs.get(semconv.ADAPTER_VERSION),
        "api": attrs.get(semconv.API),
        "start_ms": (span.start_ns - t0_ns) / 1e6,
        "duration_ms": ((span.end_ns or span.start_ns) - span.start_ns) / 1e6,
        "prompt": _prompt(attrs),
        "response_text": _cut(str(attrs.get(semconv.RESPONSE_TEXT, ""))),
        "prompt_tokens": len(cast(list[Any], prompt_ids))
        if isinstance(prompt_ids, list)
        else attrs.get(semconv.GEN_AI_USAGE_INPUT_TOKENS),
        "response_tokens": len(cast(list[Any], response_ids))
        if isinstance(response_ids, list)
        else attrs.get(semconv.GEN_AI_USAGE_OUTPUT_TOKENS),
        "exact_tokens": bool(attrs.get(semconv.TOKENS_EXACT, True)),
        "finish_reasons": cast(list[Any], finish) if isinstance(finish, list) else [finish] if finish else [],
        "tool_calls": cast(list[Any], tool_calls) if isinstance(tool_calls, list) else [],
        "tool_call_parse_error": attrs.get(semconv.TOOL_CALL_PARSE_ERROR),
        "response_id": attrs.get(semconv.GEN_AI_RESPONSE_ID),
    }


_BULKY = frozenset({semconv.PROMPT_TOKEN_IDS, semconv.RESPONSE_TOKEN_IDS, semconv.RESPONSE_LOGPROBS})


def _span_row(span: Span, depth: int, t0_ns: int) -> dict[str, Any]:
    attrs = {
        k: (f"[{len(v)} values]" if k in _BULKY and isinstance(v, list) else v) for k, v in span.attributes.items()
    }  # pyright: ignore[reportUnknownArgumentType]
    return {
        "span_id": span.span_id,
        "parent_id": span.parent_id,
        "name": span.name,
        "depth": depth,
        "start_ms": (span.start_ns - t0_ns) / 1e6,
        "duration_ms": ((span.end_ns or span.start_ns) - span.start_ns) / 1e6,
        "status": span.status.code,
        "status_message": span.status.message,
        "role": span.attributes.get(semconv.ROLE),
        "attributes": attrs,
    }


def span_tree(spans: Sequence[Span]) -> list[dict[str, Any]]:
    """Spans in depth-first order (children by start time) with their depth and timeline offsets.

    A span whose parent is not among ``spans`` (the gateway's calls are often recorded without the
    agent's span as parent) is a root; roots are ordered by start time too.
    """
    if not spans:
        return []
    t0 = min(s.start_ns for s in spans)
    ids = {s.span_id for s in spans}
    children: dict[str | None, list[Span]] = defaultdict(list)
    for span in spans:
        parent = span.parent_id if span.parent_id in ids and span.parent_id != span.span_id else None
        children[parent].append(span)
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    stack: list[tuple[Span, int]] = [(s, 0) for s in sorted(children[None], key=lambda s: (s.start_ns, s.seq))][::-1]
    while stack:
        span, depth = stack.pop()
        if span.span_id in seen:  # a parent cycle in bad data must not loop forever
            continue
        seen.add(span.span_id)
        out.append(_span_row(span, depth, t0))
        kids = sorted(children.get(span.span_id, []), key=lambda s: (s.start_ns, s.seq))
        stack.extend((k, depth + 1) for k in reversed(kids))
    return out


def _attempt_view(attempt: Attempt, spans: Sequence[Span]) -> dict[str, Any]:
    t0 = min((s.start_ns for s in spans), default=0)
    calls = call_spans(spans)  # the gateway's calls and those captured by OpenTelemetry (docs/capture.md)
    tools = [s for s in spans if s.name == semconv.SPAN_TOOL]
    signals = [s for s in spans if s.name == semconv.SPAN_SIGNAL]
    rewards = [s for s in spans if s.name == semconv.SPAN_REWARD]
    return {
        "attempt": attempt.model_dump(mode="json"),
        "spans": span_tree(spans),
        "calls": [call_row(s, t0) for s in calls],
        "tools": [
            {
                "span_id": s.span_id,
                "tool": s.attributes.get(semconv.GEN_AI_TOOL_NAME),
                "tool_call_id": s.attributes.get(semconv.GEN_AI_TOOL_CALL_ID),
                "role": s.attributes.get(semconv.ROLE),
                "status": "error"
                if s.status.code == "error" or s.attributes.get(semconv.TOOL_STATUS) == "error"
                else "ok",
                "error": s.attributes.get(semconv.TOOL_ERROR) or s.status.message,
                "attributes": {k: v for k, v in s.attributes.items() if k not in _BULKY},
                "start_ms": (s.start_ns - t0) / 1e6,
            }
            for s in tools
        ],
        "signals": [
            {
                "span_id": s.span_id,
                "name": s.attributes.get(semconv.SIGNAL_NAME),
                "value": s.attributes.get(semconv.SIGNAL_VALUE, 1.0),
                "tool_call_id": s.attributes.get(semconv.GEN_AI_TOOL_CALL_ID),
                "role": s.attributes.get(semconv.ROLE),
                "start_ms": (s.start_ns - t0) / 1e6,
            }
            for s in signals
        ],
        "rewards": [
            {"value": s.attributes.get(semconv.REWARD_VALUE), "start_ms": (s.start_ns - t0) / 1e6} for s in rewards
        ],
    }


async def _attempt_spans(store: LightningStore, attempt_id: str) -> list[Span]:
    return await store.query_spans(attempt_id=attempt_id)


async def credit_view(
    store: LightningStore, rollout: Rollout, attempt: Attempt | None, spans: Sequence[Span], settings: CreditSettings
) -> dict[str, Any]:
    """The adapter's transitions of ``attempt`` beside every call, with AIR reward and advantage.

    Mirrors ``Trainer._train_step``: the last attempt, ``adapt_attempt`` with the plugins' trainable
    declarations and the run's AIR policy, then ``compute_advantages`` over the rollout's group.
    Validation rollouts (trained on with no AIR and no update), failed rollouts and rollouts with no
    reward get no advantage, and ``note`` says why.
    """
    view: dict[str, Any] = {"settings": settings.to_json(), "rows": [], "note": None, "group": None}
    if attempt is None:
        view["note"] = "no attempt ran yet."
        return view
    air = settings.air if rollout.mode == "train" else {}
    # Every call with its AIR reward (AIR attaches before untrainable calls are dropped) ...
    every = adapt_attempt(rollout, attempt.id, spans, trainable="all", air=air)
    # ... and the ones the trainer keeps, by the plugins' declarations (Trainer's default).
    kept = adapt_attempt(rollout, attempt.id, spans, trainable=None, air=air)
    kept_by_span = {t.span_id: t for t in kept.transitions}
    reward = final_reward(rollout, spans)
    advantages_known = False
    if rollout.mode != "train":
        view["note"] = f"{rollout.mode} rollout: scored, not trained on (no AIR, no advantage)."
    elif rollout.status is not RolloutStatus.SUCCEEDED:
        view["note"] = f"{rollout.status.value} rollout: excluded from training (never scored 0)."
    elif reward is None:
        view["note"] = "succeeded without a reward (return one or call emit_reward): excluded from training."
    else:
        advantages_known = await _fill_advantages(store, rollout, reward, kept.transitions, settings, view)
    for t in every.transitions:
        mine = kept_by_span.get(t.span_id)
        trainable = mine is not None
        in_update = trainable and advantages_known
        if in_update and settings.skip_zero_advantage and mine is not None and mine.advantage == 0.0:
            in_update = False
        view["rows"].append(
            {
                "span_id": t.span_id,
                "call_index": t.step_index,
                "step_index": mine.step_index if mine is not None else None,
                "role": t.role,
                "trainable": trainable,
                "air_reward": t.reward,
                "return": mine.return_ if (mine is not None and advantages_known) else None,
                "advantage": mine.advantage if (mine is not None and advantages_known) else None,
                "in_update": in_update,
                "prompt_tokens": len(t.prompt_ids),
                "response_tokens": len(t.response_ids),
                "exact_tokens": t.exact_tokens,
                "truncated": t.truncated,
                "model_version": t.model_version,
                "tool_call_ids": t.tool_call_ids,
            }
        )
    view["final_reward"] = reward
    view["unattached_signals"] = [
        {"name": s.name, "value": s.value, "tool_call_id": s.tool_call_id, "role": s.role, "span_id": s.span_id}
        for s in every.unattached_signals
    ]
    return view


async def _fill_advantages(
    store: LightningStore,
    rollout: Rollout,
    reward: float,
    transitions: list[Any],
    settings: CreditSettings,
    view: dict[str, Any],
) -> bool:
    """Compute advantages over the rollout's group exactly as the trainer did; True when done."""
    members = await store.query_rollouts(group_id=rollout.group_id, limit=_MAX_GROUP) if rollout.group_id else [rollout]
    samples: list[RolloutSample] = []
    group_rewards: list[dict[str, Any]] = []
    for member in members:
        if member.id == rollout.id:
            samples.append(RolloutSample(rollout.id, rollout.group_id or rollout.id, reward, transitions))
            group_rewards.append({"rollout_id": member.id, "reward": reward, "status": member.status.value})
            continue
        if member.status is not RolloutStatus.SUCCEEDED:
            group_rewards.append({"rollout_id": member.id, "reward": None, "status": member.status.value})
            continue
        attempts = await store.query_attempts(member.id)
        if not attempts:
            continue
        spans = await _attempt_spans(store, attempts[-1].id)
        r = final_reward(member, spans)
        group_rewards.append({"rollout_id": member.id, "reward": r, "status": member.status.value})
        if r is None:
            continue
        adapted = adapt_attempt(member, attempts[-1].id, spans, trainable=None, air=settings.air)
        samples.append(RolloutSample(member.id, member.group_id or member.id, r, adapted.transitions))
    compute_advantages(samples, strategy=settings.credit, gamma=settings.gamma, estimator=settings.estimator)
    rollout_level = rollout_advantages([s.reward for s in samples], [s.group_id for s in samples], settings.estimator)
    mine = next(a for s, a in zip(samples, rollout_level, strict=True) if s.rollout_id == rollout.id)
    view["group"] = {"id": rollout.group_id, "rollouts": group_rewards, "rollout_advantage": mine}
    return True


async def rollout_detail(store: LightningStore, rollout_id: str, settings: CreditSettings) -> dict[str, Any]:
    """Everything the rollout page shows. Raises ``NotFoundError`` for an unknown id."""
    rollout = await store.get_rollout(rollout_id)
    attempts = await store.query_attempts(rollout_id)
    views: list[dict[str, Any]] = []
    last_spans: list[Span] = []
    for attempt in attempts:
        spans = await _attempt_spans(store, attempt.id)
        views.append(_attempt_view(attempt, spans))
        last_spans = spans
    last = attempts[-1] if attempts else None
    return {
        "rollout": rollout.model_dump(mode="json"),
        "reward": final_reward(rollout, last_spans) if last is not None else rollout.final_reward,
        "attempts": views,
        "credit": await _credit_or_why_not(store, rollout, last, last_spans, settings),
    }


async def _credit_or_why_not(
    store: LightningStore, rollout: Rollout, attempt: Attempt | None, spans: Sequence[Span], settings: CreditSettings
) -> dict[str, Any]:
    """``credit_view``, or, when the adapter cannot read the attempt's spans (an ``llm.call`` span
    that no Lightning gateway recorded, e.g. sent over OTLP), an empty view whose note says why: the
    page still shows the rollout, its attempts and spans (this was a 500, found by tests/fuzz)."""
    try:
        return await credit_view(store, rollout, attempt, spans, settings)
    except ValueError as exc:
        note = f"no credit view: the adapter cannot read this rollout's (or its group's) spans: {exc}"
        return {"settings": settings.to_json(), "rows": [], "note": note, "group": None, "unattached_signals": []}
