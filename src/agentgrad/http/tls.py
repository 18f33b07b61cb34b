"""One default TLS context per thread for the HTTP clients an agent builds, not one per client.

Why: httpx (and httpx2, which the OpenAI SDK calls through) builds an ``ssl.SSLContext`` for every
client it makes, loading the whole CA bundle each time: 15–20 ms of CPU. An agent that builds its
client for each rollout — ``OpenAI(base_url=llm.endpoint)``, or LangChain's ``ChatOpenAI``, which
makes two (sync and async), cached by a base URL that names the rollout — paid that on every
rollout, although the proxy it calls speaks plain HTTP and never uses the context. A runner
process shares each thread's default context instead (the same verify settings: the system's or
``SSL_CERT_FILE``/``SSL_CERT_DIR``'s CAs), as httpx's own documentation advises for many clients.

Per thread, because httpcore sets a context's ALPN protocols just before each TLS handshake: two
clients that share a context and connect at the same moment from two threads could otherwise
offer each other's protocols. A client asking for other verification (``verify=False``, a CA
file, its own context) or a client certificate gets its own context, as before; and
``AGENTGRAD_TLS_CONTEXT_PER_CLIENT=1`` in a runner's environment keeps httpx's behaviour whole.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

#: The modules whose transports make a context per client (httpx, and httpx2 when installed).
TRANSPORT_MODULES = ("httpx._transports.default", "httpx2._transports.default")
#: Set to ``1`` in a runner's environment: every client makes its own context, as httpx does.
PER_CLIENT_ENV = "AGENTGRAD_TLS_CONTEXT_PER_CLIENT"

_local = threading.local()


def _shared(create: Callable[..., Any]) -> Callable[..., Any]:
    def create_ssl_context(verify: Any = True, cert: Any = None, trust_env: bool = True) -> Any:
        if verify is not True or cert is not None:
            return create(verify=verify, cert=cert, trust_env=trust_env)
        environ = (os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR")) if trust_env else None
        key = (create, trust_env, environ)
        contexts: dict[Any, Any] = _local.__dict__.setdefault("contexts", {})
        context = contexts.get(key)
        if context is None:
            context = contexts[key] = create(verify=True, cert=None, trust_env=trust_env)
        return context

    create_ssl_context.__wrapped__ = create  # type: ignore[attr-defined]
    return create_ssl_context


def transport_modules() -> list[ModuleType]:
    """Those of :data:`TRANSPORT_MODULES` that are installed and call ``create_ssl_context``."""
    modules = []
    for name in TRANSPORT_MODULES:
        if importlib.util.find_spec(name.split(".")[0]) is not None:
            module = importlib.import_module(name)
            if hasattr(module, "create_ssl_context"):
                modules.append(module)
    return modules


def share_default_tls_contexts() -> list[str]:
    """Make the installed httpx transports share each thread's default TLS context (idempotent;
    nothing when :data:`PER_CLIENT_ENV` is ``1``): the modules that share it."""
    if os.environ.get(PER_CLIENT_ENV) == "1":
        return []
    modules = transport_modules()
    for module in modules:
        create = module.create_ssl_context
        if not hasattr(create, "__wrapped__"):
            setattr(module, "create_ssl_context", _shared(create))  # noqa: B010  # the name its transports call
    return [module.__name__ for module in modules]
