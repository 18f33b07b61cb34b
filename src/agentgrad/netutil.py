"""Listening sockets for the services every CLI command starts (store, model server, proxy,
dashboard): one place for binding rules."""

from __future__ import annotations

import socket


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
