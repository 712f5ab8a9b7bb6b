"""Property-based fuzzing of OTLP/HTTP ingest (``POST /v1/traces`` on the store server).

OTLP is OpenTelemetry's protocol, not an OpenAPI one, so Hypothesis builds the requests from the
protobuf schema itself: ``ExportTraceServiceRequest`` messages with arbitrary ids (any length),
names, kinds, 64-bit times, status codes, events and attribute values of every ``AnyValue`` kind
nested a few levels (NaN and infinities included), routed to a real attempt, to an unknown one
or nowhere; sent as protobuf or OTLP JSON, gzip-compressed or not, and now and then with a wrong
content type or encoding, or as random bytes. A real server over a real SQLite store must answer
every one without a 5xx; a 200 carries an ``ExportTraceServiceResponse`` whose ``rejected_spans``
never exceeds what was sent, and when nothing was rejected every span is in the store.
"""

from __future__ import annotations

import base64
import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

hypothesis = pytest.importorskip("hypothesis")
pytest.importorskip("opentelemetry.proto")

from google.protobuf import json_format  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (  # noqa: E402
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList  # noqa: E402
from opentelemetry.proto.trace.v1.trace_pb2 import Span as OtlpSpan  # noqa: E402

from lightning_rl import semconv  # noqa: E402
from lightning_rl.store.client import StoreClient  # noqa: E402
from lightning_rl.store.server import running_store_server  # noqa: E402
from lightning_rl.store.sqlite import SQLiteStore  # noqa: E402
from lightning_rl.types import RolloutRequest, Task  # noqa: E402

from .serving_helpers import BackgroundLoop, served_in_thread  # noqa: E402

pytestmark = pytest.mark.fuzz

EXAMPLES = 150

_scalars = st.one_of(
    st.text(max_size=20).map(lambda s: AnyValue(string_value=s)),
    st.booleans().map(lambda b: AnyValue(bool_value=b)),
    st.integers(-(2**63), 2**63 - 1).map(lambda i: AnyValue(int_value=i)),
    st.floats().map(lambda f: AnyValue(double_value=f)),
    st.binary(max_size=8).map(lambda b: AnyValue(bytes_value=b)),
    st.just(AnyValue()),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3).map(lambda vs: AnyValue(array_value=ArrayValue(values=vs))),
        st.lists(st.tuples(st.text(max_size=8), inner), max_size=3).map(
            lambda kvs: AnyValue(kvlist_value=KeyValueList(values=[KeyValue(key=k, value=v) for k, v in kvs]))
        ),
    ),
    max_leaves=8,
)
_attrs = st.lists(st.tuples(st.text(max_size=12), _values), max_size=4).map(
    lambda kvs: [KeyValue(key=k, value=v) for k, v in kvs]
)


def _route(rollout: str, attempt: str) -> list[KeyValue]:
    return [
        KeyValue(key=semconv.ROLLOUT_ID, value=AnyValue(string_value=rollout)),
        KeyValue(key=semconv.ATTEMPT_ID, value=AnyValue(string_value=attempt)),
    ]


@st.composite
def _span(draw: st.DrawFn, routes: list[tuple[str, str] | None]) -> OtlpSpan:
    route = draw(st.sampled_from(routes))
    span = OtlpSpan(
        trace_id=draw(st.one_of(st.binary(min_size=16, max_size=16), st.binary(max_size=20))),
        span_id=draw(st.one_of(st.binary(min_size=8, max_size=8), st.binary(max_size=10))),
        parent_span_id=draw(st.binary(max_size=8)),
        name=draw(st.text(max_size=20)),
        kind=draw(st.integers(0, 5)),
        start_time_unix_nano=draw(st.integers(0, 2**64 - 1)),
        end_time_unix_nano=draw(st.integers(0, 2**64 - 1)),
        attributes=draw(_attrs) + (_route(*route) if route else []),
    )
    span.status.code = draw(st.integers(0, 2))
    span.status.message = draw(st.text(max_size=10))
    for _ in range(draw(st.integers(0, 2))):
        event = span.events.add()
        event.name = draw(st.text(max_size=10))
        event.time_unix_nano = draw(st.integers(0, 2**64 - 1))
        event.attributes.extend(draw(_attrs))
    return span


def _requests(routes: list[tuple[str, str] | None]) -> st.SearchStrategy[ExportTraceServiceRequest]:
    @st.composite
    def build(draw: st.DrawFn) -> ExportTraceServiceRequest:
        request = ExportTraceServiceRequest()
        for _ in range(draw(st.integers(0, 2))):
            rs = request.resource_spans.add()
            rs.resource.attributes.extend(draw(_attrs))
            for _ in range(draw(st.integers(0, 2))):
                rs.scope_spans.add().spans.extend(draw(st.lists(_span(routes), max_size=4)))
        return request

    return build()


def _to_otlp_json(request: ExportTraceServiceRequest) -> bytes:
    """OTLP JSON: protobuf's JSON mapping with trace and span ids as hex (what exporters send)."""
    payload = json_format.MessageToDict(request)
    for rs in payload.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    return json.dumps(payload).encode()


@st.composite
def _wire(draw: st.DrawFn, request: ExportTraceServiceRequest) -> tuple[bytes, dict[str, str]]:
    """The request as bytes and headers: mostly well formed, sometimes not."""
    kind = draw(st.sampled_from(["protobuf", "json", "json", "garbage", "wrong-type"]))
    if kind == "garbage":
        return draw(st.binary(max_size=64)), {
            "content-type": draw(st.sampled_from(["application/x-protobuf", "application/json"]))
        }
    body = request.SerializeToString() if kind == "protobuf" else _to_otlp_json(request)
    media = "application/json" if kind == "json" else "application/x-protobuf"
    if kind == "wrong-type":
        media = draw(st.sampled_from(["text/plain", "", "application/protobuf; charset=x", "multipart/form-data"]))
    headers = {"content-type": media}
    encoding = draw(st.sampled_from(["", "", "gzip", "deflate", "br", "gzip-but-not"]))
    if encoding == "gzip":
        body = gzip.compress(body)
    elif encoding == "gzip-but-not":
        encoding = "gzip"  # says gzip, is not
    if encoding:
        headers["content-encoding"] = encoding
    return body, headers


class _Served:
    def __init__(self, db: Path) -> None:
        self.db = db

    async def __aenter__(self) -> tuple[str, str, str]:
        self.store = SQLiteStore(self.db)
        await self.store.enqueue([RolloutRequest(id="otlp-r", task=Task(input=1))])
        [claim] = await self.store.claim("otlp-w")
        self.cm = running_store_server(self.store)
        return await self.cm.__aenter__(), claim.rollout.id, claim.attempt.id

    async def __aexit__(self, *exc: object) -> None:
        await self.cm.__aexit__(None, None, None)
        await self.store.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str, BackgroundLoop]]:
    db = tmp_path_factory.mktemp("fuzz-otlp") / "store.db"
    with served_in_thread(lambda: _Served(db)) as ((url, rollout, attempt), loop):
        yield url, rollout, attempt, loop


def _count(request: ExportTraceServiceRequest) -> int:
    return sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)


def test_ingest_never_fails_and_keeps_what_it_accepts(server: tuple[str, str, str, BackgroundLoop]) -> None:
    url, rollout, attempt, loop = server
    routes: list[tuple[str, str] | None] = [(rollout, attempt), (rollout, attempt), ("nope", "missing"), None]

    async def stored_ids() -> set[str]:
        async with StoreClient(url) as client:
            return {s.span_id for s in await client.query_spans(attempt_id=attempt, limit=10_000)}

    with httpx.Client(base_url=url, timeout=15) as http:

        @given(data=st.data(), request=_requests(routes))
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        def fuzz(data: st.DataObject, request: ExportTraceServiceRequest) -> None:
            body, headers = data.draw(_wire(request))
            r = http.post("/v1/traces", content=body, headers=headers)
            assert r.status_code < 500, r.text
            if r.status_code != 200:
                assert r.json()["error"]["message"], r.text
                return
            answer = ExportTraceServiceResponse()
            if r.headers["content-type"].startswith("application/json"):
                json_format.Parse(r.text, answer)
            else:
                answer.ParseFromString(r.content)
            sent = _count(request)
            assert 0 <= answer.partial_success.rejected_spans <= sent
            if answer.partial_success.rejected_spans == 0 and sent:
                missing = {s.span_id.hex() for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans}
                assert missing <= loop.run(stored_ids()), "a span reported accepted is not in the store"

        fuzz()
        assert len(loop.run(stored_ids())) > 1, "no drawn span reached the store: the fuzzer tested nothing"

        # afterwards a plain export is still stored
        plain = ExportTraceServiceRequest()
        span = plain.resource_spans.add().scope_spans.add().spans.add()
        span.trace_id, span.span_id, span.name = b"\x01" * 16, b"\x02" * 8, "after-fuzz"
        span.attributes.extend(_route(rollout, attempt))
        r = http.post(
            "/v1/traces", content=plain.SerializeToString(), headers={"content-type": "application/x-protobuf"}
        )
        assert r.status_code == 200 and "0202020202020202" in loop.run(stored_ids())
