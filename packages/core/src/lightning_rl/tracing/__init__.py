"""Tracing for agents under training: rollout context, rewards, signals, spans.

The runner enters a :func:`rollout_context` around each agent call; inside it, code can record a
reward (:func:`emit_reward`), an intermediate-reward signal (:func:`emit_signal`), or spans with the
light built-in tracer (:func:`span`), and OpenTelemetry spans reach the store through
:class:`LightningSpanProcessor`. Outside a rollout everything here is a silent no-op, so an
instrumented agent runs unchanged in production.

``import lightning_rl.tracing`` does not import OpenTelemetry; ``LightningSpanProcessor`` and
``configure_opentelemetry`` load ``lightning_rl.tracing.otel`` on first access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_rl.tracing._context import (
    RolloutContext,
    SpanSink,
    bind_context,
    current_rollout,
    current_span_id,
    rollout_context,
)
from lightning_rl.tracing._tracer import (
    SpanHandle,
    clean_attributes,
    emit_reward,
    emit_signal,
    emit_span,
    span,
    start_span,
)

if TYPE_CHECKING:
    from lightning_rl.tracing.otel import LightningSpanProcessor, configure_opentelemetry

__all__ = [
    # rollout context
    "RolloutContext",
    "SpanSink",
    "rollout_context",
    "current_rollout",
    "bind_context",
    # rewards and signals
    "emit_reward",
    "emit_signal",
    # built-in tracer
    "span",
    "start_span",
    "emit_span",
    "SpanHandle",
    "current_span_id",
    "clean_attributes",
    # OpenTelemetry (lazy)
    "LightningSpanProcessor",
    "configure_opentelemetry",
]


def __getattr__(name: str) -> object:
    if name in ("LightningSpanProcessor", "configure_opentelemetry"):
        from lightning_rl.tracing import otel

        return getattr(otel, name)
    raise AttributeError(f"module 'lightning_rl.tracing' has no attribute {name!r}")
