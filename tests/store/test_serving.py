"""The store service's HTTP protocol (agentgrad.store.service.fastpath): store calls answered straight from
the parser, and every request that path declines still answered as through ASGI, on raw sockets."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest

pytest.importorskip("fastapi")

from agentgrad.store.memory import MemoryStore  # noqa: E402
from agentgrad.store.service.server import StoreServer  # noqa: E402

TOKEN = "t0ken"


@pytest.fixture
def served() -> Iterator[StoreServer]:
    server = StoreServer(
        MemoryStore(watchdog_interval=None), token=TOKEN, owns_store=True, cors_origins=["http://ui.test"]
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture
def direct_answers(served: StoreServer, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Paths answered by the direct path (not declined), in order."""
    answered: list[str] = []
    direct = served.app.direct
    answer = direct.answer

    def recording(accepted, body):
        response = answer(accepted, body)
        if response is not None:
            answered.append(accepted[0].path)
        return response

    monkeypatch.setattr(direct, "answer", recording)
    return answered


def _request(
    method: str, target: str, body: object = None, headers: dict[str, str] | None = None, token: bool = True
) -> bytes:
    content = b"" if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
    fields = {"Host": "127.0.0.1", **({"Authorization": f"Bearer {TOKEN}"} if token else {}), **(headers or {})}
    if body is not None:
        fields.setdefault("Content-Type", "application/json")
        fields.setdefault("Content-Length", str(len(content)))
    head = f"{method} {target} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items()) + "\r\n"
    return head.encode() + content


class _Reader:
    """Reads HTTP/1.1 responses (Content-Length framed) off one socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        self.buffer += chunk

    def response(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buffer:
            self._fill()
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(self.buffer) < length:
            self._fill()
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return int(lines[0].split()[1]), headers, body

    def closed(self) -> bool:
        self.sock.settimeout(5)
        return self.buffer == b"" and self.sock.recv(1) == b""


def _connect(server: StoreServer) -> tuple[socket.socket, _Reader]:
    sock = socket.create_connection((server.host, server.port), timeout=10)
    return sock, _Reader(sock)


def test_store_calls_are_answered_directly_and_pipelined_ones_in_order(served, direct_answers):
    sock, reader = _connect(served)
    with sock:
        sock.sendall(
            _request("POST", "/v1/rollouts/enqueue", {"rollouts": [{"input": 1, "rollout_id": "ro-a"}]})
            + _request("GET", "/v1/rollouts/get?rollout_id=ro-a")
            + _request("GET", "/v1/rollouts/get?rollout_id=ro-missing")
        )
        first, second, third = reader.response(), reader.response(), reader.response()
    assert first[0] == 200 and json.loads(first[2])["rollouts"][0]["rollout_id"] == "ro-a"
    assert second[0] == 200 and json.loads(second[2])["rollout_id"] == "ro-a"
    assert third[0] == 404 and json.loads(third[2])["error"] == "not_found"
    assert first[1]["content-type"] == "application/json" and "date" in first[1]
    assert direct_answers == ["/v1/rollouts/enqueue", "/v1/rollouts/get", "/v1/rollouts/get"]


def test_a_long_poll_is_declined_after_its_body_and_the_connection_goes_on(served, direct_answers):
    sock, reader = _connect(served)
    with sock:
        sock.sendall(_request("POST", "/v1/rollouts/dequeue", {"limit": 1, "timeout": 0.2}))
        status, _, body = reader.response()
        assert status == 200 and json.loads(body) == {"claimed": []}
        sock.sendall(
            _request("POST", "/v1/rollouts/enqueue", {"rollouts": [{"input": 2}]})
            + _request("POST", "/v1/rollouts/dequeue", {"limit": 1, "timeout": 0})
        )
        assert reader.response()[0] == 200
        status, _, body = reader.response()
    assert status == 200 and json.loads(body)["claimed"][0]["rollout"]["input"] == 2
    assert direct_answers == ["/v1/rollouts/enqueue", "/v1/rollouts/dequeue"], "the long poll went through ASGI"


def test_refusals_and_metrics_are_the_same_on_the_direct_path(served, direct_answers):
    sock, reader = _connect(served)
    with sock:
        sock.sendall(
            _request("GET", "/v1/workers", token=False)
            + _request("POST", "/v1/rollouts/enqueue", {"rollouts": [{"mode": "nope"}]})
            + _request("POST", "/v1/rollouts/enqueue", b"not json", headers={"Content-Type": "text/plain"})
            + _request("GET", "/v1/workers")
            + _request("GET", "/metrics")
        )
        unauthorized, invalid, not_json, workers, metrics = (reader.response() for _ in range(5))
    assert unauthorized[0] == 401 and unauthorized[1]["www-authenticate"] == "Bearer"
    assert invalid[0] == 422 and "rollouts.0.mode" in json.loads(invalid[2])["message"]
    assert not_json[0] == 422 and "Content-Type" in json.loads(not_json[2])["message"]
    assert workers[0] == 200 and json.loads(workers[2]) == {"workers": []}
    text = metrics[2].decode()
    assert 'agentgrad_http_requests_total{method="GET",route="/v1/workers",status="401"} 1' in text
    assert 'agentgrad_http_requests_total{method="GET",route="/v1/workers",status="200"} 1' in text
    assert 'route="/v1/rollouts/enqueue",status="422"} 2' in text
    # The authorized GET /v1/workers is a heavy read: declined here, answered from a worker thread.
    assert direct_answers == ["/v1/workers", "/v1/rollouts/enqueue", "/v1/rollouts/enqueue"]


@pytest.mark.parametrize(
    "case", ["connection close", "expect continue", "chunked", "escaped path", "cors origin", "too large"]
)
def test_requests_the_direct_path_leaves_to_asgi_are_answered_as_before(served, direct_answers, case):
    body = {"rollouts": [{"input": case}]}
    encoded = json.dumps(body).encode()
    headers: dict[str, str] = {}
    target = "/v1/rollouts/enqueue"
    if case == "connection close":
        headers["Connection"] = "close"
    elif case == "expect continue":
        headers["Expect"] = "100-continue"
    elif case == "chunked":
        headers["Transfer-Encoding"] = "chunked"
    elif case == "escaped path":
        target = "/v1/rollouts/%65nqueue"
    elif case == "cors origin":
        headers["Origin"] = "http://ui.test"
    sock, reader = _connect(served)
    with sock:
        if case == "chunked":
            head = _request("POST", target, None, {**headers, "Content-Type": "application/json"})
            sock.sendall(head + b"%x\r\n" % len(encoded) + encoded + b"\r\n0\r\n\r\n")
        elif case == "expect continue":
            request = _request("POST", target, body, headers)
            head, _, rest = request.partition(b"\r\n\r\n")
            sock.sendall(head + b"\r\n\r\n")
            assert reader.response()[0] == 100
            sock.sendall(rest)
        elif case == "too large":
            served.app.direct.max_body = 10  # larger bodies than this go through ASGI
            sock.sendall(_request("POST", target, body, headers))
        else:
            sock.sendall(_request("POST", target, body, headers))
        status, answer_headers, answer = reader.response()
        assert status == 200, answer
        assert json.loads(answer)["rollouts"][0]["input"] == case
        if case == "cors origin":
            assert answer_headers["access-control-allow-origin"] == "http://ui.test"
        if case == "connection close":
            assert reader.closed()
    assert direct_answers == []


def test_a_bug_in_a_direct_answer_is_a_json_500_and_the_connection_goes_on(served, monkeypatch):
    def broken(accepted, body):
        raise RuntimeError("a bug in the direct path")

    monkeypatch.setattr(served.app.direct, "answer", broken)
    sock, reader = _connect(served)
    with sock:
        sock.sendall(_request("GET", "/v1/workers"))
        status, _, body = reader.response()
        assert status == 500 and "a bug in the direct path" in json.loads(body)["message"]
        sock.sendall(_request("GET", "/health"))
        assert reader.response()[0] == 200
