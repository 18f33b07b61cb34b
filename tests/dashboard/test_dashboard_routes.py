"""Every dashboard route through FastAPI's TestClient, over the hand-filled store (see conftest)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("jinja2")

from dashboard_data import Filled  # noqa: E402
from fastapi import FastAPI  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from agentgrad.dashboard import create_app, create_router  # noqa: E402
from agentgrad.dashboard.auth import COOKIE_NAME  # noqa: E402

ESCAPED = "&lt;script&gt;alert("


@pytest.fixture
def client(filled: Filled) -> TestClient:
    return TestClient(create_app(filled.store))


def assert_escaped(html: str) -> None:
    assert "<script>alert" not in html and "<img src=x" not in html
    assert ESCAPED in html


def test_root_redirects_to_rollouts(client: TestClient) -> None:
    response = client.get("/", follow_redirects=False)
    assert response.status_code in (302, 307) and response.headers["location"].endswith("/dashboard/rollouts")
    assert client.get("/dashboard/").url.path == "/dashboard/rollouts"


def test_rollouts_table_shows_every_rollout_with_its_columns(client: TestClient, filled: Filled) -> None:
    response = client.get("/dashboard/rollouts")
    assert response.status_code == 200
    html = response.text
    for rollout_id in (filled.good, filled.retried, filled.empty, filled.queued):
        assert f'href="/dashboard/rollouts/{rollout_id}"' in html
    assert "Rollouts 1–4 of 4" in html
    assert html.count("⚠ none captured") == 2  # ro-empty and ro-retried finished without LLM calls
    assert response.headers["content-security-policy"].startswith("default-src 'none'")
    assert response.headers["referrer-policy"] == "no-referrer"


@pytest.mark.parametrize(
    ("query", "expected", "absent"),
    [
        ("status=queuing", ["ro-queued"], ["ro-good", "ro-empty"]),
        ("status=succeeded&mode=val", ["ro-empty"], ["ro-good", "ro-queued"]),
        ("no_llm=1", ["ro-empty", "ro-retried"], ["ro-good", "ro-queued"]),
        ("status=bogus", ["ro-good", "ro-queued"], []),  # unknown values are ignored, not errors
    ],
)
def test_rollouts_filters(client: TestClient, query: str, expected: list[str], absent: list[str]) -> None:
    html = client.get(f"/dashboard/rollouts?{query}").text
    for rollout_id in expected:
        assert f'/dashboard/rollouts/{rollout_id}"' in html
    for rollout_id in absent:
        assert f'/dashboard/rollouts/{rollout_id}"' not in html


def test_rollouts_sort_and_paging(client: TestClient) -> None:
    html = client.get("/dashboard/rollouts?sort=reward&order=desc&per_page=25").text
    order = [html.index(f'/dashboard/rollouts/{r}"') for r in ("ro-good", "ro-retried", "ro-empty")]
    assert order == sorted(order)  # rewards 1.0, 0.5, 0.0
    # Two per page is not an offered size; 25 is used, so one page and no pager.
    assert 'rel="next"' not in html
    ascending = client.get("/dashboard/rollouts?sort=rollout_id&order=asc").text
    ids = ["ro-empty", "ro-good", "ro-queued", "ro-retried"]
    assert [ascending.index(f'/dashboard/rollouts/{r}"') for r in ids] == sorted(
        ascending.index(f'/dashboard/rollouts/{r}"') for r in ids
    )


def test_rollouts_pager(filled: Filled) -> None:
    for number in range(30):
        filled.store.enqueue_rollout({"n": number})
    client = TestClient(create_app(filled.store))
    first = client.get("/dashboard/rollouts?per_page=25").text
    assert "Page 1 of 2" in first and 'rel="next"' in first
    second = client.get("/dashboard/rollouts?per_page=25&page=2").text
    assert "Rollouts 26–34 of 34" in second and 'rel="prev"' in second


def test_rollouts_partial_is_only_the_table(client: TestClient) -> None:
    html = client.get("/dashboard/rollouts?partial=table").text
    assert html.lstrip().startswith('<p class="count">') and "<html" not in html
    assert "/dashboard/rollouts/ro-good" in html


def test_rollout_page_shows_spans_llm_call_tokens_and_rewards(client: TestClient, filled: Filled) -> None:
    response = client.get(f"/dashboard/rollouts/{filled.good}")
    assert response.status_code == 200
    html = response.text
    assert_escaped(html)
    # span tree, nested by parent_id: agent > operation > llm call
    assert html.index("agentgrad.agent") < html.index("agentgrad.operation") < html.index("agentgrad.llm.call")
    assert 'class="depth-2"' in html  # the LLM call sits two levels down
    # the LLM call: messages, tools, response with tool call, token counts and colored tokens
    assert 'id="llm-call-1"' in html and 'href="#llm-call-1"' in html
    assert "You are a calculator." in html and "Tools offered" in html and "calculate" in html
    assert "{&#34;expression&#34;: &#34;2+3&#34;}" in html
    assert "4 prompt tokens" in html and "3 completion tokens" in html
    assert 'class="tok p9"' in html and 'class="tok p0"' in html  # p≈0.99 and p≈0.02
    assert "&lt;b&gt;Let" in html  # token text is escaped too
    assert "version v7" in html and "agent solver" in html
    # rewards with dimensions
    assert "correct = 1" in html and "short = 0.25" in html


def test_rollout_page_attempts_and_attempt_selection(client: TestClient, filled: Filled) -> None:
    html = client.get(f"/dashboard/rollouts/{filled.retried}").text
    assert "#1" in html and "#2" in html and "ValueError: boom" in html
    assert "of attempt #2" in html and "agentgrad.exception" not in html
    attempts = filled.store.get_attempts(filled.retried)
    first = client.get(f"/dashboard/rollouts/{filled.retried}?attempt={attempts[0].attempt_id}").text
    assert "of attempt #1" in first and "agentgrad.exception" in first
    missing = client.get(f"/dashboard/rollouts/{filled.retried}?attempt=nope")
    assert missing.status_code == 404


def test_rollout_page_flags_missing_llm_calls(client: TestClient, filled: Filled) -> None:
    html = client.get(f"/dashboard/rollouts/{filled.empty}").text
    assert "no LLM call captured" in html and "gives no training data" in html
    queued = client.get(f"/dashboard/rollouts/{filled.queued}").text
    assert "No attempt yet" in queued


def test_a_malformed_llm_call_span_is_shown_and_flagged() -> None:
    """Token ids with a bool or a float, logprobs that are text, a request that is not JSON: the
    page still shows the call, flagged as not trainable (the trainer's own rule) and saying why."""
    from agentgrad import semconv
    from agentgrad.store.memory import MemoryStore
    from agentgrad.types import Span

    store = MemoryStore(watchdog_interval=None)
    store.enqueue_rollout({"q": "malformed"}, rollout_id="ro-bad")
    (claimed,) = store.dequeue_rollouts(1, worker_id="worker-b")
    store.add_span(
        Span(
            rollout_id="ro-bad",
            attempt_id=claimed.attempt.attempt_id,
            span_id="bad1",
            name=semconv.SPAN_LLM_CALL,
            attributes={
                semconv.LLM_PROMPT_TOKEN_IDS: [1, True, 3],
                semconv.LLM_COMPLETION_TOKEN_IDS: [4, 5.5],
                semconv.LLM_LOGPROBS: "not json",
                semconv.LLM_REQUEST: "plain text, not a JSON object",
                semconv.GEN_AI_USAGE_OUTPUT_TOKENS: 2,
            },
        )
    )
    response = TestClient(create_app(store)).get("/dashboard/rollouts/ro-bad")
    assert response.status_code == 200
    html = response.text
    assert 'id="llm-call-1"' in html and "cannot be used for training" in html
    assert f"{semconv.LLM_PROMPT_TOKEN_IDS} is not a list of integers" in html
    assert f"{semconv.LLM_COMPLETION_TOKEN_IDS} is not a list of integers" in html
    assert f"{semconv.LLM_LOGPROBS} is not a list of numbers" in html
    assert "plain text, not a JSON object" in html  # the raw request is still shown
    assert "? prompt tokens" in html and "2 completion tokens" in html  # usage stands in for refused ids
    store.close()


def test_unknown_rollout_is_a_404_page(client: TestClient) -> None:
    response = client.get("/dashboard/rollouts/%3Cscript%3Ex")
    assert response.status_code == 404 and "Not found" in response.text
    assert "<script>x" not in response.text


def test_runs_page_plots_the_key_metrics_of_the_newest_run(client: TestClient) -> None:
    html = client.get("/dashboard/runs").text  # default: the run written last
    names = ["reward/mean", "success_rate", "loss", "kl", "throughput/tokens_per_s"]
    positions = [html.index(f'data-metric="{name}"') for name in names]
    assert positions == sorted(positions)  # reward, success, loss, KL, throughput
    assert html.count("<polyline") == 5 and html.count('data-run="grpo-1" stroke') == 5
    old = client.get("/dashboard/runs?run=old-run").text
    assert old.count("<polyline") == 1 and 'data-metric="loss"' in old


def test_runs_page_without_metrics(filled: Filled) -> None:
    from agentgrad.store.memory import MemoryStore

    with MemoryStore(watchdog_interval=None) as empty:
        html = TestClient(create_app(empty)).get("/dashboard/training").text  # the old URL still works
    assert "No runs yet" in html


def test_resources_page_diffs_the_last_two_versions(client: TestClient, filled: Filled) -> None:
    html = client.get("/dashboard/resources").text
    assert "v1 → v2" in html
    assert '<span class="del">-Solve: {question}</span>' in html
    assert '<span class="add">+Solve step by step: {question}</span>' in html
    assert "sk-secret-key" not in html  # API keys are never shown
    assert_escaped(html)
    reverse = client.get(f"/dashboard/resources?a={filled.v2}&b={filled.v1}").text
    assert "v2 → v1" in reverse and '<span class="add">+Solve: {question}</span>' in reverse


def test_runners_page_shows_alive_silent_and_stopped(client: TestClient) -> None:
    html = client.get("/dashboard/runners").text
    assert "1 of 3 alive" in html
    assert html.index("worker-a") < html.index("worker-silent")
    assert 'href="/dashboard/rollouts/ro-queued"' in html and "pid = 4242" in html
    assert "state-silent" in html and "state-stopped" in html
    assert_escaped(html)


def test_static_files(client: TestClient) -> None:
    css = client.get("/dashboard/static/dashboard.css")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    assert client.get("/dashboard/static/dashboard.js").status_code == 200
    assert client.get("/dashboard/static/..%2Fviews.py").status_code == 404


# ---- the token ----------------------------------------------------------------------------------


@pytest.fixture
def locked(filled: Filled) -> TestClient:
    return TestClient(create_app(filled.store, token="s3cret"))


@pytest.mark.parametrize(
    "path",
    [
        "/dashboard/rollouts",
        "/dashboard/rollouts/ro-good",
        "/dashboard/training",
        "/dashboard/resources",
        "/dashboard/runners",
        "/dashboard/rollouts?partial=table",
        "/dashboard/rollouts/nope",
        "/dashboard/runs",
        "/dashboard/prompts",
        "/dashboard/groups/g1",
        "/dashboard/replay/ro-good",
    ],
)
def test_token_required_for_every_page(locked: TestClient, path: str) -> None:
    response = locked.get(path)
    assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
    assert "Token required" in response.text
    for data in ("succeeded", "calculator", "worker-a", "grpo", "Solve", "ro-empty"):
        assert data not in response.text
    wrong = locked.get(path, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert locked.get(path, cookies={COOKIE_NAME: "s3cret"}).status_code == 401  # the cookie is not the token


def test_bearer_header_lets_in(locked: TestClient) -> None:
    response = locked.get("/dashboard/rollouts", headers={"Authorization": "Bearer s3cret"})
    assert response.status_code == 200 and "ro-good" in response.text


def test_token_login_sets_an_httponly_cookie_and_strips_the_token(locked: TestClient) -> None:
    response = locked.get("/dashboard/runners?token=s3cret&x=1", follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/dashboard/runners?x=1"
    cookie = response.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=lax" in cookie and "s3cret" not in cookie
    assert locked.get("/dashboard/runners").status_code == 200  # the client kept the cookie
    bad = locked.get("/dashboard/runners?token=wrong")
    assert bad.status_code == 401 and "not right" in bad.text


def test_router_mounts_in_another_app(filled: Filled) -> None:
    app = FastAPI()
    app.include_router(create_router(filled.store, prefix="/ui"))
    html = TestClient(app).get("/ui/rollouts").text
    assert 'href="/ui/rollouts/ro-good"' in html and 'href="/ui/static/dashboard.css"' in html


def test_importing_the_package_stays_light() -> None:
    code = (
        "import sys, agentgrad, agentgrad.dashboard, agentgrad.cli.dashboard; "
        "print(sorted(m for m in ('fastapi', 'jinja2', 'starlette') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
