"""Runner processes share each thread's default TLS context among the HTTP clients agents build:
the same verification, no CA bundle loaded per client, and a client asking for its own settings
still gets its own context."""

from __future__ import annotations

import ssl
import threading

import httpx
import pytest

from agentgrad.http import tls


@pytest.fixture
def shared(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Share, and put every transport module's own function back afterwards."""
    for module in tls.transport_modules():
        monkeypatch.setattr(module, "create_ssl_context", module.create_ssl_context)
    monkeypatch.delenv(tls.PER_CLIENT_ENV, raising=False)
    return tls.share_default_tls_contexts()


def _context(client: httpx.Client) -> ssl.SSLContext:
    return client._transport._pool._ssl_context  # type: ignore[attr-defined]


def test_clients_of_one_thread_share_a_context_that_still_verifies(shared: list[str]) -> None:
    assert "httpx._transports.default" in shared
    third = httpx.AsyncClient()
    with httpx.Client() as first, httpx.Client() as second:
        context = _context(first)
        assert _context(second) is context
        assert third._transport._pool._ssl_context is context  # type: ignore[attr-defined]
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert context.cert_store_stats()["x509_ca"] > 0  # the CAs httpx would have loaded


def test_each_thread_has_its_own_and_other_settings_their_own(shared: list[str], tmp_path, monkeypatch) -> None:
    with httpx.Client() as mine:
        context = _context(mine)
    theirs: list[ssl.SSLContext] = []
    thread = threading.Thread(target=lambda: theirs.append(_context(httpx.Client())))
    thread.start()
    thread.join()
    assert theirs[0] is not context  # httpcore sets ALPN on a context just before each handshake
    with httpx.Client(verify=False) as unverified:
        assert _context(unverified) is not context and _context(unverified).verify_mode == ssl.CERT_NONE
    custom = ssl.create_default_context()
    with httpx.Client(verify=custom) as given:
        assert _context(given) is custom
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "missing.pem"))  # another CA file: not the same context
    with pytest.raises(FileNotFoundError):
        httpx.Client()


def test_sharing_twice_wraps_once_and_the_opt_out_keeps_a_context_per_client(monkeypatch) -> None:
    import httpx._transports.default as transports

    original = transports.create_ssl_context
    monkeypatch.setattr(transports, "create_ssl_context", original)
    monkeypatch.setenv(tls.PER_CLIENT_ENV, "1")
    assert tls.share_default_tls_contexts() == []
    assert transports.create_ssl_context is original
    with httpx.Client() as first, httpx.Client() as second:
        assert _context(first) is not _context(second)
    monkeypatch.delenv(tls.PER_CLIENT_ENV)
    tls.share_default_tls_contexts()
    tls.share_default_tls_contexts()
    assert transports.create_ssl_context.__wrapped__ is original  # type: ignore[attr-defined]


def test_openai_and_langchain_clients_built_per_rollout_share_it(shared: list[str]) -> None:
    """What an agent that builds its client for each rollout does: a base URL naming the rollout."""
    openai = pytest.importorskip("openai")
    clients = [openai.OpenAI(base_url=f"http://127.0.0.1:9/rollout/r{i}/v1", api_key="none") for i in range(2)]
    contexts = [c._client._transport._pool._ssl_context for c in clients]
    assert contexts[0] is contexts[1]
