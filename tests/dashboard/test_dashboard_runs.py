"""Runs, rollouts (run/group columns and filters), group, rollout credit/tokens, replay and prompts
pages through FastAPI's TestClient, over a SQLite store filled by ``runs_data.fill_runs``."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("jinja2")
pytest.importorskip("tokenizers")

from fastapi.testclient import TestClient  # noqa: E402
from runs_data import CHILD_PROMPT, SEED_PROMPT, TOKENIZER, Runs, fill_runs  # noqa: E402

from agentgrad.dashboard import create_app  # noqa: E402
from agentgrad.dashboard.charts import line_chart, nice_ticks  # noqa: E402
from agentgrad.dashboard.runs import metric_order  # noqa: E402
from agentgrad.dashboard.tokens import TokenDecoder, legend, surprisal_level  # noqa: E402
from agentgrad.store import open_store  # noqa: E402
from agentgrad.store.memory import MemoryStore  # noqa: E402
from agentgrad.store.protocol import RolloutRequest  # noqa: E402
from agentgrad.types import MetricRecord  # noqa: E402


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    store = open_store(f"sqlite:///{tmp_path_factory.mktemp('runs') / 'store.db'}", watchdog=False)
    try:
        yield fill_runs(store)
    finally:
        store.close()


@pytest.fixture(scope="module")
def client(runs: Runs) -> TestClient:
    return TestClient(create_app(runs.store, tokenizers={"tiny-calc": TOKENIZER.parent}))


def rows_of(html: str, table: str) -> list[str]:
    body = html.split(f'<table class="data {table}">', 1)[1].split("</table>", 1)[0]
    return re.findall(r"<tr[^>]*>(.*?)</tr>", body.split("<tbody>", 1)[1], flags=re.S)


# ---- runs -----------------------------------------------------------------------------------


def test_runs_table_lists_every_run_with_algorithm_model_steps_and_validation(client: TestClient) -> None:
    html = client.get("/dashboard/runs").text
    rows = {re.search(r'value="([^"]+)"', row)[1]: row for row in rows_of(html, "runs")}
    assert set(rows) == {"grpo-a", "grpo-b", "sft:s1", "apo:p1"}
    grpo = rows["grpo-a"]
    assert ">GRPO<" in grpo and "tiny-calc" in grpo and '<td class="num">11</td>' in grpo  # 11 steps
    cells = re.findall(r'<td class="num"[^>]*>([^<]*)</td>', grpo)
    assert cells[-2:] == ["0.55", "0.4"]  # best (step 9) and last validation (step 10 dropped)
    assert ">SFT<" in rows["sft:s1"] and "tiny-calc" in rows["sft:s1"]
    assert ">APO<" in rows["apo:p1"] and "0.75" in rows["apo:p1"] and "/dashboard/prompts?run=p1" in rows["apo:p1"]


def test_key_metrics_come_first_and_the_rest_wait_behind_all_metrics(client: TestClient) -> None:
    html = client.get("/dashboard/runs?run=grpo-a").text
    shown = re.findall(r'<figure class="chart" data-metric="([^"]+)"', html)
    assert shown == ["reward/mean", "val/reward_mean", "loss", "entropy", "kl", "tokens_per_second"]
    assert "All metrics (3 more)" in html
    every = client.get("/dashboard/runs?run=grpo-a&all=1").text
    names = re.findall(r'<figure class="chart" data-metric="([^"]+)"', every)
    assert names[:6] == shown and names[6:] == ["adapter/rollouts_without_reward", "clip_fraction", "grpo/groups"]


def test_metric_order_does_not_match_reward_as_a_substring() -> None:
    key, rest = metric_order(["adapter/rollouts_without_reward", "kl", "reward/mean", "zeta"])
    assert key == ["reward/mean", "kl"] and rest == ["adapter/rollouts_without_reward", "zeta"]


def test_two_runs_overlay_on_shared_labelled_axes(client: TestClient) -> None:
    html = client.get("/dashboard/runs?run=grpo-a&run=grpo-b").text
    chart = html.split('data-metric="reward/mean"', 1)[1].split("</figure>", 1)[0]
    curves = re.findall(r'<polyline class="curve" data-run="([^"]+)" stroke="(#[0-9a-f]{6})"', chart)
    assert [run for run, _ in curves] == ["grpo-a", "grpo-b"] and curves[0][1] != curves[1][1]
    assert chart.count('class="pt"') == 22  # 11 steps × 2 runs, each with its hover values
    assert "<title>grpo-b · step 10 · reward/mean = 0.5</title>" in chart
    x_ticks = re.findall(r'class="x-tick"[^>]*>([^<]+)<', chart)
    y_ticks = re.findall(r'class="y-tick"[^>]*>([^<]+)<', chart)
    assert x_ticks[0] == "0" and x_ticks[-1] == "10" and y_ticks[0] == "0" and float(y_ticks[-1]) >= 1.0
    assert chart.count("<line") >= len(x_ticks) + len(y_ticks) + 2  # gridlines and both axes
    assert ">step</text>" in chart and ">reward/mean</text>" in chart
    assert html.count("checked aria") == 0 and html.count(" checked>") == 2  # both runs stay ticked


def test_unknown_runs_are_left_out_of_the_comparison(client: TestClient) -> None:
    html = client.get("/dashboard/runs?run=nope&run=grpo-b").text
    assert re.findall(r'data-run="([^"]+)" stroke', html.split('data-metric="reward/mean"')[1])[:1] == ["grpo-b"]
    assert "nope" not in html.split("<h2>Curves", 1)[1]


def test_the_old_training_url_serves_the_runs_page(client: TestClient) -> None:
    response = client.get("/dashboard/training?run=grpo-b", follow_redirects=False)
    assert response.status_code == 200 and "<h1>Runs</h1>" in response.text
    assert 'data-run="grpo-b" stroke' in response.text


def test_no_runs_says_how_to_get_some() -> None:
    with MemoryStore(watchdog_interval=None) as empty:
        html = TestClient(create_app(empty)).get("/dashboard/runs").text
    assert "No runs yet" in html


def test_nice_ticks_cover_the_range_with_round_steps() -> None:
    assert nice_ticks(0, 10, 6) == [0, 2, 4, 6, 8, 10]
    assert nice_ticks(0.13, 0.87, 5) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    flat = nice_ticks(3, 3)
    assert flat[0] < 3 < flat[-1]
    with pytest.raises(ValueError, match="finite"):
        nice_ticks(0, float("inf"))
    with pytest.raises(ValueError, match="no values"):
        line_chart("m", {"a": []})


# ---- rollouts, groups -----------------------------------------------------------------------


def test_rollouts_table_has_task_run_step_group_and_agent_columns(client: TestClient, runs: Runs) -> None:
    group = "grpo-a-s2-t0-r0"
    html = client.get(f"/dashboard/rollouts?group={group}").text
    assert "Rollouts 1–2 of 2" in html
    row = rows_of(html, "rollouts")[0]
    assert "task 0: what is 2+3?" in row and ">grpo-a</a>" in row and '<td class="num">2</td>' in row
    assert f'href="/dashboard/groups/{group}"' in row and '<span class="dim">solver</span>' in row


def test_the_agents_column_names_the_agents_of_the_llm_calls_without_scopes() -> None:
    """Framework agents (AutoGen, CrewAI, smolagents) name their calls through the proxy and open
    no agent scope: the column once read only scopes, and showed "—" for them."""
    from agentgrad import semconv
    from agentgrad.types import Span

    store = MemoryStore(watchdog_interval=None)
    (rollout,) = store.enqueue_rollouts([RolloutRequest(input={"q": "2+3?"})])
    (claimed,) = store.dequeue_rollouts(1, worker_id="runner-1")
    attempt = claimed.attempt.attempt_id
    calls = [
        Span(
            rollout_id=rollout.rollout_id,
            attempt_id=attempt,
            name=semconv.SPAN_LLM_CALL,
            attributes={semconv.AGENT_NAME: name, semconv.LLM_PROMPT_TOKEN_IDS: [1]},
        )
        for name in ("solver", "reviewer", "solver")
    ]
    store.add_spans(calls)
    store.update_attempt(rollout.rollout_id, attempt, "succeeded")
    (row,) = rows_of(TestClient(create_app(store)).get("/dashboard/rollouts").text, "rollouts")
    assert '<span class="dim">solver</span>' in row and '<span class="dim">reviewer</span>' in row
    store.close()


def test_rollouts_filter_by_run_pages_over_the_runs_rollouts(client: TestClient, runs: Runs) -> None:
    html = client.get("/dashboard/rollouts?run=grpo-a&per_page=25").text
    assert "Rollouts 1–8 of 8" in html
    assert all(">grpo-a</a>" in row for row in rows_of(html, "rollouts"))
    apo = client.get("/dashboard/rollouts?run=apo:p1").text
    assert "Rollouts 1–9 of 9" in apo  # two validation groups of 4 and one critique rollout
    assert 'value="apo:p1" selected' in apo
    for number in range(30):  # a second page of one run's rollouts
        runs.store.enqueue_rollout({"n": number}, metadata={"group_id": f"grpo-b-s1-t{number}-r0", "step": 1})
    first = client.get("/dashboard/rollouts?run=grpo-b&per_page=25").text
    second = client.get("/dashboard/rollouts?run=grpo-b&per_page=25&page=2").text
    assert "Rollouts 1–25 of 30" in first and 'rel="next"' in first and "run=grpo-b" in first
    assert "Rollouts 26–30 of 30" in second
    assert not set(re.findall(r"/rollouts/([\w-]+)\"", first)) & set(re.findall(r"/rollouts/([\w-]+)\"", second))


def test_group_page_shows_rewards_and_advantages_side_by_side(client: TestClient, runs: Runs) -> None:
    html = client.get("/dashboard/groups/grpo-a-s1-t0-r0").text
    members = re.findall(r'<article class="group-member">(.*?)</article>', html, flags=re.S)
    assert len(members) == 2
    rewards = [re.search(r'class="reward">([^<]+)<', m)[1] for m in members]
    advantages = [re.search(r'class="advantage[^"]*">([^<]+)<', m)[1] for m in members]
    assert sorted(zip(rewards, advantages, strict=True)) == [("0", "-1.000"), ("1", "+1.000")]  # (r − 0.5) / 0.5
    agreeing = client.get("/dashboard/groups/grpo-a-s1-t1-r0").text
    assert "carries no learning signal" in agreeing and "(dropped)" in agreeing
    assert client.get("/dashboard/groups/no-such-group").status_code == 404


def test_rollout_page_links_its_group_and_run(client: TestClient, runs: Runs) -> None:
    rollout_id = runs.grpo_rollouts["grpo-a-s1-t0-r0"][0]
    html = client.get(f"/dashboard/rollouts/{rollout_id}").text
    assert 'href="/dashboard/groups/grpo-a-s1-t0-r0"' in html and 'href="/dashboard/runs?run=grpo-a"' in html


# ---- tokens, credit, replay, framework spans -------------------------------------------------


def test_completion_tokens_are_decoded_and_coloured_on_a_log_scale(client: TestClient, runs: Runs) -> None:
    html = client.get(f"/dashboard/rollouts/{runs.two_calls}").text
    card = html.split('id="llm-call-2"', 1)[1]
    tokens = re.findall(r'<span class="tok p(\d)" title="id (\d+)[^"]*">([^<]*)</span>', card)
    assert "".join(text for _, _, text in tokens) == runs.answer  # text, not ids
    first = re.findall(r'<span class="tok p(\d)" title="id \d+[^"]*">', html.split('id="llm-call-1"', 1)[1])
    assert first[:4] == ["9", "6", "3", "1"]  # p = 0.99999, 0.995, 0.74, 0.08: all told apart


def test_without_a_tokenizer_the_ids_show(runs: Runs) -> None:
    html = TestClient(create_app(runs.store)).get(f"/dashboard/rollouts/{runs.two_calls}").text
    assert "⟨" in html.split('id="llm-call-2"', 1)[1]


def test_surprisal_levels_and_legend() -> None:
    assert [surprisal_level(lp) for lp in (-1e-6, -3e-4, -0.002, -0.02, -0.5, -5.0)] == [9, 9, 7, 5, 2, 0]
    labels = [label for _, label in legend()]
    assert labels[0].startswith("p < ") and labels[-1] == "≥ 0.99968" and len(set(labels)) == 10
    with pytest.raises(ValueError, match="no tokenizer"):
        TokenDecoder({"m": Path("/nonexistent")})
    assert TokenDecoder({"*": TOKENIZER}).decode("other", [10**9]) is None  # not this vocabulary


@pytest.mark.parametrize(
    ("rule", "credits"),
    [
        ("final", ["1", "1"]),
        ("discounted", ["0.9", "1"]),
        ("emitted", ["0.25", "1"]),
        # call 1's tool call is unparsable (-0.5) and its tool answered an error (-0.25)
        ("air", ["0.25", "1"]),
    ],
)
def test_credit_per_call_from_the_chosen_rule(client: TestClient, runs: Runs, rule: str, credits: list[str]) -> None:
    html = client.get(f"/dashboard/rollouts/{runs.two_calls}?credit={rule}").text
    rows = rows_of(html, "credit-table")
    assert [re.search(r'<td class="num">([^<]+)</td>', r)[1] for r in rows] == credits
    assert f"from rule <code>{rule}</code>" in html and f'value="{rule}" selected' in html
    if rule == "air":
        assert "<code>unparsable_tool_call</code>" in rows[0] and "<code>tool_error</code>" in rows[0]


def test_replay_steps_through_the_calls(client: TestClient, runs: Runs) -> None:
    url = f"/dashboard/replay/{runs.two_calls}"
    first = client.get(url).text
    assert "Call <b>1</b> of 2" in first and 'rel="next"' in first and 'rel="prev"' not in first
    assert "You are a calculator." in first and "0.25" in first.split("Rewards after this call", 1)[1]
    second = client.get(f"{url}?call=2&credit=discounted").text
    assert "Call <b>2</b> of 2" in second and 'rel="prev"' in second and 'rel="next"' not in second
    context = second.split("<h4>Context", 1)[1].split("<h4>Answer", 1)[0]
    assert "3 earlier message(s) folded" in context and "Error: no such tool" in context
    assert "You are a calculator." not in context
    assert 'class="credit-value">1<' in second and "from rule <code>discounted</code>" in second
    assert "Call <b>2</b> of 2" in client.get(f"{url}?call=99").text  # past the end: the last call
    assert client.get(f"{url}?attempt=nope").status_code == 404
    empty = client.get(f"/dashboard/replay/{runs.framework}").text
    assert "nothing to replay" in empty


def test_openinference_spans_show_their_inputs_and_outputs(client: TestClient, runs: Runs) -> None:
    html = client.get(f"/dashboard/rollouts/{runs.framework}").text
    assert ">other<" not in html
    assert '<span class="kind">LLM</span> ChatCompletion' in html and '<span class="kind">CHAIN</span>' in html
    assert "What is the capital of France?" in html and "Answer in one word." in html
    assert '<span class="tool-name">lookup</span>' in html
    assert "LLM · gpt-4o-mini · Paris" in html  # the tree's one-line summary


# ---- prompts ----------------------------------------------------------------------------------


def test_prompts_page_lists_candidates_per_round_and_diffs_them(client: TestClient) -> None:
    html = client.get("/dashboard/prompts").text
    assert "<h3>Round 0</h3>" in html and "<h3>Round 1</h3>" in html
    assert "0.25" in html and "0.75" in html and "best</span>" in html
    diff = html.split('<pre class="diff-lines">', 1)[1].split("</pre>", 1)[0]
    assert '<span class="add">+Use the calculator.</span>' in diff
    assert '<span class="del">-Solve: {question}</span>' in diff
    assert "+0.500" in html  # B (best) against A (seed)
    assert "The critique B was written from" in html
    seed_vs_seed = client.get(
        "/dashboard/prompts?run=p1&a="
        + re.search(r'value="(apo-p1-[^"]+)"', html)[1]
        + "&b="
        + re.search(r'value="(apo-p1-[^"]+)"', html)[1]
    ).text
    assert "The two prompts are the same." in seed_vs_seed
    assert SEED_PROMPT.split("\n")[0] in html and CHILD_PROMPT.split("\n")[1] in html


def test_prompts_page_without_apo() -> None:
    with MemoryStore(watchdog_interval=None) as empty:
        html = TestClient(create_app(empty)).get("/dashboard/prompts").text
    assert "No APO run in this store" in html


# ---- paging over big stores (behaviour; the times are in bench/bench_dashboard.py) -------------


class ReadCountingStore(MemoryStore):
    """Records the ``limit`` of every rollout read, to show that no page reads them all."""

    def __init__(self) -> None:
        super().__init__(watchdog_interval=None)
        self.limits: list[int | None] = []

    def query_rollouts(self, filter=None):  # type: ignore[no-untyped-def]
        self.limits.append(filter.limit if filter is not None else None)
        return super().query_rollouts(filter)


def test_run_filter_reads_in_chunks_and_stops_once_the_page_is_full(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentgrad.dashboard import router

    monkeypatch.setattr(router, "RUN_SCAN_CHUNK", 10)
    store = ReadCountingStore()
    for n in range(120):  # every other rollout belongs to run "r"
        store.enqueue_rollout({"n": n}, metadata={"group_id": f"{'r' if n % 2 else 'x'}-s1-t{n}-r0", "step": 1})
    client = TestClient(create_app(store))
    seen: list[str] = []
    first = client.get("/dashboard/rollouts?run=r&per_page=25&sort=rollout_id&order=asc").text
    assert "Rollouts 1–25 of more than 25" in first and 'rel="next"' in first
    assert None not in store.limits and max(store.limits) <= 25  # 6 chunks of 10, not all 120
    assert len(store.limits) < 10
    for page in (1, 2, 3):
        html = client.get(f"/dashboard/rollouts?run=r&per_page=25&sort=rollout_id&order=asc&page={page}").text
        seen += re.findall(r'href="/dashboard/rollouts/(ro-[\w]+)"', html)
    assert "Rollouts 51–60 of 60" in html and 'rel="next"' not in html
    assert len(seen) == len(set(seen)) == 60
    assert seen == sorted(seen)
    store.close()


def test_runs_page_reads_a_bounded_number_of_rollouts() -> None:
    from agentgrad.dashboard.runs import MODEL_SCAN

    store = ReadCountingStore()
    store.add_metrics(
        [MetricRecord(run_id="g", step=s, values={"reward/mean": 0.1, "entropy": 1.0, "kl": 0.0}) for s in range(3)]
    )
    store.enqueue_rollouts([RolloutRequest(input=n, metadata={"group_id": f"g-s1-t{n}-r0"}) for n in range(50)])
    html = TestClient(create_app(store)).get("/dashboard/runs").text
    assert ">GRPO<" in html
    assert None not in store.limits and max(store.limits) <= MODEL_SCAN
    store.close()


def test_an_old_grpo_runs_model_is_found_by_its_group_id(runs: Runs, monkeypatch: pytest.MonkeyPatch) -> None:
    from agentgrad.dashboard import runs as runs_view

    monkeypatch.setattr(runs_view, "MODEL_SCAN", 1)  # its rollouts are not among the newest read
    summaries = {s.run_id: s for s in runs_view.summarize_runs(runs.store, runs.store.query_metrics())}
    assert summaries["grpo-a"].model == "tiny-calc"  # probed: group grpo-a-s1-t0-r0
    assert summaries["grpo-b"].model is None  # no rollout of its own


def test_a_rollout_with_too_many_calls_is_not_credited_and_replays_its_first(
    client: TestClient, runs: Runs, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentgrad.dashboard import credit

    monkeypatch.setattr(credit, "CALLS_MAX", 1)
    html = client.get(f"/dashboard/rollouts/{runs.two_calls}").text
    assert "more than 1 LLM calls: credit is not computed here" in html
    replay = client.get(f"/dashboard/replay/{runs.two_calls}").text
    assert "Call <b>1</b> of 1 (the first 1 read)" in replay


def test_framework_io_reads_genai_and_openinference_content_lists() -> None:
    from agentgrad.dashboard.frameworks import framework_io

    genai = framework_io(
        {
            "gen_ai.request.model": "m",
            "gen_ai.prompt.0.role": "user",
            "gen_ai.prompt.0.content": "hi",
            "gen_ai.completion.0.role": "assistant",
            "gen_ai.completion.0.content": "hello",
        }
    )
    assert genai is not None and (genai.kind, genai.name, genai.summary) == ("LLM", "m", "hello")
    assert [m.role for m in genai.inputs] == ["user"]
    parts = framework_io(
        {
            "openinference.span.kind": "LLM",
            "llm.input_messages.0.message.role": "user",
            "llm.input_messages.0.message.contents.0.message_content.type": "text",
            "llm.input_messages.0.message.contents.0.message_content.text": "look at this",
        }
    )
    assert parts is not None and parts.inputs[0].content == "look at this"
    tool = framework_io({"openinference.span.kind": "TOOL", "tool.name": "search", "input.value": "q"})
    assert tool is not None and (tool.kind, tool.name, tool.summary) == ("TOOL", "search", "q")
    assert framework_io({"http.method": "GET"}) is None


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/dashboard/rollouts?group=%00abc", 200),
        ("/dashboard/rollouts?run=%00", 200),
        ("/dashboard/rollouts?group=" + "g" * 5000, 200),
        ("/dashboard/rollouts?run=nope&page=99999999", 200),
        ("/dashboard/groups/%00", 404),
        ("/dashboard/groups/" + "g" * 600, 404),
        ("/dashboard/replay/nope", 404),
        ("/dashboard/replay/x%00?call=-5", 404),
        ("/dashboard/runs?run=%00&all=2", 200),
        ("/dashboard/prompts?run=zz&a=%00&b=1", 200),
        ("/dashboard/rollouts/ro-two-calls?credit=bogus", 200),
    ],
)
def test_bad_parameters_get_a_page_or_a_404_never_a_500(client: TestClient, path: str, status: int) -> None:
    assert client.get(path).status_code == status


def _graded(task: float) -> float:
    return task


def test_an_evaluation_with_a_run_id_is_a_run_beside_the_training_runs(tmp_path: Path) -> None:
    """``Trainer.dev(run_id=)`` (what ``agentgrad eval`` calls) records an evaluation run: its rollouts
    belong to it, and the runs table lists it with its reward mean as the validation score."""
    from agentgrad.agents import rollout
    from agentgrad.dashboard.runs import run_of, summarize_runs
    from agentgrad.trainer import Trainer

    store = open_store(f"sqlite://{tmp_path / 'store.sqlite'}")
    try:
        report = Trainer(store, n_runners=1).dev(
            rollout(_graded), [1.0, 0.0, 1.0, 1.0], run_id="e1", print_summary=False
        )
        assert report.reward_mean == 0.75
        assert {run_of(r) for r in report.rollouts} == {"eval:e1"}
        (summary,) = summarize_runs(store, store.query_metrics())
        assert (summary.run_id, summary.algorithm, summary.validation_metric) == (
            "eval:e1",
            "evaluation",
            "eval/reward_mean",
        )
        assert summary.best_validation == summary.last_validation == 0.75
        page = TestClient(create_app(store)).get("/dashboard/runs").text
        assert "eval:e1" in page and "evaluation" in page
    finally:
        store.close()
