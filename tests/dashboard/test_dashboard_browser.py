"""The dashboard in headless Chromium, over a store filled by a real run.

The run: ``Trainer.dev`` with its real in-process ``Runner`` runs a ``@rollout`` agent that uses
agent scopes, operations, messages and multi-dimensional rewards, and makes real LLM calls on
AgentGrad's inference ``Engine`` serving a randomly initialised tiny model
(``random_tiny_model``): token ids and logprobs are what the engine sampled. There is no capture
proxy in the tree yet, so the agent writes each LLM-call span through the store exactly as the
proxy would (prompt/completion token ids, logprobs, request and response JSON, model version).
One task fails its first attempt and succeeds on the retry; one never calls the LLM (the
dashboard must flag it). Training metrics go in with ``store.add_metrics``, a second resources
version with ``store.add_resources``, and runner records come from the real runner plus one
busy runner registered with ``store.update_worker`` just before the runners page is checked.

Screenshots land in ``test-artifacts/dashboard/`` (gitignored). Needs Chromium at
``/usr/bin/chromium`` and the ``playwright`` package (``scripts/setup_browser.sh``).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("AGENTGRAD_CHROMIUM", "/usr/bin/chromium")
if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
    pytest.skip(f"Chromium not found at {CHROMIUM}: run scripts/setup_browser.sh", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed: run scripts/setup_browser.sh")
pytest.importorskip("transformers", reason="the real run needs the [train] extra (torch, transformers)")
pytest.importorskip("uvicorn")

from agentgrad import agent, emit_message, emit_reward, operation, semconv  # noqa: E402
from agentgrad.agents import rollout  # noqa: E402
from agentgrad.context import require_context  # noqa: E402
from agentgrad.dashboard import create_app  # noqa: E402
from agentgrad.demo.calc import CALCULATOR_TOOL, SYSTEM_PROMPT  # noqa: E402
from agentgrad.store import open_store  # noqa: E402
from agentgrad.store.protocol import Store  # noqa: E402
from agentgrad.trainer import Trainer  # noqa: E402
from agentgrad.types import LLM, MetricRecord, PromptTemplate, Resources, Rollout, RolloutConfig, Span, Worker  # noqa: E402

TOKEN = "dashboard-test-token"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "dashboard"
DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
XSS_QUESTION = 'What is 2 + 3? <img src=x onerror="window.__xss = 1"><script>window.__xss = 1</script>'
TASKS = [
    {"question": "What is 12 + 7?", "answer": 19},
    {"question": XSS_QUESTION, "answer": 5},
    {"question": "Compute 6 * 7.", "answer": 42, "flaky": True},
    {"question": "What is 9 - 4?", "answer": 5, "skip_llm": True},
    {"question": "Use the tool: what is 8 * 8?", "answer": 64, "two_calls": True},
]


def chat(engine: Any, llm: LLM, messages: list[dict[str, Any]]) -> str:
    """One real LLM call on the engine, recorded as the capture proxy records it."""
    from agentgrad.inference.engine import SamplingParams

    context = require_context("chat")
    tokenizer = engine.tokenizer
    text = tokenizer.apply_chat_template(messages, tools=[CALCULATOR_TOOL], add_generation_prompt=True, tokenize=False)
    prompt_ids = tokenizer.encode(text, add_special_tokens=False)
    started = time.time()
    result = engine.generate(
        prompt_ids, SamplingParams(max_tokens=20, temperature=1.0, seed=len(prompt_ids), logprobs=0)
    )
    request = {"model": llm.model, "messages": messages, "tools": [CALCULATOR_TOOL], "logprobs": True}
    response = {
        "object": "chat.completion",
        "model": llm.model,
        "choices": [
            {
                "index": 0,
                "finish_reason": result.finish_reason,
                "message": {"role": "assistant", "content": result.text},
                "logprobs": {
                    "content": [
                        {"token": tokenizer.decode([t]), "logprob": lp}
                        for t, lp in zip(result.token_ids, result.logprobs, strict=True)
                    ]
                },
            }
        ],
        "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(result.token_ids)},
    }
    context.store.add_span(
        Span(
            rollout_id=context.rollout_id,
            attempt_id=context.attempt_id,
            parent_id=context.parent_span_id,
            name=semconv.SPAN_LLM_CALL,
            start_time=started,
            end_time=time.time(),
            attributes={
                semconv.LLM_PROMPT_TOKEN_IDS: result.prompt_token_ids,
                semconv.LLM_COMPLETION_TOKEN_IDS: result.token_ids,
                semconv.LLM_LOGPROBS: result.logprobs,
                semconv.LLM_REQUEST: json.dumps(request),
                semconv.LLM_RESPONSE: json.dumps(response),
                semconv.MODEL_VERSION: result.model_version,
                semconv.GEN_AI_SYSTEM: "agentgrad",
                semconv.GEN_AI_REQUEST_MODEL: llm.model,
                semconv.GEN_AI_RESPONSE_MODEL: llm.model,
                semconv.AGENT_NAME: context.agent_name or "",
            },
        )
    )
    return result.text


def make_agent(engine: Any) -> Any:
    @rollout
    def calc_agent(task: dict[str, Any], resources: Resources, rollout: Rollout) -> None:
        if task.get("skip_llm"):
            emit_message("answered from a cache, no LLM call")
            emit_reward(0.0)
            return
        if task.get("flaky") and rollout.num_attempts == 1:
            raise RuntimeError("the calculator tool was unreachable")
        llm = resources.get("llm")
        prompt = resources.get("prompt")
        with agent("solver"):
            with operation("ask", question=task["question"]) as op:
                messages = [
                    {"role": "system", "content": prompt.format()},
                    {"role": "user", "content": task["question"]},
                ]
                reply = chat(engine, llm, messages)
                if task.get("two_calls"):  # the tool's answer goes back for a second call
                    emit_reward(0.1)
                    messages += [
                        {"role": "assistant", "content": reply},
                        {"role": "tool", "content": "Error: the calculator needs an expression"},
                    ]
                    reply = chat(engine, llm, messages)
                op.set_output(reply)
            with operation("check"):
                correct = str(task["answer"]) in reply
            emit_message(f"model replied {reply!r}")
        emit_reward({"correct": float(correct), "brevity": 1.0 / (1 + len(reply))}, primary="correct")

    return calc_agent


@dataclass
class Run:
    store: Store
    url: str
    rollout_ids: dict[str, str]  # "llm", "flaky", "skip" → rollout id


def _serve(store: Store, token: str, tokenizers: dict[str, Path] | None = None) -> Iterator[str]:
    import uvicorn

    from agentgrad.http.serve import listening_socket, serve_in_thread

    sock = listening_socket("127.0.0.1", 0)
    app = create_app(store, token=token, tokenizers=tokenizers)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = serve_in_thread(server, sock, name="dashboard", timeout=20)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    from agentgrad.demo.tiny import random_tiny_model
    from agentgrad.inference.engine import Engine

    root = tmp_path_factory.mktemp("dashboard-run")
    engine = Engine(random_tiny_model(root / "model"), version="tiny-v1")
    store = open_store(f"sqlite:///{root / 'store.db'}")
    try:
        resources = {
            "llm": LLM(endpoint="http://127.0.0.1:1/v1", model="tiny-calc", api_key="sk-do-not-show"),
            "prompt": PromptTemplate(template=SYSTEM_PROMPT),
        }
        Trainer(store).dev(
            make_agent(engine), TASKS, resources, config=RolloutConfig(max_attempts=2), timeout=240, print_summary=False
        )
        store.add_resources({**resources, "prompt": PromptTemplate(template=SYSTEM_PROMPT + " Answer briefly.")})
        store.add_metrics(
            [
                MetricRecord(
                    run_id="grpo-demo",
                    step=step,
                    values={
                        "reward/mean": 0.3 + 0.4 * (1 - 0.85**step),
                        "success_rate": 0.2 + 0.5 * (1 - 0.9**step),
                        "loss": 1.5 * 0.9**step,
                        "kl": 0.002 * step,
                        "throughput/tokens_per_s": 800 + 10 * (step % 5),
                    },
                )
                for step in range(30)
            ]
        )
        store.add_metrics(
            [
                MetricRecord(
                    run_id="grpo-demo-b",
                    step=step,
                    values={
                        "reward/mean": 0.3 + 0.25 * (1 - 0.8**step),
                        "success_rate": 0.2 + 0.3 * (1 - 0.9**step),
                        "loss": 1.4 * 0.92**step,
                        "kl": 0.003 * step,
                        "throughput/tokens_per_s": 760 + 8 * (step % 4),
                    },
                )
                for step in range(24)
            ]
        )
        by_question = {r.input["question"]: r.rollout_id for r in store.query_rollouts()}
        ids = {
            "llm": by_question[TASKS[0]["question"]],
            "xss": by_question[XSS_QUESTION],
            "flaky": by_question[TASKS[2]["question"]],
            "skip": by_question[TASKS[3]["question"]],
            "two": by_question[TASKS[4]["question"]],
        }
        for server_url in _serve(store, TOKEN, {"tiny-calc": root / "model"}):
            yield Run(store, server_url, ids)
    finally:
        engine.close()
        store.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser: Any, run: Run) -> Iterator[Any]:
    """A logged-in page (through the ``?token=`` login); fails the test on any JS dialog or error."""
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    page = context.new_page()
    problems: list[str] = []
    page.on("dialog", lambda dialog: (problems.append(f"dialog: {dialog.message}"), dialog.dismiss()))
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    page.goto(f"{run.url}/dashboard/rollouts?token={TOKEN}")
    yield page
    assert page.evaluate("window.__xss") is None, "a span's content ran as script"
    assert not problems, problems
    context.close()


def shot(page: Any, name: str, docs: str | None = None) -> None:
    """A full-page screenshot in the artifacts; with ``docs`` and ``AGENTGRAD_DOCS_IMG=1``, also the
    docs' picture ``docs/img/dashboard-<docs>.png`` (the visible part: a picture for a page of
    prose). Only when asked: a test run leaves the checkout as it found it."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
    if docs is not None and os.environ.get("AGENTGRAD_DOCS_IMG") == "1":
        page.screenshot(path=str(DOCS_IMG / f"dashboard-{docs}.png"))


def test_the_run_filled_the_store(run: Run) -> None:
    rollouts = {r.rollout_id: r for r in run.store.query_rollouts()}
    assert len(rollouts) == 5 and all(r.status.value == "succeeded" for r in rollouts.values())
    assert rollouts[run.rollout_ids["two"]].llm_calls == 2
    assert rollouts[run.rollout_ids["llm"]].llm_calls == 1
    assert rollouts[run.rollout_ids["flaky"]].num_attempts == 2
    assert rollouts[run.rollout_ids["skip"]].llm_calls == 0


def test_token_is_enforced(browser: Any, run: Run) -> None:
    context = browser.new_context()
    page = context.new_page()
    response = page.goto(f"{run.url}/dashboard/rollouts")
    assert response.status == 401
    assert page.locator("h1").inner_text() == "Token required"
    assert page.locator("table").count() == 0
    shot(page, "00-token-required")
    page.fill("#token", "wrong")
    page.click("button[type=submit]")
    assert page.locator(".notice.error").inner_text() == "That token is not right."
    page.fill("#token", TOKEN)
    page.click("button[type=submit]")
    page.wait_for_selector("table.rollouts")
    assert "token=" not in page.url  # the login redirect dropped it
    cookie = next(c for c in context.cookies() if c["name"] == "agentgrad_dashboard")
    assert cookie["httpOnly"] and TOKEN not in cookie["value"]
    assert page.evaluate("document.cookie") == ""  # invisible to scripts
    context.close()


def test_rollouts_table_filters_and_click_through(page: Any, run: Run) -> None:
    rows = page.locator("table.rollouts tbody tr")
    assert rows.count() == 5
    flagged = page.locator("tr.no-llm")
    assert flagged.count() == 1 and run.rollout_ids["skip"] in flagged.inner_text()
    assert "⚠ none captured" in flagged.inner_text()
    shot(page, "01-rollouts")

    page.check("input[name=no_llm]")
    page.click("form.filters button[type=submit]")
    assert rows.count() == 1 and run.rollout_ids["skip"] in rows.first.inner_text()
    page.click("a.button.secondary")  # reset
    page.click("th a:has-text('Reward')")  # sort by reward, highest first
    assert "sort=reward" in page.url and rows.count() == 5
    rewards = [cell.inner_text() for cell in page.locator("table.rollouts tbody td:nth-child(9)").all()]
    numbers = [float(r) for r in rewards]
    assert numbers == sorted(numbers, reverse=True)

    page.click(f"a:has-text('{run.rollout_ids['llm']}')")
    page.wait_for_selector("#llm-call-1")
    assert page.url.endswith(f"/dashboard/rollouts/{run.rollout_ids['llm']}")
    assert page.locator("table.spans tbody tr").count() >= 6  # agent, 2 operations, llm call, message, reward
    assert page.locator("tr.kind-llm td.depth-2").count() == 1  # agent > operation > LLM call
    call = page.locator("#llm-call-1")
    assert "tiny-calc" in call.inner_text() and "version tiny-v1" in call.inner_text()
    assert "completion tokens" in call.inner_text() and "agent solver" in call.inner_text()
    assert call.locator(".tokens .tok").count() > 0
    assert "calculator" in call.locator(".tools").inner_text()
    assert page.locator("table.rewards tbody tr").count() == 1
    assert "correct = " in page.locator("table.rewards").inner_text()
    page.click("tr.kind-llm a")  # the span links to its LLM call card
    assert page.url.endswith("#llm-call-1")
    shot(page, "02-rollout")


def test_span_contents_are_shown_as_text(page: Any, run: Run) -> None:
    page.goto(f"{run.url}/dashboard/rollouts/{run.rollout_ids['xss']}")
    assert "<script>window.__xss = 1</script>" in page.locator("pre.json").first.inner_text()
    assert "<img src=x" in page.locator("#llm-call-1 .message.role-user").inner_text()
    assert page.locator("img").count() == 0


def test_retried_rollout_shows_both_attempts(page: Any, run: Run) -> None:
    page.goto(f"{run.url}/dashboard/rollouts/{run.rollout_ids['flaky']}")
    attempts = page.locator("table.attempts tbody tr")
    assert attempts.count() == 2
    assert "failed" in attempts.nth(0).inner_text() and "succeeded" in attempts.nth(1).inner_text()
    assert "the calculator tool was unreachable" in attempts.nth(0).inner_text()
    page.click("table.attempts a:has-text('#1')")
    assert "of attempt #1" in page.locator("h2:has-text('Spans')").inner_text()
    shot(page, "03-retried-rollout")


def test_rollout_without_llm_calls_is_flagged(page: Any, run: Run) -> None:
    page.goto(f"{run.url}/dashboard/rollouts/{run.rollout_ids['skip']}")
    assert "no LLM call captured" in page.locator("h1").inner_text()
    assert "No LLM call captured in this attempt." in page.content()


def test_compare_two_runs(page: Any) -> None:
    page.click("nav a:has-text('Runs')")
    runs = page.locator("table.runs tbody tr")
    assert runs.count() == 2
    page.check("input[name=run][value=grpo-demo]")
    page.check("input[name=run][value=grpo-demo-b]")
    page.click(".compare-bar button[type=submit]")
    charts = page.locator("figure.chart")
    names = [c.get_attribute("data-metric") for c in charts.all()]
    assert names == ["reward/mean", "success_rate", "loss", "kl", "throughput/tokens_per_s"]
    reward = page.locator("figure.chart[data-metric='reward/mean']")
    assert reward.locator("polyline.curve").count() == 2
    assert reward.locator("text.x-tick").first.text_content() == "0"
    assert "grpo-demo-b" in reward.locator(".legend-runs").inner_text()
    box = reward.locator("svg.plot").bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + box["height"] * 0.5)
    readout = reward.locator(".hover-readout").inner_text()
    assert readout.startswith("step ") and "grpo-demo " in readout and "grpo-demo-b " in readout
    assert reward.locator("circle.pt.on").count() == 2  # one point per run at that step
    shot(page, "04-runs")


def test_resources_diff(page: Any) -> None:
    page.click("nav a:has-text('Resources')")
    assert "v1 → v2" in page.locator("h2").first.inner_text()
    assert "Answer briefly." in page.locator(".diff.state-changed .add").inner_text()
    assert "sk-do-not-show" not in page.content()
    page.select_option("select[name=a]", index=0)  # v2 against itself: nothing changed
    page.click("form.filters button[type=submit]")
    assert page.locator(".diff.state-changed").count() == 0
    page.go_back()
    shot(page, "05-resources")


def test_runners(page: Any, run: Run) -> None:
    run.store.update_worker(
        Worker(
            worker_id="gpu-runner-1",
            status="busy",
            current_rollout_id=run.rollout_ids["llm"],
            metadata={"pid": 1234, "concurrency": 4},
        )
    )
    page.click("nav a:has-text('Runners')")
    rows = page.locator("table.runners tbody tr")
    assert rows.count() == 2  # the real runner (stopped after dev) and the busy one
    busy = page.locator("tr.runner-alive")
    assert "gpu-runner-1" in busy.inner_text() and run.rollout_ids["llm"] in busy.inner_text()
    assert page.locator("tr.runner-stopped").count() == 1
    busy.locator("a").click()
    page.wait_for_selector("#llm-call-1")
    page.go_back()
    shot(page, "06-runners")


def test_live_refresh_picks_up_new_rollouts(page: Any, run: Run) -> None:
    page.check("#live-refresh")
    new = run.store.enqueue_rollout({"question": "added while watching"})
    page.wait_for_selector(f"a:has-text('{new.rollout_id}')", timeout=10_000)
    assert page.evaluate("document.getElementById('rollout-table').dataset.refreshedAt") is not None
    page.uncheck("#live-refresh")
    run.store.cancel_rollout(new.rollout_id)


def test_tokens_are_text_and_replay_steps_call_by_call(page: Any, run: Run) -> None:
    page.goto(f"{run.url}/dashboard/rollouts/{run.rollout_ids['two']}")
    tokens = page.locator("#llm-call-1 .tokens .tok")
    assert tokens.count() > 0
    text = "".join(t.inner_text() for t in tokens.all())
    assert "⟨" not in text  # decoded by the model's own tokenizer
    assert tokens.first.get_attribute("title").startswith("id ")
    assert page.locator("table.credit-table tbody tr").count() == 2
    page.click("a.replay-link")
    assert "Call 1 of 2" in page.locator(".replay-position").inner_text()
    assert "0.1" in page.locator(".replay-step").inner_text()  # the reward emitted after call 1
    page.keyboard.press("ArrowRight")
    page.wait_for_url("**call=2")
    position = page.locator(".replay-position").inner_text()
    assert "Call 2 of 2" in position
    context = page.locator(".replay-step .conversation > div").first.inner_text()
    assert "the calculator needs an expression" in context and "earlier message(s) folded" in context.lower()
    page.select_option("select[name=credit]", "discounted")
    page.click("form.credit-rule button[type=submit]")
    assert "call=2" in page.url and "discounted" in page.locator(".replay-step .credit").inner_text()
    shot(page, "07-replay", docs="replay")
    page.keyboard.press("ArrowLeft")
    page.wait_for_url("**call=1")


@pytest.fixture(scope="module")
def runs_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:
    """A second dashboard over the GRPO/SFT/APO store of ``runs_data`` (groups and prompts)."""
    from runs_data import TOKENIZER, fill_runs

    store = open_store(f"sqlite:///{tmp_path_factory.mktemp('runs') / 'store.db'}")
    try:
        runs = fill_runs(store)
        for server_url in _serve(store, TOKEN, {"tiny-calc": TOKENIZER}):
            yield server_url, runs
    finally:
        store.close()


def test_group_view_and_prompt_ab(page: Any, runs_url: tuple[str, Any]) -> None:
    url, runs = runs_url
    page.goto(f"{url}/dashboard/rollouts?token={TOKEN}")
    page.select_option("select[name=run]", "grpo-a")
    page.click("form.filters button[type=submit]")
    assert "run=grpo-a" in page.url and page.locator("table.rollouts tbody tr").count() == 8
    page.set_viewport_size({"width": 1600, "height": 700})
    shot(page, "01-rollouts-of-a-run", docs="rollouts")
    page.set_viewport_size({"width": 1280, "height": 860})
    page.click("table.rollouts a:has-text('grpo-a-s1-t0-r0') >> nth=0")
    members = page.locator("article.group-member")
    assert members.count() == 2
    assert sorted(m.locator(".advantage").inner_text() for m in members.all()) == ["+1.000", "-1.000"]
    shot(page, "08-group", docs="group")
    page.goto(f"{url}/dashboard/runs?run=grpo-a&run=grpo-b")
    assert "GRPO" in page.locator("table.runs").inner_text() and "tiny-calc" in page.locator("table.runs").inner_text()
    chart = page.locator("figure.chart[data-metric='val/reward_mean'] svg.plot")
    box = chart.bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.7, box["y"] + box["height"] * 0.4)
    assert "grpo-a" in page.locator("figure.chart[data-metric='val/reward_mean'] .hover-readout").inner_text()
    shot(page, "11-runs-compared", docs="runs")
    page.goto(f"{url}/dashboard/prompts")
    assert page.locator("table.candidates").count() == 2  # rounds 0 and 1
    assert "+Use the calculator." in page.locator(".prompt-ab .diff-lines").inner_text()
    assert "+0.500" in page.locator(".prompt-ab h2").inner_text()
    shot(page, "09-prompts", docs="prompts")
    page.goto(f"{url}/dashboard/rollouts/{runs.two_calls}?credit=air")
    assert page.locator("table.credit-table tbody tr").count() == 2
    levels = {t.get_attribute("class") for t in page.locator("#llm-call-1 .tokens .tok").all()}
    assert len(levels) >= 4  # p = 0.99999, 0.995, 0.74, 0.08 in four colours
    page.locator("section.credit-section").scroll_into_view_if_needed()
    page.evaluate("document.querySelector('section.credit-section').scrollIntoView()")
    shot(page, "10-rollout-credit-tokens", docs="rollout")
    page.goto(f"{url}/dashboard/rollouts/{runs.framework}")
    page.click("tr.kind-framework >> nth=1 >> summary")
    assert "What is the capital of France?" in page.locator("tr.kind-framework >> nth=1").inner_text()
