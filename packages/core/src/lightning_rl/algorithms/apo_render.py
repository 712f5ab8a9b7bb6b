"""A rollout's spans as plain text, for the optimiser LLM of APO to read.

APO's critique step shows the optimiser what the agent actually did on the tasks it got wrong: the
task, each model call (the messages sent, the text generated, the tool calls), each tool run (with
its error), the signals and the final reward or error. The store holds all of that as spans; this
module turns one attempt's spans into a compact transcript, in time order, with long texts cut so
that a few failures fit in one optimiser prompt. The message parsing is the dashboard's
(``lightning_rl.dashboard.views.call_row``), so the optimiser reads the same conversation a person
sees on the rollout page.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from lightning_rl import semconv
from lightning_rl.capture import call_spans
from lightning_rl.dashboard.views import call_row
from lightning_rl.types import Rollout, Span

__all__ = ["render_rollout", "DEFAULT_TEXT_LIMIT"]

DEFAULT_TEXT_LIMIT = 1500
"""Characters kept of each message, response or tool text (the rest is replaced by a note)."""


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f" [... {len(text) - limit} more characters]"


def _json(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)


def _llm_lines(span: Span, t0: int, limit: int, seen: set[str]) -> list[str]:
    """One model call. A multi-turn agent resends its earlier messages on every call; only the
    messages not shown before are printed, so the transcript grows with the conversation, not with
    its square."""
    row = call_row(span, t0)
    role = f" (role {row['role']})" if row["role"] else ""
    lines = [f"[model call{role}]"]
    for message in row["prompt"]:
        key = f"{message['role']}\x00{message['content']}"
        if key in seen:
            continue
        seen.add(key)
        lines.append(f"  {message['role']}: {_cut(str(message['content']), limit)}")
    lines.append(f"  assistant: {_cut(str(row['response_text']), limit)}")
    for call in row["tool_calls"]:
        lines.append(f"  tool call: {_cut(_json(call), limit)}")
    return lines


def _tool_lines(span: Span, limit: int) -> list[str]:
    attrs = span.attributes
    name = attrs.get(semconv.GEN_AI_TOOL_NAME, span.name)
    status = attrs.get(semconv.TOOL_STATUS) or span.status.code
    line = f"[tool {name}] status {status}"
    error = attrs.get(semconv.TOOL_ERROR) or span.status.message
    if error:
        line += f": {_cut(str(error), limit)}"
    return [line]


def render_rollout(
    rollout: Rollout,
    spans: Sequence[Span],
    *,
    reward: float | None = None,
    text_limit: int = DEFAULT_TEXT_LIMIT,
) -> str:
    """The transcript of one attempt of ``rollout`` from its ``spans`` (those of that attempt).

    Args:
        rollout: The rollout (its task, status and error are shown).
        spans: The attempt's spans, in any order (sorted by start time here).
        reward: The rollout's reward, when it has one.
        text_limit: Characters kept of each message, response or error.
    """
    task = rollout.task
    lines = [f"task: {_cut(_json(task.input), text_limit)}"]
    if task.metadata:
        lines.append(f"task metadata: {_cut(_json(task.metadata), text_limit)}")
    # model calls the gateway served, plus those captured by OpenTelemetry instrumentations (a hosted
    # model's calls, docs/capture.md), each shaped as an ``llm.call`` span
    others = [s for s in spans if s.name != semconv.SPAN_LLM_CALL]
    ordered = sorted([*call_spans(spans), *others], key=lambda s: (s.start_ns, s.seq))
    t0 = ordered[0].start_ns if ordered else 0
    seen: set[str] = set()
    for span in ordered:
        if span.name == semconv.SPAN_LLM_CALL:
            lines.extend(_llm_lines(span, t0, text_limit, seen))
        elif span.name == semconv.SPAN_TOOL:
            lines.extend(_tool_lines(span, text_limit))
        elif span.name == semconv.SPAN_SIGNAL:
            attrs = span.attributes
            lines.append(f"[signal {attrs.get(semconv.SIGNAL_NAME)}] {attrs.get(semconv.SIGNAL_VALUE)}")
    lines.append(f"outcome: {rollout.status.value}")
    if rollout.error:
        lines.append(f"error: {_cut(rollout.error, text_limit)}")
    if reward is not None:
        lines.append(f"reward: {reward:.3f}")
    return "\n".join(lines)
