"""OpenTelemetry spans of agent frameworks (via OpenInference) into the running rollout's store.

Imported only when an OpenInference instrumentor is installed, so OTel stays optional.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, cast

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider

from agentgrad import semconv
from agentgrad.context import current_context
from agentgrad.tracing.agent_names import current_agent_name
from agentgrad.types import Span, SpanEvent, SpanStatus

log = logging.getLogger(__name__)
_NS = 1e-9


class StoreSpanProcessor(SpanProcessor):
    """Writes each finished span to the store of the rollout that was running when it started.

    The rollout is looked up at start (the context variable is valid then, in the agent's task)
    and remembered by span id until the end. Spans started outside a rollout are not stored. A
    root OTel span gets the enclosing ``agent()``/``operation`` scope as parent, joining the trees.
    """

    def __init__(self) -> None:
        self._pending: dict[int, Any] = {}
        self._lock = threading.Lock()

    def on_start(self, span: Any, parent_context: otel_context.Context | None = None) -> None:
        context = current_context()
        if context is None:
            return
        span.set_attribute(semconv.ROLLOUT_ID, context.rollout_id)
        span.set_attribute(semconv.ATTEMPT_ID, context.attempt_id)
        agent_name = current_agent_name(context)
        if agent_name:
            span.set_attribute(semconv.AGENT_NAME, agent_name)
        with self._lock:
            self._pending[span.get_span_context().span_id] = context

    def on_end(self, span: ReadableSpan) -> None:
        own = span.get_span_context()  # an SDK span always has one
        if own is None:
            return
        with self._lock:
            context = self._pending.pop(own.span_id, None)
        if context is None:
            return
        events = [
            SpanEvent(name=e.name, timestamp=e.timestamp * _NS, attributes=dict(e.attributes or {}))
            for e in span.events
        ]
        try:
            context.store.add_span(
                Span(
                    rollout_id=context.rollout_id,
                    attempt_id=context.attempt_id,
                    span_id=f"{own.span_id:016x}",
                    trace_id=f"{own.trace_id:032x}",
                    parent_id=f"{span.parent.span_id:016x}" if span.parent else context.parent_span_id,
                    name=span.name,
                    start_time=(span.start_time or 0) * _NS,
                    end_time=(span.end_time or 0) * _NS,
                    status=SpanStatus.model_validate(
                        {"status_code": span.status.status_code.name, "description": span.status.description}
                    ),
                    attributes=dict(span.attributes or {}),
                    events=events,
                    resource={"service.name": "agentgrad-runner"},
                )
            )
        except Exception as exc:  # a lost enrichment span must never fail the agent
            log.warning("could not store span %r: %s: %s", span.name, type(exc).__name__, exc)

    def shutdown(self) -> None:
        with self._lock:
            self._pending.clear()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


_installed_on: set[int] = set()


def store_tracer_provider() -> TracerProvider:
    """The global SDK provider with a :class:`StoreSpanProcessor` (set up as global if none is)."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        trace.set_tracer_provider(TracerProvider())
        # The one set here, or by another thread that won the race: an SDK provider either way.
        provider = cast(TracerProvider, trace.get_tracer_provider())
    if id(provider) not in _installed_on:
        provider.add_span_processor(StoreSpanProcessor())
        _installed_on.add(id(provider))
    return provider
