"""Trainer.dev and Trainer.fit with real stores and runners (in-process and processes)."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import agents_for_tests
import pytest
from rich.console import Console

from agentgrad.agents import as_agent
from agentgrad.algorithms.base import Algorithm, AlgorithmContext
from agentgrad.runner import Runner, RunnerDiedError
from agentgrad.store.memory import MemoryStore
from agentgrad.store.sqlite import SqliteStore
from agentgrad.trainer import Trainer
from agentgrad.types import LLM, RolloutStatus

FAST = {"poll_timeout": 0.05, "heartbeat_interval": 0.2}


def console() -> Console:
    return Console(file=io.StringIO(), width=120, force_terminal=False)


def test_dev_in_process_over_memory():
    store = MemoryStore(watchdog_interval=None)
    out = console()
    trainer = Trainer(store, n_runners=1, runner_options=FAST, console=out)
    tasks = [{"x": 1}, {"x": 2, "fail": True}, {"x": 3}, {"x": 4, "fail": True}]
    report = trainer.dev(agents_for_tests.failing_agent, tasks, timeout=20)
    assert (report.total, report.succeeded, report.failed, report.timed_out) == (4, 2, 2, 0)
    assert report.reward_mean == 1.0 and report.rewards == [1.0, 1.0]
    assert dict(report.failure_reasons) == {"ValueError: bad task 2": 1, "ValueError: bad task 4": 1}
    assert report.llm_calls_per_rollout == [0, 0, 0, 0] and report.no_llm_calls == 4
    summary = report.as_dict()
    assert summary["rollouts_without_llm_calls"] == 4 and summary["succeeded"] == 2
    text = out.file.getvalue()
    assert "AgentGrad dev run" in text and "bad task 2" in text
    assert "4 rollout(s) captured no LLM call" in text  # zero LLM calls is loud
    store.close()


def test_dev_publishes_resources_and_uses_mode():
    store = MemoryStore(watchdog_interval=None)
    trainer = Trainer(store, runner_options=FAST, console=console())

    def agent(task, llm):
        return 1.0 if llm.model == "m1" else 0.0

    report = trainer.dev(agent, [0, 1], {"llm": LLM(endpoint="http://x.invalid/v1", model="m1")}, timeout=20)
    assert report.succeeded == 2 and report.reward_mean == 1.0
    (published,) = store.query_resources()
    assert all(r.resources_id == published.resources_id for r in report.rollouts)
    val = trainer.dev(agents_for_tests.echo_agent, [0, 1, 2], mode="val", timeout=20, print_summary=False)
    assert val.reward_mean == 0.25 and all(r.mode == "val" for r in val.rollouts)
    store.close()


def test_dev_timeout_cancels_unfinished_rollouts():
    store = MemoryStore(watchdog_interval=None)
    trainer = Trainer(store, runner_options={**FAST, "grace_seconds": 0.2}, console=console())
    report = trainer.dev(agents_for_tests.slow_async_agent, [{"sleep": 30}], timeout=0.5, print_summary=False)
    assert report.timed_out == 1 and report.rollouts[0].status == RolloutStatus.CANCELLED
    store.close()


def test_dev_with_two_runner_processes_over_sqlite(tmp_path):
    path = tmp_path / "dev.db"
    store = SqliteStore(path)
    assert store.shared_url == f"sqlite://{path.resolve()}"
    trainer = Trainer(store, n_runners=2, runner_options=FAST, console=console())
    report = trainer.dev(agents_for_tests.reward_agent, [{"x": x} for x in range(8)], timeout=60)
    assert report.total == report.succeeded == 8
    assert report.reward_mean == pytest.approx(sum(range(8)) / 80)
    assert report.spans_per_rollout == [2] * 8 and report.no_llm_calls == 8
    workers = store.query_workers()
    # a runner still starting when the work ran out may be stopped before it ever reported
    assert 1 <= len(workers) <= 2 and all(w.status == "stopped" for w in workers)
    pids = {
        s.attributes["pid"] for r in report.rollouts for s in store.query_spans(r.rollout_id, name="agentgrad.message")
    }
    assert 1 <= len(pids) <= 2
    store.close()


def test_shared_url_of_a_home_relative_sqlite_file_names_the_file_opened(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    store = SqliteStore("~/runs/store.db", watchdog_interval=None)
    store.enqueue_rollout("x")
    assert (tmp_path / "runs" / "store.db").exists()
    assert store.shared_url == f"sqlite://{(tmp_path / 'runs' / 'store.db').resolve()}"
    store.close()


def test_shared_url_of_private_stores_is_none():
    assert MemoryStore(watchdog_interval=None).shared_url is None
    assert SqliteStore(":memory:", watchdog_interval=None).shared_url is None


def test_dev_with_runner_processes_over_a_protected_store_service(tmp_path, monkeypatch):
    """Runner processes reach a token-protected service with the trainer's token, which never
    travels in the URL; a client without it is refused."""
    from agentgrad.store.client import StoreClient, StoreServiceError
    from agentgrad.store.service.server import StoreServer

    monkeypatch.delenv("AGENTGRAD_STORE_TOKEN", raising=False)
    with StoreServer(SqliteStore(tmp_path / "served.db"), token="t0k3n", owns_store=True) as server:
        with pytest.raises(StoreServiceError):
            StoreClient(server.url, retries=0).count_rollouts()
        client = StoreClient(server.url, token="t0k3n")
        assert client.shared_url == server.url
        trainer = Trainer(client, n_runners=2, runner_options=FAST, console=console())
        report = trainer.dev(agents_for_tests.reward_agent, [{"x": x} for x in range(4)], timeout=60)
        assert report.total == report.succeeded == 4
        client.close()


def test_store_client_takes_its_token_from_the_environment(tmp_path, monkeypatch):
    from agentgrad.store import open_store
    from agentgrad.store.service.server import StoreServer

    with StoreServer(MemoryStore(watchdog_interval=None), token="env-token", owns_store=True) as server:
        monkeypatch.setenv("AGENTGRAD_STORE_TOKEN", "env-token")
        with open_store(server.url) as store:
            assert store.count_rollouts() == 0


def test_dev_without_tasks_is_an_error():
    with pytest.raises(ValueError, match="no tasks"):
        Trainer(runner_options=FAST, console=console()).dev(agents_for_tests.reward_agent, [])


def test_fit_without_algorithm_raises():
    with pytest.raises(ValueError, match="needs an algorithm"):
        Trainer(console=console()).fit(agents_for_tests.reward_agent, [{"x": 1}])


class TwoRounds(Algorithm):
    """A tiny algorithm: two rounds over the train tasks, publishing new resources each round."""

    def run(self, context: AlgorithmContext):
        store = context.store
        means = []
        for round_ in range(2):
            resources = store.add_resources({"round": round_})
            ids = [
                store.enqueue_rollout(t, resources_id=resources.resources_id).rollout_id for t in context.train_tasks
            ]
            done = store.wait_for_rollouts(ids, timeout=20)
            means.append(sum(r.reward for r in done) / len(done))
        return {"means": means, "policy": context.policy, "initial": context.initial_resources}


def test_fit_runs_a_custom_algorithm():
    store = MemoryStore(watchdog_interval=None)

    def agent(task, resources):
        return task + resources.get("round").value

    trainer = Trainer(store, algorithm=TwoRounds(), runner_options=FAST, console=console())
    result = trainer.fit(agent, train_tasks=[1, 2], resources={"round": -1})
    assert result == {"means": [1.5, 2.5], "policy": None, "initial": {"round": -1}}
    assert [r.version for r in store.query_resources()] == [1, 2, 3]
    store.close()


# ---- wrong calls fail with what to do instead --------------------------------------------------------


@pytest.mark.parametrize(
    ("keyword", "hint"),
    [
        ("train_dataset", "use train_tasks="),
        ("val_dataset", "use val_tasks="),
        ("engine", "Trainer(policy=LocalPolicy(model_dir))"),
    ],
)
def test_fit_refuses_unknown_keywords_and_says_what_to_use(keyword, hint):
    """Once, ``fit(agent, train_dataset=…)`` silently ran with 0 tasks."""
    store = MemoryStore(watchdog_interval=None)
    trainer = Trainer(store, algorithm=TwoRounds(), runner_options=FAST, console=console())
    with pytest.raises(TypeError, match=re.escape(hint)) as caught:
        trainer.fit(agents_for_tests.reward_agent, **{keyword: [{"x": 1}]})
    assert repr(keyword) in str(caught.value) and "fit(agent, train_tasks=(), val_tasks=(), resources=None)" in str(
        caught.value
    )
    assert store.count_rollouts() == 0  # refused before anything ran
    with pytest.raises(TypeError, match="read_tasks"):
        trainer.fit(agents_for_tests.reward_agent, "train.jsonl")
    store.close()


def test_invalid_trainer_options():
    with pytest.raises(ValueError, match="n_runners"):
        Trainer(n_runners=-1)
    with pytest.raises(ValueError, match="concurrency"):
        Trainer(concurrency=0)


# ---- dead runners end the wait, with the reason ---------------------------------------------------------


def test_runner_processes_that_die_at_start_fail_dev_fast_with_the_reason():
    """The pool's processes die while unpickling the agent (its module refuses to import there):
    ``dev()`` without a timeout used to wait forever; now it fails within seconds, naming the exit
    code and the spawn start method's usual cause."""
    import agent_dies_in_runner

    store = MemoryStore(watchdog_interval=None)
    trainer = Trainer(store, n_runners=2, runner_options=FAST, console=console())
    started = time.monotonic()
    with pytest.raises(RunnerDiedError) as caught:
        trainer.dev(agent_dies_in_runner.agent, [{"x": 1}, {"x": 2}], print_summary=False)
    assert time.monotonic() - started < 30
    message = str(caught.value)
    assert "exited with code 1 while starting" in message and 'if __name__ == "__main__":' in message
    assert "spawn" in message
    store.close()


def test_a_script_without_a_main_guard_fails_with_the_hint_instead_of_hanging(tmp_path):
    """The new user's script: Trainer(n_runners=2) at module level, no ``if __name__ == "__main__":``.
    Each runner process re-runs the script and refuses the nested start; the parent says why."""
    script = tmp_path / "train_no_guard.py"
    script.write_text(
        "import agents_for_tests\n"
        "from agentgrad.trainer import Trainer\n"
        "Trainer(n_runners=2).dev(agents_for_tests.reward_agent, [{'x': 1}, {'x': 2}], print_summary=False)\n"
        "print('finished')\n"
    )
    support = Path(__file__).parent / "support"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(support), os.environ.get("PYTHONPATH")]))}
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path
    )
    assert time.monotonic() - started < 90
    assert result.returncode != 0 and "finished" not in result.stdout
    assert "RunnerDiedError" in result.stderr and "exited with code 1 while starting" in result.stderr
    assert "Trainer.dev() was called while a runner process imported the main script" in result.stderr  # a child's
    assert 'if __name__ == "__main__":' in result.stderr


# ---- n_runners=0: runners are started elsewhere ---------------------------------------------------------


def test_fit_with_no_runners_of_its_own_uses_runners_started_elsewhere():
    store = MemoryStore(watchdog_interval=None)
    out = console()

    def agent(task, resources):
        return task + resources.get("round").value

    elsewhere = Runner(agent, store, **FAST)  # e.g. `agentgrad runner` against the same store
    thread = threading.Thread(target=elsewhere.run, daemon=True)
    thread.start()
    try:
        trainer = Trainer(store, n_runners=0, algorithm=TwoRounds(), console=out)
        result = trainer.fit(agent, train_tasks=[1, 2], resources={"round": -1})
    finally:
        elsewhere.stop()
        thread.join(10)
    assert result["means"] == [1.5, 2.5]
    assert elsewhere.stats.succeeded == 4
    assert "n_runners=0" in out.file.getvalue() and "agentgrad runner" in out.file.getvalue()
    store.close()


def test_the_runner_command_printed_for_n_runners_0_names_a_custom_llm_resource():
    store, out = MemoryStore(watchdog_interval=None), console()
    trainer = Trainer(store, n_runners=0, llm_resource="main_llm", console=out)
    trainer._announce_external_runners(as_agent(lambda task: 1.0), "http://127.0.0.1:8400")
    assert "agentgrad runner MODULE:AGENT --store" in out.file.getvalue()  # a lambda has no name to load
    assert "--proxy http://127.0.0.1:8400 --llm-resource main_llm" in out.file.getvalue()
    trainer._announce_external_runners(agents_for_tests.reward_agent, "http://127.0.0.1:8400")
    assert "agentgrad runner agents_for_tests:reward_agent --store" in out.file.getvalue()
    store.close()


def test_a_run_written_to_a_log_keeps_each_line_whole(capsys):
    """Written to a file or pipe, rich wraps at 80 columns; the Trainer's own console (and
    every run's: ``run_console``) does not, so a path or a step's metrics stay on one line."""
    store = MemoryStore(watchdog_interval=None)
    line = "training my_agent on " + "/a/rather/long/path" * 6 + " · 200 train / 32 val / 64 test tasks"
    Trainer(store, n_runners=0).console.print(line)
    assert capsys.readouterr().out == line + "\n"
    store.close()


def test_an_agent_whose_framework_is_missing_here_is_left_to_runners_elsewhere(monkeypatch, tmp_path, capsys):
    """``agentgrad train --runners 0`` on a machine without the agent's framework (CrewAI in its
    own environment, say): the trainer goes on with the agent's name, and the runner command it
    prints names the agent; with runners of its own it refuses, naming the missing module."""
    import argparse

    from agentgrad.agents import ServedElsewhere, agent_spec, load_agent
    from agentgrad.cli.train import _load_agent
    from agentgrad.errors import AgentImportError

    (tmp_path / "crew_like.py").write_text("import framework_not_installed\n\n\ndef crew(task, llm):\n    return 1.0\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(AgentImportError, match="framework_not_installed"):
        load_agent("crew_like:crew")
    args = argparse.Namespace(agent="crew_like:crew", runners=2, device=None, llm_resource=None)
    with pytest.raises(AgentImportError, match="framework_not_installed"):
        _load_agent(args)
    args.runners = 0
    agent = _load_agent(args)
    assert isinstance(agent, ServedElsewhere) and agent.name == "crew" and args.llm_resource == "llm"
    assert "framework_not_installed" in capsys.readouterr().err
    assert agent_spec(agent) == "crew_like:crew"
    with pytest.raises(RuntimeError, match="runners started elsewhere"):
        agent.rollout({}, {}, None)  # type: ignore[arg-type]
    store, out = MemoryStore(watchdog_interval=None), console()
    Trainer(store, n_runners=0, console=out)._announce_external_runners(agent, "http://127.0.0.1:8400")
    assert "agentgrad runner crew_like:crew --store" in out.file.getvalue()
    store.close()


def test_agent_spec_names_what_load_agent_loads_back(monkeypatch, tmp_path):
    from agentgrad.agents import agent_spec, load_agent

    assert agent_spec(agents_for_tests.reward_agent) == "agents_for_tests:reward_agent"
    assert load_agent(agent_spec(agents_for_tests.reward_agent)).func is agents_for_tests.reward_agent.func

    def nested(task):
        return 1.0

    assert agent_spec(as_agent(nested)) is None  # defined inside a function: nothing to import
    assert agent_spec(agents_for_tests.EchoAgent()) is None  # an object: its arguments are unknown

    script = tmp_path / "train_me.py"  # a function of the script being run is named by its path
    script.write_text("def my_agent(task):\n    return 1.0\n")

    def my_agent(task):
        return 1.0

    my_agent.__module__, my_agent.__qualname__ = "__main__", "my_agent"
    monkeypatch.setattr(sys.modules["__main__"], "__file__", str(script), raising=False)  # none under xdist
    assert agent_spec(as_agent(my_agent)) == f"{script}:my_agent"
    assert load_agent(f"{script}:my_agent").func.__name__ == "my_agent"


def test_dev_names_llm_calls_that_did_not_ask_for_the_resources_temperature():
    """An agent that does not pass ``llm.sampling`` on to its client samples at its server's default
    (1): under a greedy evaluation or validation those calls are counted and the user told how to
    pass it. A resource that names no temperature is not checked."""
    import openai

    from agentgrad.proxy import LLMProxy
    from agentgrad.testing.stub import StubUpstream

    def agent(task, llm):
        client = openai.OpenAI(base_url=llm.endpoint, api_key="none", max_retries=0)
        asked = {"temperature": llm.sampling["temperature"]} if task["passes"] else {}
        client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": "hi"}], **asked)
        return 1.0

    store = MemoryStore(watchdog_interval=None)
    out = console()
    tasks = [{"passes": True}, {"passes": False}, {"passes": False}]
    with StubUpstream(["ok"]) as upstream, LLMProxy(store, f"http://127.0.0.1:{upstream.port}/v1") as proxy:
        trainer = Trainer(store, proxy=proxy.url, runner_options=FAST, console=out)
        greedy = LLM(endpoint=f"http://127.0.0.1:{upstream.port}/v1", model="m", sampling={"temperature": 0.0})
        report = trainer.dev(agent, tasks, {"llm": greedy}, timeout=30)
        unchecked = trainer.dev(agent, tasks, {"llm": greedy.model_copy(update={"sampling": {}})}, timeout=30)
        default = trainer.dev(agent, tasks[1:], {"llm": greedy.model_copy(update={"sampling": {"temperature": 1}})})
    assert report.llm_calls_per_rollout == [1, 1, 1]
    assert report.temperature == 0.0 and report.calls_at_other_temperature == 2
    assert report.as_dict()["llm_calls_at_other_temperature"] == 2
    assert "2 of 3 LLM call(s) did not ask for the temperature of the agent's LLM resource (0)" in out.file.getvalue()
    assert unchecked.temperature is None and unchecked.temperature_warning() is None
    assert default.calls_at_other_temperature == 0  # none named is the server's default, 1
    store.close()


_SEEN_ENDPOINTS: list[str] = []  # the runner is a thread of this process (a task is a copy: it went through the store)


def _calls_its_llm(task: dict, llm: LLM) -> float:
    import openai

    client = openai.OpenAI(base_url=llm.endpoint, api_key=llm.api_key or "none", max_retries=0)
    reply = client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": "hi"}])
    _SEEN_ENDPOINTS.append(llm.endpoint)
    return 1.0 if reply.choices[0].message.content else 0.0


def test_dev_records_the_calls_to_the_resources_endpoint_through_a_proxy_it_starts(caplog):
    """Without a policy or a proxy the agent's calls to its endpoint were not recorded at all:
    ``dev`` reported 0 LLM calls, APO's critic read no conversation, and nothing could be trained."""
    from agentgrad.testing.stub import StubUpstream

    with StubUpstream(["5"]) as upstream, StubUpstream(["6"]) as judge:
        url = f"http://127.0.0.1:{upstream.port}/v1"
        store = MemoryStore(watchdog_interval=None)
        seen = _SEEN_ENDPOINTS
        seen.clear()
        agent = as_agent(_calls_its_llm)
        report = Trainer(store, runner_options=FAST, console=console()).dev(
            agent, [{}], {"llm": LLM(endpoint=url, model="m")}, timeout=30
        )
        assert report.succeeded == 1 and report.llm_calls_per_rollout == [1] and len(upstream.requests) == 1
        assert "/rollout/" in seen[0]  # the proxy's endpoint for the attempt, which the Trainer stopped after
        # capture=False: the endpoint as given, nothing recorded
        uncaptured = Trainer(store, runner_options=FAST, console=console(), capture=False).dev(
            agent, [{}], {"llm": LLM(endpoint=url, model="m")}, timeout=30
        )
        assert uncaptured.llm_calls_per_rollout == [0] and seen[1] == url
        # two endpoints: which one to record is the user's choice; a warning says so
        two = {
            "llm": LLM(endpoint=url, model="m"),
            "judge": LLM(endpoint=f"http://127.0.0.1:{judge.port}/v1", model="j"),
        }
        with caplog.at_level("WARNING", logger="agentgrad.trainer"):
            Trainer(store, runner_options=FAST, console=console()).dev(agent, [{}], two, timeout=30)
        assert seen[2] == url and "name several LLM endpoints" in caplog.text
        store.close()
