"""Listening sockets for the services every CLI command starts (store, model server, proxy,
dashboard): one place for binding rules; and the header lines of the two lean HTTP/1.1 clients
(the store client and the proxy's upstream)."""

from __future__ import annotations

import socket
from collections.abc import Mapping


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
