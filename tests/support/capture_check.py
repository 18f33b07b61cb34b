"""Shared by the framework suites (main venv and the openai-2.x compat venv).

* :func:`serve_upstream` starts the real engine with the tiny calculator model (or, only while
  the engine package is not there yet, the scripted stand-in) and a proxy in front of it;
* :func:`run_and_check` runs an agent through :class:`Trainer` with the proxy, exactly as
  training would, and checks capture fidelity: every call the framework made is stored, with
  token ids that decode to exactly what the framework received (text and tool calls).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgrad import semconv
from agentgrad.demo.calc import run_calculator
from agentgrad.inference.toolcalls import parse_tool_calls
from agentgrad.proxy import LLMProxy
from agentgrad.store import open_store
from agentgrad.store.protocol import Store
from agentgrad.trainer import Trainer
from agentgrad.types import LLM

#: Set by the main suite for the compat venv's run: reuse its engine (no torch in that venv).
ENGINE_URL_ENV = "AGENTGRAD_TEST_ENGINE_URL"
MODEL_DIR_ENV = "AGENTGRAD_TEST_MODEL_DIR"
#: Frameworks add long system prompts; the tiny model has a 1024-token context.
MAX_TOKENS = 48
QUESTIONS = ["What is 12 + 7?", "Calculate 6 * 7."]


@dataclass
class Capture:
    """A proxy in front of an engine, recording into ``store``."""

    store: Store
    proxy: LLMProxy
    engine_url: str
    decode: Callable[[list[int]], str]
    #: The tiny model's directory; None while the scripted stand-in replaces the engine.
    model_dir: str | None


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / and parentheses, e.g. 37 * 12 + 5."""
    try:
        return run_calculator(expression)
    except Exception as exc:  # the tiny model writes odd expressions; tell it, as a real tool would
        return f"error: {exc}"


def _decoder(model_dir: str) -> Callable[[list[int]], str]:
    from tokenizers import Tokenizer  # light: the compat venv has it without transformers

    tokenizer = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=True)


@contextlib.contextmanager
def _engine() -> Iterator[tuple[str, Callable[[list[int]], str], str | None]]:
    """(engine URL, detokenizer, model dir); the compat venv reuses the main suite's engine."""
    if os.environ.get(ENGINE_URL_ENV):
        yield os.environ[ENGINE_URL_ENV], _decoder(os.environ[MODEL_DIR_ENV]), os.environ[MODEL_DIR_ENV]
        return
    if os.environ.get("AGENTGRAD_TEST_STUB_ENGINE"):  # fast local iteration only: not the engine
        from agentgrad.testing.stub import StubUpstream, decode, tool_reply

        with StubUpstream([tool_reply("calculator", {"expression": "12 + 7"}), "The answer is 19."]) as stub:
            yield f"http://127.0.0.1:{stub.port}/v1", decode, None
        return
    from agentgrad.demo.tiny import ensure_tiny_model

    model_dir = str(ensure_tiny_model())
    with _model_server(model_dir) as url:
        yield url, _decoder(model_dir), model_dir


@contextlib.contextmanager
def _model_server(model_dir: str) -> Iterator[str]:
    from agentgrad.inference import ModelServer

    server = ModelServer(model_dir)
    try:
        yield server.start()
    finally:
        server.stop()


@contextlib.contextmanager
def serve_upstream() -> Iterator[Capture]:
    with _engine() as (url, decode, model_dir), open_store("memory", watchdog=False) as store:
        with LLMProxy(store, url) as proxy:
            yield Capture(store, proxy, url, decode, model_dir)


def received(api: str, response: dict[str, Any]) -> tuple[str | None, list[tuple[str, Any]]]:
    """(text, [(tool name, arguments)]) of a stored response: what the framework was given."""
    if api == "responses":
        text = (
            "".join(
                part.get("text", "")
                for item in response["output"]
                if item["type"] == "message"
                for part in item["content"]
            )
            or None
        )
        calls = [
            (item["name"], json.loads(item["arguments"]))
            for item in response["output"]
            if item["type"] == "function_call"
        ]
        return text, calls
    message = response["choices"][0]["message"]
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls") or []]
    return message.get("content") or None, calls


def check_faithful(span: Any, decode: Callable[[list[int]], str]) -> None:
    """The completion token ids decode to exactly the text and tool calls the client received."""
    attrs = span.attributes
    assert attrs.get(semconv.LLM_PROMPT_TOKEN_IDS), f"no prompt token ids on {span.span_id}"
    completion = attrs.get(semconv.LLM_COMPLETION_TOKEN_IDS)
    assert completion, f"no completion token ids on {span.span_id}"
    assert len(attrs[semconv.LLM_LOGPROBS]) == len(completion)
    decoded = decode(completion)
    text, calls = parse_tool_calls(decoded)
    request = attrs.get(semconv.LLM_REQUEST) or {}
    request = json.loads(request) if isinstance(request, str) else request
    if not request.get("tools"):  # no tools offered: a tool call the model writes anyway stays text
        text, calls = decoded, []
    got_text, got_calls = received(attrs[semconv.LLM_API], attrs[semconv.LLM_RESPONSE])
    assert (got_text or None) == (text or None), (got_text, decode(completion))
    assert got_calls == [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def run_and_check(
    capture: Capture,
    agent: Callable[..., Any],
    *,
    tasks: list[str] | list[dict[str, Any]] = QUESTIONS[:1],
    model: str = "gpt-4o-mini",
    min_calls: int = 1,
) -> list[Any]:
    """Run ``agent`` on ``tasks`` (questions, or whole task dicts) like training does and check what
    was captured; returns the spans."""
    before = dict(capture.proxy.metrics.as_dict())
    trainer = Trainer(capture.store, proxy=capture.proxy)
    inputs = [t if isinstance(t, dict) else {"question": t} for t in tasks]
    report = trainer.dev(
        agent, inputs, {"llm": LLM(endpoint=capture.engine_url, model=model)}, timeout=180, print_summary=False
    )
    ids = [r.rollout_id for r in capture.store.query_rollouts() if r.input in inputs]
    rollouts = [capture.store.get_rollout(i) for i in ids[-len(tasks) :]]
    failures = [a.error for r in rollouts for a in capture.store.get_attempts(r.rollout_id) if a.error]
    assert all(r.status.value == "succeeded" for r in rollouts), failures or report
    spans = [s for r in rollouts for s in capture.store.query_spans(r.rollout_id, name=semconv.SPAN_LLM_CALL)]
    after = capture.proxy.metrics.as_dict()
    delta = {k: after[k] - before.get(k, 0) for k in after}
    assert delta["unattributed"] == 0 and delta["missing_token_ids"] == 0 and delta["store_errors"] == 0, delta
    assert delta["recorded"] == len(spans), (delta, len(spans))  # every call the proxy saw is stored
    assert all(r.llm_calls >= min_calls for r in rollouts), [r.llm_calls for r in rollouts]
    for span in spans:
        check_faithful(span, capture.decode)
    return spans
