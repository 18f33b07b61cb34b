"""OTLP/HTTP trace ingestion: ExportTraceServiceRequest (protobuf or JSON) → :class:`Span`.

Any OpenTelemetry SDK can then export straight into the store: a span lands on the attempt named
by its ``agentgrad.rollout_id`` / ``agentgrad.attempt_id`` attributes (span attributes win over
resource attributes). Spans that name no attempt cannot be stored; they are counted and reported
back as an OTLP partial success instead of vanishing.
"""

from __future__ import annotations

import base64
import gzip
import json
import zlib
from dataclasses import dataclass, field
from typing import Any, Literal

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from pydantic import ValidationError

from agentgrad import semconv
from agentgrad.errors import InvalidInputError
from agentgrad.store.jsoncheck import loads
from agentgrad.store.service.responses import plain_message
from agentgrad.types import Span, SpanEvent, SpanStatus

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
_STATUS: dict[int, Literal["UNSET", "OK", "ERROR"]] = {0: "UNSET", 1: "OK", 2: "ERROR"}
_ID_FIELDS = ("traceId", "spanId", "parentSpanId")


@dataclass
class Decoded:
    """Spans ready for the store, and what could not be attributed to an attempt."""

    spans: list[Span] = field(default_factory=list)
    rejected: int = 0
    problems: list[str] = field(default_factory=list)


def decompress(body: bytes, encoding: str | None, limit: int) -> bytes:
    """Undo ``Content-Encoding: gzip|deflate``, refusing output larger than ``limit`` bytes."""
    if not encoding or encoding == "identity":
        return body
    if encoding not in ("gzip", "deflate"):
        raise InvalidInputError(f"unsupported Content-Encoding {encoding!r} (use gzip, deflate or none)")
    inflater = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)
    try:
        out = inflater.decompress(body, limit + 1)
    except (zlib.error, gzip.BadGzipFile) as exc:
        raise InvalidInputError(f"body is not valid {encoding} data: {exc}") from None
    if len(out) > limit:
        raise OverflowError(f"decompressed body exceeds {limit} bytes")
    return out


def parse_request(body: bytes, content_type: str) -> ExportTraceServiceRequest:
    """Decode an OTLP trace export; OTLP/JSON carries ids as hex, not protobuf-JSON base64.

    OTLP/JSON is parsed with the service's bounds (:func:`agentgrad.store.jsoncheck.loads`:
    nesting, number size, lone surrogates), so a hostile body is refused, never a crash."""
    message = ExportTraceServiceRequest()
    if content_type == PROTOBUF:
        try:
            message.ParseFromString(body)
        except DecodeError as exc:
            raise InvalidInputError(f"body is not an OTLP ExportTraceServiceRequest protobuf: {exc}") from None
        return message
    if content_type != JSON:
        raise InvalidInputError(f"unsupported Content-Type {content_type!r} (use {PROTOBUF} or {JSON})")
    document = loads(body)
    try:
        _hex_ids_to_base64(document)
        json_format.ParseDict(document, message, ignore_unknown_fields=True)
    except (ValueError, TypeError, AttributeError, RecursionError, json_format.ParseError) as exc:
        raise InvalidInputError(f"body is not an OTLP/JSON ExportTraceServiceRequest: {exc}") from None
    return message


def _hex_ids_to_base64(document: Any) -> None:
    if not isinstance(document, dict):
        raise TypeError("the top level must be an object")
    for resource_spans in document.get("resourceSpans") or []:
        for scope_spans in resource_spans.get("scopeSpans") or []:
            for span in scope_spans.get("spans") or []:
                for holder in [span, *(span.get("links") or [])]:
                    for key in _ID_FIELDS:
                        if holder.get(key):
                            holder[key] = base64.b64encode(bytes.fromhex(holder[key])).decode()


def to_spans(message: ExportTraceServiceRequest) -> Decoded:
    """The spans of an export; a span the store could never take (no attempt named, an id with
    a NUL character or too long) is counted as rejected, with the reason."""
    out = Decoded()
    for resource_spans in message.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for otel in scope_spans.spans:
                attributes = _attributes(otel.attributes)
                rollout_id = attributes.get(semconv.ROLLOUT_ID, resource.get(semconv.ROLLOUT_ID))
                attempt_id = attributes.get(semconv.ATTEMPT_ID, resource.get(semconv.ATTEMPT_ID))
                if not rollout_id or not attempt_id or not otel.span_id:
                    out.rejected += 1
                    missing = "span_id" if rollout_id and attempt_id else f"{semconv.ROLLOUT_ID}/{semconv.ATTEMPT_ID}"
                    out.problems.append(f"span {otel.name!r} has no {missing}")
                    continue
                try:
                    span = Span(
                        rollout_id=str(rollout_id),
                        attempt_id=str(attempt_id),
                        span_id=otel.span_id.hex(),
                        trace_id=otel.trace_id.hex(),
                        parent_id=otel.parent_span_id.hex() or None,
                        name=otel.name,
                        start_time=otel.start_time_unix_nano / 1e9,
                        end_time=otel.end_time_unix_nano / 1e9 if otel.end_time_unix_nano else None,
                        status=SpanStatus(
                            status_code=_STATUS.get(otel.status.code, "UNSET"),
                            description=otel.status.message or None,
                        ),
                        attributes=attributes,
                        events=[
                            SpanEvent(
                                name=event.name,
                                timestamp=event.time_unix_nano / 1e9 if event.time_unix_nano else None,
                                attributes=_attributes(event.attributes),
                            )
                            for event in otel.events
                        ],
                        resource=resource,
                    )
                except ValidationError as exc:
                    out.rejected += 1
                    problem = exc.errors(include_url=False)[0]
                    where = ".".join(str(part) for part in problem["loc"])
                    out.problems.append(f"span {otel.name[:100]!r}: {where}: {plain_message(problem)}")
                    continue
                out.spans.append(span)
    return out


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(item) for item in value.array_value.values]
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    return getattr(value, kind)


def encode_response(rejected: int, message: str, content_type: str) -> bytes:
    """An ExportTraceServiceResponse, partial success filled only when something was rejected."""
    response = ExportTraceServiceResponse()
    if rejected:
        response.partial_success.CopyFrom(ExportTracePartialSuccess(rejected_spans=rejected, error_message=message))
    if content_type == PROTOBUF:
        return response.SerializeToString()
    return json.dumps(json_format.MessageToDict(response)).encode()
