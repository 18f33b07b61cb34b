"""``instrument()``: make every openai request of a rollout say which rollout it belongs to.

The proxy attributes calls by URL prefix, but many frameworks build one client (or read
``OPENAI_BASE_URL``) once per process and share it across concurrent rollouts. So the openai
SDK's request-building step, ``BaseClient._build_headers`` — the same in openai 2.x and 3.x, and
independent of the transport (3.x sends through ``httpx2``, so httpx hooks would miss it) — adds
headers read from the rollout context variable at the moment of each request. A context variable
follows asyncio tasks and ``asyncio.to_thread``, so concurrent rollouts sharing one client stay
apart.

It also turns on the OpenInference instrumentors that are installed, with a span processor that
writes their spans into the running rollout's store, so framework agent/tool spans and the
proxy's LLM spans form one tree (the proxy reads the W3C ``traceparent`` this module injects).
"""

from __future__ import annotations

import functools
import importlib
import logging
import sys
import threading
from typing import Any

from agentgrad import semconv
from agentgrad.context import current_context

log = logging.getLogger(__name__)

_lock = threading.Lock()
_done = False

#: OpenInference instrumentors turned on when their package is installed: (module, class).
_OPENINFERENCE = (
    ("openinference.instrumentation.openai", "OpenAIInstrumentor"),
    ("openinference.instrumentation.langchain", "LangChainInstrumentor"),
    ("openinference.instrumentation.openai_agents", "OpenAIAgentsInstrumentor"),
    ("openinference.instrumentation.autogen_agentchat", "AutogenAgentChatInstrumentor"),
    ("openinference.instrumentation.smolagents", "SmolagentsInstrumentor"),
    ("openinference.instrumentation.crewai", "CrewAIInstrumentor"),
    ("openinference.instrumentation.llama_index", "LlamaIndexInstrumentor"),
)


def _current_traceparent() -> str | None:
    """The W3C traceparent of the active OpenTelemetry span, if OTel is loaded and one is active."""
    trace = sys.modules.get("opentelemetry.trace")  # not imported: no span can be active
    if trace is None:
        return None
    span_context = trace.get_current_span().get_span_context()
    if not span_context.is_valid:
        return None
    return f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-{int(span_context.trace_flags):02x}"


def rollout_headers() -> dict[str, str]:
    """The headers that attribute a request made now to the running rollout ({} outside one)."""
    context = current_context()
    if context is None:
        return {}
    headers = {semconv.HEADER_ROLLOUT_ID: context.rollout_id, semconv.HEADER_ATTEMPT_ID: context.attempt_id}
    if context.agent_name:
        headers[semconv.HEADER_AGENT_NAME] = context.agent_name
    traceparent = _current_traceparent()
    if traceparent:  # an OTel span (e.g. OpenInference's) is the most specific parent
        headers["traceparent"] = traceparent
    elif context.parent_span_id:
        headers[semconv.HEADER_PARENT_ID] = context.parent_span_id
    return headers


def _patch_openai() -> bool:
    try:
        from openai import _base_client
    except ImportError:
        return False
    cls = _base_client.BaseClient
    original = cls._build_headers
    if getattr(original, "_agentgrad_patched", False):
        return True

    @functools.wraps(original)
    def _build_headers(self: Any, *args: Any, **kwargs: Any) -> Any:
        headers = original(self, *args, **kwargs)
        for name, value in rollout_headers().items():
            headers[name] = value  # the context at call time wins over a client's stale defaults
        return headers

    _build_headers._agentgrad_patched = True  # type: ignore[attr-defined]
    cls._build_headers = _build_headers
    return True


def _enable_openinference() -> list[str]:
    available = []
    for module_name, class_name in _OPENINFERENCE:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        available.append(getattr(module, class_name))
    if not available:
        return []
    from agentgrad.tracing.otel import store_tracer_provider

    provider = store_tracer_provider()
    enabled = []
    for instrumentor_class in available:
        instrumentor = instrumentor_class()
        try:
            if not instrumentor.is_instrumented_by_opentelemetry:
                instrumentor.instrument(tracer_provider=provider)
            enabled.append(instrumentor_class.__name__)
        except Exception:  # an instrumentor broken by a version mismatch must not stop the runner
            log.warning("could not enable %s", instrumentor_class.__name__, exc_info=True)
    return enabled


def instrument() -> None:
    """Tag openai requests with the rollout context and enable OpenInference if installed.

    Idempotent and thread-safe; the runner calls it once before running agents.
    """
    global _done
    with _lock:
        if _done:
            return
        patched = _patch_openai()
        enabled = _enable_openinference()
        _done = True
    log.debug("agentgrad.instrument(): openai client patched=%s, OpenInference: %s", patched, enabled or "none")
