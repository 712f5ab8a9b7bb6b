"""``LightningSpanProcessor``: OpenTelemetry spans reach the store, attributed to the right rollout."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind, Status, StatusCode

from lightning_rl import semconv
from lightning_rl.spans import SpanWriter
from lightning_rl.store import MemoryStore
from lightning_rl.tracing import LightningSpanProcessor, configure_opentelemetry, rollout_context
from lightning_rl.types import RolloutRequest, Span, Task


def test_importing_tracing_does_not_import_opentelemetry() -> None:
    code = (
        "import sys, lightning_rl.tracing as t; "
        "assert not [m for m in sys.modules if m.startswith('opentelemetry')], 'otel imported'; "
        "t.LightningSpanProcessor; assert 'opentelemetry.sdk.trace' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


async def test_spans_are_exported_to_the_rollout_they_started_in() -> None:
    store = MemoryStore()
    await store.enqueue([RolloutRequest(id=f"ro-{i}", task=Task(input=i)) for i in range(10)])
    claims = await store.claim("w", n=10)
    writer = SpanWriter(store)
    provider = TracerProvider()
    processor = LightningSpanProcessor()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("test")
    late: list[object] = []

    async def rollout(i: int) -> None:
        claim = claims[i]
        with rollout_context(claim.rollout.id, claim.attempt.id, sink=writer.submit):
            with tracer.start_as_current_span("chain", kind=SpanKind.CLIENT, attributes={"i": i, "tags": ("a", "b")}):
                await asyncio.sleep(0.001 * (10 - i))
                with tracer.start_as_current_span("llm") as llm:
                    llm.add_event("token", {"n": 1})
                    await asyncio.sleep(0.001 * i)
                try:
                    with tracer.start_as_current_span("tool"):
                        raise RuntimeError(f"tool {i} failed")
                except RuntimeError:
                    pass
            late.append(tracer.start_span("ends-after-the-context"))
        late[-1].end()  # type: ignore[attr-defined]

    with tracer.start_as_current_span("outside"):  # not in any rollout: dropped
        pass
    await asyncio.gather(*(rollout(i) for i in range(10)))
    assert await writer.close(5.0)
    assert processor.exported == 40 and processor.dropped == 1
    for i, claim in enumerate(claims):
        spans = {s.name: s for s in await store.query_spans(attempt_id=claim.attempt.id)}
        assert set(spans) == {"chain", "llm", "tool", "ends-after-the-context"}
        chain, llm, tool = spans["chain"], spans["llm"], spans["tool"]
        assert {s.rollout_id for s in spans.values()} == {claim.rollout.id}
        assert chain.kind == "client" and chain.attributes["i"] == i and chain.attributes["tags"] == ["a", "b"]
        assert chain.attributes[semconv.ROLLOUT_ID] == claim.rollout.id
        assert chain.attributes[semconv.ATTEMPT_ID] == claim.attempt.id
        assert llm.parent_id == chain.span_id and tool.parent_id == chain.span_id
        assert llm.trace_id == chain.trace_id and len(chain.trace_id) == 32 and len(chain.span_id) == 16
        assert [e.name for e in llm.events] == ["token"] and llm.events[0].attributes == {"n": 1}
        assert tool.status.code == "error" and f"tool {i} failed" in (tool.status.message or "")
        assert tool.events[0].name == "exception"
        assert chain.end_ns is not None and chain.start_ns <= llm.start_ns <= chain.end_ns


def test_spans_outside_a_rollout_use_their_attributes_with_a_fallback_sink() -> None:
    received: list[Span] = []
    provider = TracerProvider()
    provider.add_span_processor(LightningSpanProcessor(fallback_sink=received.append))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("tagged", attributes={semconv.ROLLOUT_ID: "ro-9", semconv.ATTEMPT_ID: "at-9"}):
        pass
    with tracer.start_as_current_span("untagged") as s:
        s.set_status(Status(StatusCode.OK))
    assert [(s.name, s.rollout_id, s.attempt_id) for s in received] == [("tagged", "ro-9", "at-9")]


def test_a_failing_sink_does_not_break_the_instrumented_code() -> None:
    def broken(span: Span) -> None:
        raise ConnectionError("down")

    provider = TracerProvider()
    provider.add_span_processor(LightningSpanProcessor())
    tracer = provider.get_tracer("test")
    with rollout_context("ro-1", "at-1", sink=broken):
        with tracer.start_as_current_span("work"):
            pass  # no exception escapes


def test_configure_opentelemetry_adds_the_processor_once() -> None:
    provider = TracerProvider()
    first = configure_opentelemetry(provider)
    assert configure_opentelemetry(provider) is first
    assert first.force_flush() is True
