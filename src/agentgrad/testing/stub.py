"""A fast, scripted OpenAI-compatible upstream stand-in (not a model).

Used to test the proxy without an engine and to measure the proxy's own overhead
(``bench/bench_proxy.py``): it answers at once with scripted replies and returns vLLM-style token
ids where one token is one character (``token id = ord(char)``), so a test can check that the
captured ids decode to exactly the text the client received.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from agentgrad.http.serve import listening_socket, serve_in_thread
from agentgrad.proxy.server import uvicorn_server

STUB_MODEL = "stub-model"


def decode(ids: Sequence[int]) -> str:
    """The stub's detokenizer."""
    return "".join(chr(i) for i in ids)


def tool_reply(name: str, arguments: dict[str, Any], call_id: str = "call_1") -> dict[str, Any]:
    """A scripted reply that calls a tool (give each call of a conversation its own ``call_id``:
    the Agents SDK refuses a reused one)."""
    return {"tool_call": {"name": name, "arguments": json.dumps(arguments)}, "id": call_id}


def _within_token_limit(body: dict[str, Any], reply: str | dict[str, Any]) -> tuple[str | dict[str, Any], str]:
    """``reply`` as a chat request's token limit lets it out, and its finish reason: a text longer than
    ``max_tokens`` (or ``max_completion_tokens``) characters — the stub's tokens — is cut, ``length``."""
    if isinstance(reply, dict):
        return reply, "tool_calls"
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    if isinstance(limit, int) and 0 < limit < len(reply):
        return reply[:limit], "length"
    return reply, "stop"


class StubUpstream:
    """Serves ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models`` from a script.

    Args:
        replies: texts or :func:`tool_reply` dicts, answered in turn (cycling).
        fail_first: answer this many first requests with HTTP 500 (to provoke SDK retries).
        chunk_chars: characters per streamed chunk.

    ``stream_gate``: when set to a :class:`threading.Event`, a stream sends its first chunk and then
    waits for the event before the rest (tests of calls still in flight).
    """

    def __init__(
        self,
        replies: Sequence[str | dict[str, Any]] = ("The answer is 5.",),
        *,
        fail_first: int = 0,
        chunk_chars: int = 4,
        model_version: str = "v0",
    ) -> None:
        self.replies = list(replies)
        self.fail_first = fail_first
        self.chunk_chars = chunk_chars
        self.model_version = model_version
        self.requests: list[dict[str, Any]] = []
        #: How many times ``/v1/models`` was read.
        self.models_read = 0
        self.stream_gate: threading.Event | None = None
        self._lock = threading.Lock()
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.port = 0
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/completions", self._completions, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
            ]
        )

    # ---- serving ---------------------------------------------------------------------------------
    def start(self) -> str:
        """Serve on a free port of 127.0.0.1; returns the OpenAI base URL."""
        sock = listening_socket("127.0.0.1", 0)
        self.port = sock.getsockname()[1]
        self._server = uvicorn_server(self.app)
        self._thread = serve_in_thread(self._server, sock, name="agentgrad-stub-upstream")
        return f"http://127.0.0.1:{self.port}/v1"

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            if self._thread is not None:
                self._thread.join(10)
            self._server = None

    def __enter__(self) -> StubUpstream:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- answers ---------------------------------------------------------------------------------
    def _next(self, body: dict[str, Any]) -> tuple[str | dict[str, Any], bool]:
        with self._lock:
            self.requests.append(body)
            index = len(self.requests) - 1
        if index < self.fail_first:
            return "", False
        return self.replies[(index - self.fail_first) % len(self.replies)], True

    @staticmethod
    def _prompt_ids(body: dict[str, Any]) -> list[int]:
        prompt = body.get("prompt", body.get("messages"))
        return [ord(c) for c in (prompt if isinstance(prompt, str) else json.dumps(prompt))]

    def _top(self, body: dict[str, Any], kind: str) -> dict[str, Any]:
        top = {
            "id": f"stub-{time.time_ns()}",
            "object": kind,
            "created": int(time.time()),
            "model": body.get("model") or STUB_MODEL,
            "model_version": self.model_version,
        }
        if body.get("return_token_ids"):
            top["prompt_token_ids"] = self._prompt_ids(body)
        return top

    @staticmethod
    def _logprobs(text: str, chat: bool) -> dict[str, Any]:
        if chat:
            return {
                "content": [{"token": c, "logprob": -0.5, "bytes": list(c.encode()), "top_logprobs": []} for c in text]
            }
        return {"tokens": list(text), "token_logprobs": [-0.5] * len(text), "top_logprobs": None, "text_offset": []}

    @staticmethod
    def _render(reply: str | dict[str, Any]) -> str:
        """The text the model 'generated' (tool calls in a Hermes-style tag, as our engine does)."""
        if isinstance(reply, str):
            return reply
        call = reply["tool_call"]
        return (
            f"<tool_call>{json.dumps({'name': call['name'], 'arguments': json.loads(call['arguments'])})}</tool_call>"
        )

    @staticmethod
    def _usage(body: dict[str, Any], text: str) -> dict[str, int]:
        prompt = len(StubUpstream._prompt_ids(body))
        return {"prompt_tokens": prompt, "completion_tokens": len(text), "total_tokens": prompt + len(text)}

    async def _chat(self, request: Request) -> Response:
        body = json.loads(await request.body())
        reply, ok = self._next(body)
        if not ok:
            return Response(
                b'{"error": {"message": "scripted failure", "type": "server_error"}}',
                status_code=500,
                media_type="application/json",
            )
        reply, finish = _within_token_limit(body, reply)
        text = self._render(reply)
        if body.get("stream"):
            return StreamingResponse(self._chat_stream(body, reply, text, finish), media_type="text/event-stream")
        message: dict[str, Any] = {"role": "assistant", "content": reply if isinstance(reply, str) else None}
        if isinstance(reply, dict):
            message["tool_calls"] = [
                {"id": reply.get("id", "call_1"), "type": "function", "function": reply["tool_call"]}
            ]
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "finish_reason": finish,
            "logprobs": self._logprobs(text, True) if body.get("logprobs") else None,
        }
        if body.get("return_token_ids"):
            choice["token_ids"] = [ord(c) for c in text]
        out = {**self._top(body, "chat.completion"), "choices": [choice], "usage": self._usage(body, text)}
        return Response(json.dumps(out), media_type="application/json")

    def _chat_stream(
        self, body: dict[str, Any], reply: str | dict[str, Any], text: str, finish: str
    ) -> Iterator[bytes]:
        top = self._top(body, "chat.completion.chunk")
        ids = body.get("return_token_ids")
        step = self.chunk_chars
        pieces = [text[i : i + step] for i in range(0, len(text), step)] or [""]
        for number, piece in enumerate(pieces):
            delta: dict[str, Any] = {"role": "assistant"} if number == 0 else {}
            if isinstance(reply, str):
                delta["content"] = piece
            elif number == 0:
                call = reply["tool_call"]
                delta["tool_calls"] = [
                    {
                        "index": 0,
                        "id": reply.get("id", "call_1"),
                        "type": "function",
                        "function": {"name": call["name"], "arguments": ""},
                    }
                ]
            choice: dict[str, Any] = {
                "index": 0,
                "delta": delta,
                "finish_reason": None,
                "logprobs": self._logprobs(piece, True) if body.get("logprobs") else None,
            }
            if ids:
                choice["token_ids"] = [ord(c) for c in piece]
            chunk = {**top, "choices": [choice]}
            if number > 0:
                chunk.pop("prompt_token_ids", None)
            if number == 1 and self.stream_gate is not None:
                self.stream_gate.wait(30)
            yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
        if isinstance(reply, dict):  # arguments in a second delta, as real engines stream them
            args = {"index": 0, "function": {"arguments": reply["tool_call"]["arguments"]}}
            yield (
                b"data: "
                + json.dumps(
                    {**top, "choices": [{"index": 0, "delta": {"tool_calls": [args]}, "finish_reason": None}]}
                ).encode()
                + b"\n\n"
            )
        yield (
            b"data: "
            + json.dumps({**top, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}).encode()
            + b"\n\n"
        )
        if (body.get("stream_options") or {}).get("include_usage"):
            yield b"data: " + json.dumps({**top, "choices": [], "usage": self._usage(body, text)}).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    async def _completions(self, request: Request) -> Response:
        body = json.loads(await request.body())
        reply, _ = self._next(body)
        text = self._render(reply)
        choice: dict[str, Any] = {
            "index": 0,
            "text": text,
            "finish_reason": "stop",
            "logprobs": self._logprobs(text, False) if body.get("logprobs") is not None else None,
        }
        if body.get("return_token_ids"):
            choice["token_ids"] = [ord(c) for c in text]
        out = {**self._top(body, "text_completion"), "choices": [choice], "usage": self._usage(body, text)}
        return Response(json.dumps(out), media_type="application/json")

    async def _models(self, request: Request) -> Response:
        self.models_read += 1
        return Response(
            json.dumps({"object": "list", "data": [{"id": STUB_MODEL, "object": "model"}]}),
            media_type="application/json",
        )
