"""A local STAND-IN for a hosted LLM: an OpenAI-compatible chat server with scripted replies.

APO's critic and editor are normally hosted models (OpenAI, Anthropic-compatible gateways,
vLLM…). Tests cannot reach them, so this FastAPI app on 127.0.0.1 answers
``POST /v1/chat/completions`` by calling a Python function chosen by the request's ``model``
field. It speaks the real wire format, so APO's HTTP client, retries and parsing are exercised
exactly as against a hosted endpoint. Nothing here is a model: the "intelligence" is the script.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from agentgrad.http.serve import http_url, listening_socket, serve_in_thread

#: A script: the request's messages → the reply text, or an int to answer with that HTTP status.
Script = Callable[[list[dict[str, Any]]], "str | int"]


@dataclass
class StandInChatServer:
    """Serves ``scripts[model](messages)`` as chat completions; records every request."""

    scripts: dict[str, Script]
    requests: list[dict[str, Any]] = field(default_factory=list)
    base_url: str = ""

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def calls(self, model: str) -> int:
        with self._lock:
            return sum(r["model"] == model for r in self.requests)

    def _app(self) -> Any:
        app = FastAPI(title="stand-in for a hosted LLM (tests only)")

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> JSONResponse:
            body = await request.json()
            with self._lock:
                self.requests.append(body)
            script = self.scripts.get(body.get("model"))
            if script is None:
                return JSONResponse({"error": {"message": f"unknown model {body.get('model')!r}"}}, status_code=404)
            reply = script(body["messages"])
            if isinstance(reply, int):
                return JSONResponse({"error": {"message": "scripted failure"}}, status_code=reply)
            return JSONResponse(
                {
                    "id": f"chatcmpl-{len(self.requests)}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": body["model"],
                    "choices": [
                        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": reply}}
                    ],
                }
            )

        return app

    def start(self) -> str:
        sock = listening_socket("127.0.0.1", 0)
        self._server = uvicorn.Server(uvicorn.Config(self._app(), log_level="warning"))
        self._thread = serve_in_thread(self._server, sock, name="stand-in-llm", timeout=10)
        self.base_url = http_url("127.0.0.1", sock.getsockname()[1]) + "/v1"
        return self.base_url

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            assert self._thread is not None
            self._thread.join(10)

    def __enter__(self) -> StandInChatServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
