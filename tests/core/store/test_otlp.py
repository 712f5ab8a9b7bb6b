"""OTLP/HTTP ingest: spans exported by any OpenTelemetry SDK land in the store, in either encoding."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Status
from opentelemetry.proto.trace.v1.trace_pb2 import Span as OtlpSpan

from lightning_rl import semconv
from lightning_rl.store.server import running_store_server
from lightning_rl.store.sqlite import SQLiteStore
from lightning_rl.types import Attempt, RolloutRequest, Task

TRACE = bytes.fromhex("0af7651916cd43dd8448eb211c80319c")


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[str, SQLiteStore, Attempt]]:
    """A store server with one claimed attempt for spans to belong to."""
    store = SQLiteStore(tmp_path / "otlp.db")
    try:
        await store.enqueue([RolloutRequest(id="ro-1", task=Task(input="q"))])
        (claim,) = await store.claim("w")
        async with running_store_server(store) as url:
            yield url, store, claim.attempt
    finally:
        await store.close()


def kv(key: str, value: Any) -> KeyValue:
    return KeyValue(key=key, value=any_value(value))


def any_value(value: Any) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, list):
        return AnyValue(array_value=ArrayValue(values=[any_value(v) for v in value]))
    if isinstance(value, dict):
        return AnyValue(kvlist_value=KeyValueList(values=[kv(k, v) for k, v in value.items()]))
    return AnyValue(string_value=str(value))


def otlp_span(span_id: int, name: str, attrs: dict[str, Any], parent: int | None = None) -> OtlpSpan:
    span = OtlpSpan(
        trace_id=TRACE,
        span_id=span_id.to_bytes(8, "big"),
        parent_span_id=parent.to_bytes(8, "big") if parent else b"",
        name=name,
        kind=OtlpSpan.SPAN_KIND_CLIENT,
        start_time_unix_nano=1_700_000_000_000_000_000 + span_id,
        end_time_unix_nano=1_700_000_000_500_000_000 + span_id,
        attributes=[kv(k, v) for k, v in attrs.items()],
        status=Status(code=Status.STATUS_CODE_ERROR, message="boom"),
    )
    span.events.add(time_unix_nano=1_700_000_000_100_000_000, name="tool.error", attributes=[kv("n", 3)])
    return span


def export_request(attempt: Attempt) -> ExportTraceServiceRequest:
    """Routed by resource attributes (2 spans), by span attributes (1), unroutable (2), unknown attempt (1)."""
    routing = {semconv.ROLLOUT_ID: attempt.rollout_id, semconv.ATTEMPT_ID: attempt.id}
    by_resource = ResourceSpans(
        scope_spans=[
            ScopeSpans(
                spans=[
                    otlp_span(1, "agent", {"k": "v"}),
                    otlp_span(2, "llm.call", {"tokens": [1, 2, 3], "meta": {"a": 1.5, "ok": True}}, parent=1),
                ]
            )
        ]
    )
    by_resource.resource.attributes.extend([kv(k, v) for k, v in routing.items()] + [kv("service.name", "bot")])
    by_span = ResourceSpans(
        scope_spans=[
            ScopeSpans(
                spans=[
                    otlp_span(3, "tool", routing),
                    otlp_span(4, "stray", {}),
                    otlp_span(5, "half", {semconv.ROLLOUT_ID: attempt.rollout_id}),
                    otlp_span(6, "ghost", {semconv.ROLLOUT_ID: "ro-1", semconv.ATTEMPT_ID: "at-nope"}),
                ]
            )
        ]
    )
    return ExportTraceServiceRequest(resource_spans=[by_resource, by_span])


async def check_stored(store: SQLiteStore, attempt: Attempt) -> None:
    spans = await store.query_spans(attempt_id=attempt.id)
    assert [s.name for s in spans] == ["agent", "llm.call", "tool"]
    llm = spans[1]
    assert llm.trace_id == TRACE.hex()
    assert llm.span_id == (2).to_bytes(8, "big").hex()
    assert llm.parent_id == (1).to_bytes(8, "big").hex()
    assert llm.kind == "client"
    assert llm.start_ns == 1_700_000_000_000_000_002 and llm.end_ns == 1_700_000_000_500_000_002
    assert llm.attributes["tokens"] == [1, 2, 3]
    assert llm.attributes["meta"] == {"a": 1.5, "ok": True}
    assert llm.status.code == "error" and llm.status.message == "boom"
    assert llm.events[0].name == "tool.error" and llm.events[0].attributes == {"n": 3}
    assert spans[0].parent_id is None
    assert llm.rollout_id == "ro-1"


async def test_protobuf_export(served: tuple[str, SQLiteStore, Attempt]) -> None:
    url, store, attempt = served
    body = export_request(attempt).SerializeToString()
    async with httpx.AsyncClient() as http:
        response = await http.post(f"{url}/v1/traces", content=body, headers={"content-type": "application/x-protobuf"})
        again = await http.post(f"{url}/v1/traces", content=body, headers={"content-type": "application/x-protobuf"})
    assert response.status_code == 200 and again.status_code == 200
    assert response.headers["content-type"] == "application/x-protobuf"
    result = ExportTraceServiceResponse.FromString(response.content)
    assert result.partial_success.rejected_spans == 3
    message = result.partial_success.error_message
    assert semconv.ROLLOUT_ID in message and "at-nope" in message
    await check_stored(store, attempt)  # the repeat export added nothing


async def test_json_export_with_hex_ids(served: tuple[str, SQLiteStore, Attempt]) -> None:
    url, store, attempt = served
    # The OTLP JSON mapping: camelCase keys, hex ids, integer enums, int64 as strings.
    payload = json_format.MessageToDict(export_request(attempt), use_integers_for_enums=True)
    for rs in payload["resourceSpans"]:
        for span in rs["scopeSpans"][0]["spans"]:
            for key in ("traceId", "spanId", "parentSpanId"):
                if key in span:
                    span[key] = base64.b64decode(span[key]).hex()
    payload["somethingNew"] = {"ignored": True}  # receivers must ignore unknown fields
    async with httpx.AsyncClient() as http:
        response = await http.post(f"{url}/v1/traces", json=payload)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert json.loads(response.content)["partialSuccess"]["rejectedSpans"] in ("3", 3)
    await check_stored(store, attempt)


async def test_all_accepted_means_empty_response(served: tuple[str, SQLiteStore, Attempt]) -> None:
    url, _, attempt = served
    routing = {semconv.ROLLOUT_ID: attempt.rollout_id, semconv.ATTEMPT_ID: attempt.id}
    request = ExportTraceServiceRequest(
        resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[otlp_span(9, "x", routing)])])]
    )
    async with httpx.AsyncClient() as http:
        response = await http.post(
            f"{url}/v1/traces",
            content=gzip.compress(request.SerializeToString()),
            headers={"content-type": "application/x-protobuf", "content-encoding": "gzip"},
        )
    assert response.status_code == 200
    assert not ExportTraceServiceResponse.FromString(response.content).HasField("partial_success")


@pytest.mark.parametrize(
    ("content", "content_type", "status", "needle"),
    [
        (b"\xff\xff\xff garbage", "application/x-protobuf", 400, "protobuf"),
        (b'{"resourceSpans": [', "application/json", 400, "JSON"),
        (b'{"resourceSpans": "nope"}', "application/json", 400, "OTLP JSON"),
        (
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz", "spanId": "01", "name": "x"}]}]}]}',
            "application/json",
            400,
            "resourceSpans[0].scopeSpans[0].spans[0].traceId",
        ),
        (b"hello", "text/plain", 415, "Content-Type"),
    ],
)
async def test_bad_export_bodies(
    served: tuple[str, SQLiteStore, Attempt], content: bytes, content_type: str, status: int, needle: str
) -> None:
    async with httpx.AsyncClient() as http:
        response = await http.post(f"{served[0]}/v1/traces", content=content, headers={"content-type": content_type})
    assert response.status_code == status
    assert needle in response.json()["error"]["message"]


async def test_real_sdk_exporter(served: tuple[str, SQLiteStore, Attempt]) -> None:
    """The OpenTelemetry SDK's own OTLP/HTTP exporter, unmodified, writes into the store."""
    exporter_mod = pytest.importorskip("opentelemetry.exporter.otlp.proto.http.trace_exporter")
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    url, store, attempt = served
    resource = Resource.create({semconv.ROLLOUT_ID: attempt.rollout_id, semconv.ATTEMPT_ID: attempt.id})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(SimpleSpanProcessor(exporter_mod.OTLPSpanExporter(endpoint=f"{url}/v1/traces")))
    tracer = provider.get_tracer("test")

    def emit() -> None:
        with tracer.start_as_current_span("agent"), tracer.start_as_current_span("tool") as span:
            span.set_attribute("gen_ai.tool.name", "search")
        provider.shutdown()

    await asyncio.to_thread(emit)  # the exporter blocks; the server runs on this loop
    names = sorted(s.name for s in await store.query_spans(attempt_id=attempt.id))
    assert names == ["agent", "tool"]
