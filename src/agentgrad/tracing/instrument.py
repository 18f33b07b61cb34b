"""``instrument()``: make every openai request of a rollout say which rollout it belongs to.

The proxy attributes calls by URL prefix, but many frameworks build one client (or read
``OPENAI_BASE_URL``) once per process and share it across concurrent rollouts. So the openai
SDK's request-building step, ``BaseClient._build_headers`` — the same in openai 2.x and 3.x, and
independent of the transport (3.x sends through ``httpx2``, so httpx hooks would miss it) — adds
headers read from the rollout context variable at the moment of each request. A context variable
follows asyncio tasks and ``asyncio.to_thread``, so concurrent rollouts sharing one client stay
apart.

The agent name it sends is the calling agent's as its framework knows it (a LangGraph node, an
Agents SDK agent, an AutoGen agent, a CrewAI role, ...; :mod:`agentgrad.tracing.agent_names`),
so multi-agent systems can be trained selectively with no change to their code; for frameworks
without a context variable to read, ``instrument()`` wraps their agent entry point once, when
the framework is imported.

It also turns on the OpenInference instrumentors that are installed, with a span processor that
writes their spans into the running rollout's store, so framework agent/tool spans and the
proxy's LLM spans form one tree (the proxy reads the W3C ``traceparent`` this module injects).
"""

from __future__ import annotations

import functools
import importlib
import logging
import string
import sys
import threading
from typing import Any
from urllib.parse import quote

from agentgrad import semconv
from agentgrad.context import current_context
from agentgrad.tracing import agent_names
from agentgrad.tracing.post_import import when_imported

log = logging.getLogger(__name__)

_lock = threading.Lock()
_done = False

#: OpenInference instrumentors turned on when their package is installed, once the library they
#: instrument is imported: (library module, instrumentor module, class).
_OPENINFERENCE = (
    ("openai", "openinference.instrumentation.openai", "OpenAIInstrumentor"),
    ("langchain_core", "openinference.instrumentation.langchain", "LangChainInstrumentor"),
    ("agents", "openinference.instrumentation.openai_agents", "OpenAIAgentsInstrumentor"),
    ("autogen_agentchat", "openinference.instrumentation.autogen_agentchat", "AutogenAgentChatInstrumentor"),
    ("smolagents", "openinference.instrumentation.smolagents", "SmolagentsInstrumentor"),
    ("crewai", "openinference.instrumentation.crewai", "CrewAIInstrumentor"),
    ("llama_index.core", "openinference.instrumentation.llama_index", "LlamaIndexInstrumentor"),
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
    agent_name = agent_names.current_agent_name(context)
    if agent_name:
        headers[semconv.HEADER_AGENT_NAME] = header_value(agent_name)
    traceparent = _current_traceparent()
    if traceparent:  # an OTel span (e.g. OpenInference's) is the most specific parent
        headers["traceparent"] = traceparent
    elif context.parent_span_id:
        headers[semconv.HEADER_PARENT_ID] = context.parent_span_id
    return headers


#: Sent as they are: printable ASCII but ``%`` (the proxy percent-decodes the agent name).
_VERBATIM = "".join(c for c in string.printable if c not in string.whitespace and c != "%")


def header_value(text: str) -> str:
    """``text`` percent-encoded where HTTP would refuse it (a CrewAI role "Rédacteur", a newline):
    httpx rejects a non-ASCII header and a control character would break the request."""
    return quote(text, safe=_VERBATIM)


def _patch_openai(base_client: Any) -> None:
    """Patch ``openai._base_client`` (given) — when it is imported, not before: importing openai
    costs a runner process half a second of its start, and an agent may never use it."""
    cls = base_client.BaseClient
    original = cls._build_headers
    if getattr(original, "_agentgrad_patched", False):
        return

    @functools.wraps(original)
    def _build_headers(self: Any, *args: Any, **kwargs: Any) -> Any:
        headers = original(self, *args, **kwargs)
        for name, value in rollout_headers().items():
            headers[name] = value  # the context at call time wins over a client's stale defaults
        return headers

    _build_headers._agentgrad_patched = True  # type: ignore[attr-defined]
    cls._build_headers = _build_headers


def _enable_openinference_for(module_name: str, class_name: str, _library: Any = None) -> None:
    """Turn on one OpenInference instrumentor, if installed (called once its library is imported:
    an instrumentor imports that library, which can take a runner process seconds to start)."""
    try:
        instrumentor_class = getattr(importlib.import_module(module_name), class_name)
    except ImportError:
        return
    from agentgrad.tracing.otel import store_tracer_provider

    instrumentor = instrumentor_class()
    try:
        if not instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.instrument(tracer_provider=store_tracer_provider())
        log.debug("agentgrad.instrument(): %s enabled", class_name)
    except Exception:  # an instrumentor broken by a version mismatch must not stop the runner
        log.warning("could not enable %s", class_name, exc_info=True)


def instrument() -> None:
    """Tag openai requests with the rollout context and calling agent, and enable OpenInference
    if installed — each patch as soon as its library is imported (at once if it already is).

    Idempotent and thread-safe; the runner calls it once before running agents.
    """
    global _done
    with _lock:
        if _done:
            return
        when_imported("openai._base_client", _patch_openai)
        agent_names.install()
        for library, module_name, class_name in _OPENINFERENCE:
            when_imported(library, functools.partial(_enable_openinference_for, module_name, class_name))
        _done = True
