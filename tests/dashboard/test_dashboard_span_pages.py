"""A rollout's page shows its spans a page at a time (issue 22, finding 8: the page of a
200,000-span rollout took 13.4 s and 1.44 GB, reading every span at once)."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("jinja2")

from fastapi.testclient import TestClient

from agentgrad import semconv
from agentgrad.dashboard import create_app
from agentgrad.dashboard.credit import CALLS_MAX
from agentgrad.dashboard.router import SPAN_PAGE
from agentgrad.store.memory import MemoryStore
from agentgrad.store.protocol import Store
from agentgrad.types import Span


class CountingStore(MemoryStore):
    """Records the ``limit`` of every span read, so the test sees that none reads everything."""

    def __init__(self) -> None:
        super().__init__(watchdog_interval=None)
        self.limits: list[int | None] = []

    def query_spans(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.limits.append(kwargs.get("limit", args[4] if len(args) > 4 else None))
        return super().query_spans(*args, **kwargs)


def _long_rollout(store: Store, spans: int) -> str:
    store.enqueue_rollout({"q": 1}, rollout_id="long")
    attempt = store.dequeue_rollout().attempt
    store.add_spans(
        [Span(rollout_id="long", attempt_id=attempt.attempt_id, name=f"step-{i:04d}") for i in range(spans - 1)]
    )
    store.add_span(
        Span(
            rollout_id="long",
            attempt_id=attempt.attempt_id,
            name=semconv.SPAN_REWARD,
            attributes={semconv.REWARD_VALUE: 0.75},
        )
    )  # the very last span
    return attempt.attempt_id


def _shown(html: str) -> list[str]:
    return re.findall(r"</span> (step-\d{4}|" + re.escape(semconv.SPAN_REWARD) + r")</summary>", html)


def test_rollout_page_pages_its_spans() -> None:
    store = CountingStore()
    total = 2 * SPAN_PAGE + 50
    attempt_id = _long_rollout(store, total)
    client = TestClient(create_app(store))
    seen: list[str] = []
    url = "/dashboard/rollouts/long"
    pages = 0
    while url:
        response = client.get(url)
        assert response.status_code == 200
        html = response.text
        shown = _shown(html)
        assert 0 < len(shown) <= SPAN_PAGE
        seen += shown
        pages += 1
        assert "0.75" in html  # the reward, although its span is on the last page only
        found = re.search(r'href="(\?attempt=[^"]+&amp;after=(\d+))" rel="next"', html)
        url = f"/dashboard/rollouts/long{found.group(1).replace('&amp;', '&')}" if found else ""
        if found:
            assert attempt_id in found.group(1) and int(found.group(2)) == pages * SPAN_PAGE
    assert pages == 3
    assert seen == [f"step-{i:04d}" for i in range(total - 1)] + [semconv.SPAN_REWARD]
    # Bounded reads only: a page of spans, and the credit section's LLM-call and reward spans
    # (read by name, capped at CALLS_MAX).
    assert None not in store.limits and max(store.limits) <= max(SPAN_PAGE, CALLS_MAX) + 1
    store.close()


def test_a_page_past_the_end_says_so() -> None:
    store = MemoryStore(watchdog_interval=None)
    _long_rollout(store, 3)
    html = TestClient(create_app(store)).get("/dashboard/rollouts/long?after=3").text
    assert "No spans after #3." in html and 'rel="first"' in html and 'rel="next"' not in html
    store.close()


def test_an_absurd_page_number_is_not_a_500() -> None:
    store = MemoryStore(watchdog_interval=None)
    _long_rollout(store, 2)
    client = TestClient(create_app(store))
    assert client.get(f"/dashboard/rollouts?page={2**80}").status_code == 200
    assert client.get(f"/dashboard/rollouts/long?after={2**80}").status_code == 200
    store.close()
