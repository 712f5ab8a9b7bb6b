"""An OpenTelemetry ``SpanProcessor`` that sends finished spans to the Lightning store.

Agents and frameworks already instrumented with OpenTelemetry (OpenInference, OpenLLMetry, the
OpenAI Agents SDK bridge, ...) need no Lightning-specific tracing: add ``LightningSpanProcessor`` to
the tracer provider and every span that *starts* inside a rollout is converted to a ``Span`` and
attributed to that rollout attempt. The owner is captured in ``on_start`` (where the rollout
context is still visible) rather than ``on_end``, because a span can end in another thread or
callback. Spans that started outside any rollout are attributed through their
``lightning.rollout_id`` / ``lightning.attempt_id`` attributes (span or resource) when present and
a fallback sink was given, and dropped with a debug log otherwise.

The processor does no batching itself: it hands each converted span to the rollout's sink (the
runner's ``SpanWriter``, which batches, retries and is flushed before the attempt finishes).

This module imports ``opentelemetry-sdk``; ``import lightning_rl.tracing`` does not, and loads it
only when ``LightningSpanProcessor`` is first used.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from lightning_rl import semconv
from lightning_rl.tracing._context import RolloutContext, SpanSink, current_rollout
from lightning_rl.tracing._tracer import clean_attributes
from lightning_rl.types import Span, SpanEvent, SpanStatus

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace as otel_trace
    from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace import Span as SdkSpan
    from opentelemetry.trace import SpanKind, StatusCode
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "LightningSpanProcessor needs the OpenTelemetry SDK: pip install 'lightning-rl[otel]' "
        "(or pip install opentelemetry-sdk)."
    ) from exc

__all__ = ["LightningSpanProcessor", "span_from_otel", "configure_opentelemetry"]

_log = logging.getLogger("lightning_rl.tracing")

_KINDS: Mapping[SpanKind, str] = {
    SpanKind.INTERNAL: "internal",
    SpanKind.SERVER: "server",
    SpanKind.CLIENT: "client",
    SpanKind.PRODUCER: "producer",
    SpanKind.CONSUMER: "consumer",
}
_STATUS: Mapping[StatusCode, Any] = {StatusCode.UNSET: "unset", StatusCode.OK: "ok", StatusCode.ERROR: "error"}


def span_from_otel(span: ReadableSpan, rollout_id: str, attempt_id: str) -> Span:
    """Convert a finished OpenTelemetry span into a Lightning ``Span`` of the given attempt."""
    sc = span.context
    if sc is None:  # pragma: no cover - the SDK always sets it
        raise ValueError(f"OpenTelemetry span {span.name!r} has no span context.")
    start_ns = span.start_time or 0
    events = [
        SpanEvent(name=e.name, time_ns=e.timestamp, attributes=clean_attributes(e.attributes)) for e in span.events
    ]
    return Span(
        trace_id=otel_trace.format_trace_id(sc.trace_id),
        span_id=otel_trace.format_span_id(sc.span_id),
        parent_id=otel_trace.format_span_id(span.parent.span_id) if span.parent is not None else None,
        name=span.name,
        kind=_KINDS.get(span.kind, "internal"),
        start_ns=start_ns,
        end_ns=span.end_time if span.end_time is not None else start_ns,
        attributes=clean_attributes(span.attributes),
        events=events,
        status=SpanStatus(code=_STATUS.get(span.status.status_code, "unset"), message=span.status.description),
        rollout_id=rollout_id,
        attempt_id=attempt_id,
    )


class LightningSpanProcessor(SpanProcessor):
    """Exports OpenTelemetry spans started inside a rollout to that rollout's span sink.

    Args:
        fallback_sink: Where spans go that started outside any rollout context but carry
            ``lightning.rollout_id`` and ``lightning.attempt_id`` attributes (e.g. a long-lived
            ``SpanWriter.submit``). Without it such spans are dropped.
        tag_spans: Also set ``lightning.rollout_id`` / ``lightning.attempt_id`` on each span at
            start, so other exporters on the same provider can group spans by rollout.
    """

    def __init__(self, fallback_sink: SpanSink | None = None, *, tag_spans: bool = True) -> None:
        self._fallback_sink = fallback_sink
        self._tag_spans = tag_spans
        self._owners: dict[tuple[int, int], RolloutContext] = {}
        self._lock = threading.Lock()
        self._exported = 0
        self._dropped = 0
        self._closed = False

    @property
    def exported(self) -> int:
        """Spans handed to a sink so far."""
        return self._exported

    @property
    def dropped(self) -> int:
        """Finished spans that belonged to no rollout."""
        return self._dropped

    @property
    def closed(self) -> bool:
        """True after ``shutdown``: spans are no longer routed (a provider cannot drop a processor)."""
        return self._closed

    def on_start(self, span: SdkSpan, parent_context: otel_context.Context | None = None) -> None:
        ctx = current_rollout()
        sc = span.context
        if ctx is None or sc is None or self._closed:
            return
        with self._lock:
            self._owners[(sc.trace_id, sc.span_id)] = ctx
        if self._tag_spans:
            span.set_attribute(semconv.ROLLOUT_ID, ctx.rollout_id)
            span.set_attribute(semconv.ATTEMPT_ID, ctx.attempt_id)

    def on_end(self, span: ReadableSpan) -> None:
        try:
            self._export(span)
        except Exception:  # a tracing failure must never reach the instrumented code
            _log.debug("could not export OpenTelemetry span %r", span.name, exc_info=True)

    def _export(self, span: ReadableSpan) -> None:
        if self._closed:
            return
        sc = span.context
        owner: RolloutContext | None = None
        if sc is not None:
            with self._lock:
                owner = self._owners.pop((sc.trace_id, sc.span_id), None)
        if owner is not None:
            owner.record(span_from_otel(span, owner.rollout_id, owner.attempt_id))
            self._exported += 1
            return
        ids = semconv.attributed_ids(span.attributes, span.resource.attributes)
        if ids is not None and self._fallback_sink is not None:
            self._fallback_sink(span_from_otel(span, *ids))
            self._exported += 1
            return
        self._dropped += 1
        _log.debug("OpenTelemetry span %r started outside a rollout: not exported", span.name)

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            self._owners.clear()
        with _install_lock:
            for key, processor in list(_installed.items()):
                if processor is self:
                    del _installed[key]

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        # Spans are handed to the sinks synchronously in on_end; their owners flush them.
        return True


_installed: dict[int, LightningSpanProcessor] = {}
_install_lock = threading.Lock()


def configure_opentelemetry(provider: TracerProvider | None = None) -> LightningSpanProcessor:
    """Add a ``LightningSpanProcessor`` to ``provider`` (default: the global one) once, and return it.

    When no SDK tracer provider is installed globally yet, one is created and made global, so
    instrumentations that use ``opentelemetry.trace.get_tracer`` start recording.
    """
    with _install_lock:
        if provider is None:
            current = otel_trace.get_tracer_provider()
            if isinstance(current, TracerProvider):
                provider = current
            else:
                provider = TracerProvider()
                otel_trace.set_tracer_provider(provider)
        existing = _installed.get(id(provider))
        if existing is not None:
            return existing
        processor = LightningSpanProcessor()
        provider.add_span_processor(processor)
        _installed[id(provider)] = processor
        return processor
