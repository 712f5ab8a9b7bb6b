"""OTLP/HTTP trace ingest: any OpenTelemetry exporter can write spans straight into the store.

``POST /v1/traces`` accepts an ``ExportTraceServiceRequest`` as binary protobuf
(``application/x-protobuf``) or in the OTLP JSON mapping (``application/json``: lowerCamelCase keys,
trace and span ids as hex strings, enums as integers), optionally gzip-compressed. Both encodings
go through the same protobuf message, so they cannot disagree.

A span lands in the store when its span attributes, or failing that its resource attributes, carry
``lightning.rollout_id`` and ``lightning.attempt_id`` (``semconv.ROLLOUT_ID`` / ``ATTEMPT_ID``) naming
an existing attempt. Every other span is counted as rejected and reported in the response's
``partial_success`` (as the OTLP specification asks), so an exporter never retries them forever.
Ingest is idempotent on ``(trace_id, span_id)``, like ``add_spans``.

Point an exporter at the store server with ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://HOST:4747/v1/traces``;
if the server has a token, add ``OTEL_EXPORTER_OTLP_HEADERS=Authorization=Bearer%20TOKEN``.
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as OtlpSpan
from pydantic import ValidationError

from lightning_rl import semconv
from lightning_rl.errors import InvalidRequestError, NotFoundError
from lightning_rl.store.base import MAX_BATCH, LightningStore
from lightning_rl.types import Span, SpanEvent, SpanStatus

__all__ = [
    "UnsupportedMediaType",
    "IngestResult",
    "decode_request",
    "convert_request",
    "encode_response",
    "ingest",
    "PROTOBUF",
    "JSON",
    "MAX_VALUE_DEPTH",
]

PROTOBUF = "application/x-protobuf"
JSON = "application/json"

_KINDS = {0: "internal", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}
_STATUS_CODES: dict[int, Literal["unset", "ok", "error"]] = {0: "unset", 1: "ok", 2: "error"}
_SCALARS = frozenset({"string_value", "bool_value", "int_value", "double_value"})  # AnyValue kinds kept as they are
_MAX_REPORTED = 5


class UnsupportedMediaType(InvalidRequestError):
    """The request's Content-Type or Content-Encoding is not one OTLP/HTTP defines (HTTP 415)."""


@dataclass
class IngestResult:
    """What happened to the spans of one export request."""

    accepted: int = 0
    rejected: int = 0
    reasons: list[str] = field(default_factory=list[str])

    def reject(self, n: int, reason: str) -> None:
        self.rejected += n
        if len(self.reasons) < _MAX_REPORTED:
            self.reasons.append(reason)

    @property
    def message(self) -> str:
        more = " (more not shown)" if self.rejected and len(self.reasons) >= _MAX_REPORTED else ""
        return "; ".join(self.reasons) + more


# --------------------------------------------------------------------------------------------
# Decoding
# --------------------------------------------------------------------------------------------


def decode_request(
    body: bytes, content_type: str, content_encoding: str = "", max_bytes: int = 64 << 20
) -> ExportTraceServiceRequest:
    """Parse an export request in either OTLP/HTTP encoding; ``InvalidRequestError`` if malformed."""
    body = _decompress(body, content_encoding.strip().lower(), max_bytes)
    media = content_type.split(";", 1)[0].strip().lower()
    request = ExportTraceServiceRequest()
    if media == PROTOBUF:
        try:
            request.ParseFromString(body)
        except DecodeError as exc:
            raise InvalidRequestError(f"body is not a valid OTLP ExportTraceServiceRequest protobuf: {exc}") from None
        return request
    if media == JSON:
        try:
            payload = json.loads(body)
        except ValueError as exc:
            raise InvalidRequestError(f"request body is not valid JSON: {exc}") from None
        if not isinstance(payload, dict):
            raise InvalidRequestError("OTLP JSON body must be an object with a `resourceSpans` list.")
        _hex_ids_to_base64(payload)
        try:
            json_format.ParseDict(payload, request, ignore_unknown_fields=True)
        except json_format.ParseError as exc:
            raise InvalidRequestError(f"invalid OTLP JSON: {exc}") from None
        return request
    raise UnsupportedMediaType(
        f"unsupported Content-Type {content_type!r} for /v1/traces; send {PROTOBUF} or {JSON} (OTLP/HTTP)."
    )


def _decompress(body: bytes, encoding: str, max_bytes: int) -> bytes:
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise UnsupportedMediaType(f"unsupported Content-Encoding {encoding!r}; send gzip or no compression.")
    inflater = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)
    try:
        out = inflater.decompress(body, max_bytes + 1)
    except zlib.error as exc:
        raise InvalidRequestError(f"body is not valid {encoding} data: {exc}") from None
    if len(out) > max_bytes:
        raise InvalidRequestError(f"decompressed body is over the {max_bytes}-byte limit; export smaller batches.")
    return out


def _hex_ids_to_base64(payload: dict[str, Any]) -> None:
    """OTLP JSON writes ids as hex; protobuf's JSON mapping wants base64 for ``bytes`` fields."""
    for i, rs in enumerate(_items(payload, "resourceSpans", "resource_spans")):
        for j, ss in enumerate(_items(rs, "scopeSpans", "scope_spans")):
            for k, span in enumerate(_items(ss, "spans")):
                where = f"resourceSpans[{i}].scopeSpans[{j}].spans[{k}]"
                _fix_ids(span, where, ("traceId", "trace_id", "spanId", "span_id", "parentSpanId", "parent_span_id"))
                for m, link in enumerate(_items(span, "links")):
                    _fix_ids(link, f"{where}.links[{m}]", ("traceId", "trace_id", "spanId", "span_id"))


def _items(obj: Any, *keys: str) -> Iterable[Any]:
    if not isinstance(obj, dict):
        return ()
    for key in keys:
        value = obj.get(key)
        if isinstance(value, list):
            return value
    return ()


def _fix_ids(obj: Any, where: str, keys: Sequence[str]) -> None:
    if not isinstance(obj, dict):
        return
    for key in keys:
        value = obj.get(key)
        if isinstance(value, str) and value:
            try:
                obj[key] = base64.b64encode(bytes.fromhex(value)).decode()
            except ValueError:
                raise InvalidRequestError(f"{where}.{key} must be a hex string (OTLP JSON), got {value!r}.") from None


# --------------------------------------------------------------------------------------------
# Conversion
# --------------------------------------------------------------------------------------------


def convert_request(request: ExportTraceServiceRequest, result: IngestResult) -> list[Span]:
    """The store spans of an export request; spans that cannot be routed are rejected in ``result``."""
    out: list[Span] = []
    for rs in request.resource_spans:
        resource_attrs = _attributes(rs.resource.attributes)
        for ss in rs.scope_spans:
            for otlp_span in ss.spans:
                span = _convert_span(otlp_span, resource_attrs, result)
                if span is not None:
                    out.append(span)
    return out


def _convert_span(s: OtlpSpan, resource_attrs: dict[str, Any], result: IngestResult) -> Span | None:
    attrs = _attributes(s.attributes)
    ids = semconv.attributed_ids(attrs, resource_attrs)
    label = f"span {s.span_id.hex() or '?'} ({s.name!r})"
    if ids is None:
        result.reject(
            1,
            f"{label} has no {semconv.ROLLOUT_ID} / {semconv.ATTEMPT_ID} string attribute (span or resource); "
            "set both to route it to a rollout attempt",
        )
        return None
    rollout_id, attempt_id = ids
    try:
        return Span(
            trace_id=s.trace_id.hex(),
            span_id=s.span_id.hex(),
            parent_id=s.parent_span_id.hex() or None,
            name=s.name,
            kind=_KINDS.get(s.kind, "internal"),
            start_ns=s.start_time_unix_nano,
            end_ns=s.end_time_unix_nano or None,
            attributes=attrs,
            events=[
                SpanEvent(name=e.name, time_ns=e.time_unix_nano, attributes=_attributes(e.attributes)) for e in s.events
            ],
            status=SpanStatus(code=_STATUS_CODES.get(s.status.code, "unset"), message=s.status.message or None),
            rollout_id=rollout_id,
            attempt_id=attempt_id,
        )
    except ValidationError as exc:
        fields = ", ".join(".".join(str(p) for p in e["loc"]) + f": {e['msg']}" for e in exc.errors(include_url=False))
        result.reject(1, f"{label} is invalid ({fields})")
        return None


MAX_VALUE_DEPTH = 32
"""Deepest nesting of an attribute value (arrays / key-value lists) accepted from OTLP."""


def _attributes(kvs: Iterable[KeyValue], depth: int = 0) -> dict[str, Any]:
    return {kv.key: _value(kv.value, depth) for kv in kvs}


def _value(v: AnyValue, depth: int = 0) -> Any:
    if depth > MAX_VALUE_DEPTH:
        raise InvalidRequestError(
            f"an OTLP attribute value is nested more than {MAX_VALUE_DEPTH} levels deep; flatten it."
        )
    which = v.WhichOneof("value")
    if which in _SCALARS:
        return getattr(v, which)
    if which == "array_value":
        return [_value(x, depth + 1) for x in v.array_value.values]
    if which == "kvlist_value":
        return _attributes(v.kvlist_value.values, depth + 1)
    if which == "bytes_value":
        return base64.b64encode(v.bytes_value).decode()
    return None


# --------------------------------------------------------------------------------------------
# Storing and answering
# --------------------------------------------------------------------------------------------


async def store_spans(store: LightningStore, spans: Sequence[Span], result: IngestResult) -> None:
    """Add spans attempt by attempt, so one unknown attempt rejects only its own spans."""
    groups: dict[tuple[str, str], list[Span]] = {}
    for span in spans:
        groups.setdefault((span.rollout_id, span.attempt_id), []).append(span)
    for (rollout_id, attempt_id), group in groups.items():
        for start in range(0, len(group), MAX_BATCH):
            chunk = group[start : start + MAX_BATCH]
            try:
                await store.add_spans(chunk)
            except NotFoundError:
                result.reject(len(chunk), f"attempt {attempt_id} of rollout {rollout_id} does not exist")
            else:
                result.accepted += len(chunk)


def encode_response(result: IngestResult, media: str) -> bytes:
    """An ``ExportTraceServiceResponse`` in the request's encoding (``partial_success`` if any rejected)."""
    response = ExportTraceServiceResponse()
    if result.rejected:
        response.partial_success.rejected_spans = result.rejected
        response.partial_success.error_message = result.message
    if media == JSON:
        return json_format.MessageToJson(response, indent=None).encode()
    return response.SerializeToString()


async def ingest(
    store: LightningStore,
    body: bytes,
    *,
    content_type: str,
    content_encoding: str = "",
    max_bytes: int = 64 << 20,
) -> tuple[bytes, str]:
    """Handle one ``POST /v1/traces`` body; return the response body and its media type."""
    try:
        request = decode_request(body, content_type, content_encoding, max_bytes)
        media = JSON if content_type.split(";", 1)[0].strip().lower() == JSON else PROTOBUF
        result = IngestResult()
        spans = convert_request(request, result)
    except RecursionError:  # json.loads / ParseDict on arrays or objects nested thousands deep
        raise InvalidRequestError(
            f"OTLP body is nested too deeply; keep attribute values under {MAX_VALUE_DEPTH} levels of nesting."
        ) from None
    await store_spans(store, spans, result)
    return encode_response(result, media), media
