"""Serving helpers for the services every CLI command starts (store, model server, proxy,
dashboard): one place for binding rules, for running uvicorn in a thread (embedded use: tests, a
trainer, notebooks) or in the foreground until SIGTERM/SIGINT (the CLI); and the header lines of
the two lean HTTP/1.1 clients (the sync transport and the proxy's upstream)."""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import uvicorn


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound *and listening* before the server starts.

    Binding first resolves port 0 to a known free port to report; listening at once means a
    client that connects as soon as the URL is printed waits in the backlog instead of being
    refused while the server is still starting.
    """
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    return sock


def http_url(host: str, port: int) -> str:
    """``http://host:port`` (IPv6 hosts bracketed)."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def header_lines(headers: Mapping[str, str]) -> str:
    """``name: value\r\n`` for each header; a line break in a name or value is refused, since it
    would smuggle in another header (or a whole second request)."""
    for name, value in headers.items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
            raise ValueError(f"header {name!r} contains a line break")
    return "".join(f"{name}: {value}\r\n" for name, value in headers.items())


def serve_in_thread(
    server: uvicorn.Server, sock: socket.socket, *, name: str = "agentgrad-http", timeout: float = 30.0
) -> threading.Thread:
    """Run ``server`` on the listening ``sock`` from a daemon thread called ``name``; returns the
    thread once the server accepts connections.

    Stop it with ``server.should_exit = True`` and a ``join``. Raises :class:`RuntimeError` when
    the server exits during start-up (the socket is closed) or is not up after ``timeout`` seconds
    (it is told to exit once it is).
    """
    address = sock.getsockname()
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=name, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            if thread.is_alive():
                server.should_exit = True  # it exits, closing the socket, once it gets there
            else:
                sock.close()
            raise RuntimeError(f"{name} failed to start on {http_url(*address[:2])}")
        time.sleep(0.005)
    return thread


def serve_until_signal(server: uvicorn.Server, sock: socket.socket) -> None:
    """Serve ``server`` on ``sock`` in the foreground until SIGTERM or SIGINT, then return normally,
    so the caller can close what it owns (a store, an engine) and exit 0.

    uvicorn shuts down gracefully on either signal (a second SIGINT forces the exit without
    waiting for open connections), then re-raises it to the handler that was in place before it
    started: the default one would kill the process before any ``finally`` ran. For the duration
    of the run that handler only asks the server to exit, which also covers a signal arriving
    before uvicorn installed its own; the handlers from before are restored afterwards. Outside
    the main thread, where signals cannot be handled, the server simply runs until told to exit.
    """
    if threading.current_thread() is not threading.main_thread():
        server.run(sockets=[sock])
        return

    def ask_to_exit(signum: int, frame: Any) -> None:
        server.force_exit = server.should_exit  # a second signal: stop waiting for connections
        server.should_exit = True

    previous = {signum: signal.signal(signum, ask_to_exit) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.run(sockets=[sock])
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
