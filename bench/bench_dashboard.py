"""Dashboard page times on a big store: 10,000 rollouts and one rollout of 200,000 spans.

    python bench/bench_dashboard.py                    # SQLite file, 10,000 rollouts, 200,000 spans
    python bench/bench_dashboard.py --rollouts 2000 --spans 20000 --repeat 3

The store is a SQLite file filled through the Store API the way GRPO leaves it: rollouts in
groups of 8 named as GRPO names them (``<run>-s<step>-t<task>-r0``, a step every 64 rollouts),
each with an agent scope, one LLM-call span (token ids, logprobs, request and response) and a
reward span; 200 steps of metrics for two runs; and one rollout with ``--spans`` spans (one LLM
call every 100, a reward every 1000). Every page is requested through FastAPI's TestClient
(in process: no network in the figure) ``--repeat`` times; the median and the worst are printed
in milliseconds, with the page's size in bytes, and the machine's load average, as one JSON
object. The goal is under 1000 ms on an unloaded machine.

The code measured is this checkout's ``src``, or the first PYTHONPATH entry when one is set, to
time a baseline copy back to back with the working tree (machine load varies minute to minute);
a page the baseline does not have is reported as null.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

if not os.environ.get("PYTHONPATH"):  # else the first PYTHONPATH entry: a baseline copy to compare with
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from agentgrad import semconv  # noqa: E402
from agentgrad.store import open_store  # noqa: E402
from agentgrad.store.protocol import RolloutRequest, Store  # noqa: E402
from agentgrad.types import AttemptStatus, MetricRecord, Span  # noqa: E402

GROUP = 8


def llm_attributes(n: int) -> dict[str, object]:
    ids = list(range(100, 140))
    return {
        semconv.LLM_PROMPT_TOKEN_IDS: list(range(1, 200)),
        semconv.LLM_COMPLETION_TOKEN_IDS: ids,
        semconv.LLM_LOGPROBS: [-0.01 * (i % 7) for i in range(len(ids))],
        semconv.LLM_REQUEST: json.dumps({"model": "tiny", "messages": [{"role": "user", "content": f"task {n}"}]}),
        semconv.LLM_RESPONSE: json.dumps(
            {"choices": [{"index": 0, "message": {"role": "assistant", "content": "answer " * 20}}]}
        ),
        semconv.GEN_AI_REQUEST_MODEL: "tiny",
    }


def fill(store: Store, rollouts: int, spans: int) -> tuple[str, str]:
    """Returns (a group id, the long rollout's id)."""
    started = time.perf_counter()
    for first in range(0, rollouts, 1000):
        count = min(1000, rollouts - first)
        requests = [
            RolloutRequest(
                input={"question": f"What is {n} + {n}?"},
                metadata={"group_id": f"grpo-{'ab'[n % 2]}-s{n // 64}-t{(n // GROUP) % 8}-r0", "step": n // 64},
            )
            for n in range(first, first + count)
        ]
        ids = [r.rollout_id for r in store.enqueue_rollouts(requests)]
        claimed = store.dequeue_rollouts(count)
        now = time.time()
        batch = []
        for n, c in enumerate(claimed, start=first):
            rid, aid = c.rollout.rollout_id, c.attempt.attempt_id
            batch += [
                Span(
                    rollout_id=rid,
                    attempt_id=aid,
                    span_id=f"a{n}",
                    name=semconv.SPAN_AGENT,
                    start_time=now,
                    end_time=now + 1,
                    attributes={semconv.AGENT_NAME: "solver"},
                ),
                Span(
                    rollout_id=rid,
                    attempt_id=aid,
                    span_id=f"l{n}",
                    parent_id=f"a{n}",
                    name=semconv.SPAN_LLM_CALL,
                    start_time=now,
                    end_time=now + 0.5,
                    attributes=llm_attributes(n),
                ),
                Span(
                    rollout_id=rid,
                    attempt_id=aid,
                    span_id=f"r{n}",
                    name=semconv.SPAN_REWARD,
                    start_time=now + 0.6,
                    end_time=now + 0.6,
                    attributes={semconv.REWARD_VALUE: float(n % 2)},
                ),
            ]
        store.add_spans(batch)
        for c in claimed:
            store.update_attempt(c.rollout.rollout_id, c.attempt.attempt_id, AttemptStatus.SUCCEEDED)
        assert len(ids) == count
    for run in ("grpo-a", "grpo-b"):
        store.add_metrics(
            [
                MetricRecord(
                    run_id=run,
                    step=s,
                    values={
                        "reward/mean": s / 200,
                        "val/reward_mean": s / 250,
                        "entropy": 1 - s / 400,
                        "kl": s / 1e4,
                        "tokens_per_second": 500.0,
                        "loss": 1 / (s + 1),
                        **{f"extra/m{i}": float(i) for i in range(25)},
                    },
                )
                for s in range(200)
            ]
        )
    long = store.enqueue_rollout({"question": "a very long trajectory"}, rollout_id="long")
    attempt = store.dequeue_rollout().attempt.attempt_id
    now = time.time()
    for first in range(0, spans, 10_000):
        batch = []
        for i in range(first, min(spans, first + 10_000)):
            if i % 1000 == 999:
                batch.append(
                    Span(
                        rollout_id="long",
                        attempt_id=attempt,
                        name=semconv.SPAN_REWARD,
                        start_time=now + i,
                        end_time=now + i,
                        attributes={semconv.REWARD_VALUE: 0.5},
                    )
                )
            elif i % 100 == 0:
                batch.append(
                    Span(
                        rollout_id="long",
                        attempt_id=attempt,
                        name=semconv.SPAN_LLM_CALL,
                        start_time=now + i,
                        end_time=now + i + 0.5,
                        attributes=llm_attributes(i),
                    )
                )
            else:
                batch.append(
                    Span(
                        rollout_id="long",
                        attempt_id=attempt,
                        name=f"tool-{i % 13}",
                        start_time=now + i,
                        end_time=now + i + 0.1,
                        attributes={"i": i},
                    )
                )
        store.add_spans(batch)
    store.update_attempt("long", attempt, AttemptStatus.SUCCEEDED)
    print(f"filled in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return "grpo-a-s3-t0-r0", long.rollout_id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=10_000)
    parser.add_argument("--spans", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    from fastapi.testclient import TestClient

    from agentgrad.dashboard import create_app

    with tempfile.TemporaryDirectory() as folder:
        store = open_store(f"sqlite:///{Path(folder) / 'store.db'}", watchdog=False)
        try:
            group, long = fill(store, args.rollouts, args.spans)
            client = TestClient(create_app(store))
            pages = {
                "rollouts": "/dashboard/rollouts",
                "rollouts_page_100": "/dashboard/rollouts?per_page=50&page=100",
                "rollouts_of_a_run": "/dashboard/rollouts?run=grpo-a",
                "rollouts_of_a_group": f"/dashboard/rollouts?group={group}",
                "group": f"/dashboard/groups/{group}",
                "runs": "/dashboard/runs",
                "runs_compare_all_metrics": "/dashboard/runs?run=grpo-a&run=grpo-b&all=1",
                "long_rollout": f"/dashboard/rollouts/{long}",
                "long_rollout_page_500": f"/dashboard/rollouts/{long}?after=100000",
                "long_rollout_replay": f"/dashboard/replay/{long}?call=1000",
            }
            results = {}
            for name, url in pages.items():
                times, size = [], 0
                for _ in range(args.repeat):
                    started = time.perf_counter()
                    response = client.get(url)
                    times.append((time.perf_counter() - started) * 1000)
                    status, size = response.status_code, len(response.content)
                # A page the measured code does not have (a baseline's 404) is reported as null.
                results[name] = (
                    None
                    if status == 404
                    else {
                        "median_ms": round(statistics.median(times), 1),
                        "max_ms": round(max(times), 1),
                        "bytes": size,
                        **({} if status == 200 else {"status": status}),
                    }
                )
        finally:
            store.close()
    print(
        json.dumps(
            {
                "backend": "sqlite",
                "rollouts": args.rollouts,
                "long_rollout_spans": args.spans,
                "repeat": args.repeat,
                "load_average_1m": os.getloadavg()[0],
                "cpus": os.cpu_count(),
                "pages": results,
                "all_under_1s": all(r["max_ms"] < 1000 for r in results.values() if r),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
