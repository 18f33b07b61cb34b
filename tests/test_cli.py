"""The ``agentgrad`` command line, run as ``python -m agentgrad`` in subprocesses."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
from agentgrad_command import ENV, agentgrad

from agentgrad import __version__
from agentgrad.store.sqlite import SqliteStore
from agentgrad.types import JsonResource, RolloutStatus


@pytest.fixture
def tasks_file(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"x": x}) + "\n" for x in range(4)) + "\n")
    return path


def test_help_and_version():
    result = agentgrad("--help")
    assert result.returncode == 0
    for command in ("version", "dev", "runner", "rollouts"):
        assert command in result.stdout
    version = agentgrad("version")
    assert version.returncode == 0 and version.stdout.strip() == f"agentgrad {__version__}"
    bare = agentgrad()
    assert bare.returncode == 2 and "usage" in bare.stdout


def test_dev_then_inspect_rollouts(tmp_path, tasks_file):
    db = tmp_path / "cli.db"
    url = f"sqlite://{db}"
    result = agentgrad(
        "dev",
        "agents_for_tests:reward_agent",
        "--tasks",
        str(tasks_file),
        "--store",
        url,
        "--json",
        "--timeout",
        "30",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["total"] == summary["succeeded"] == 4 and summary["failed"] == 0
    assert summary["reward_mean"] == summary["score"] == pytest.approx(0.15)
    assert summary["rollouts_without_llm_calls"] == 4
    assert "AgentGrad dev run" in result.stdout and "captured no LLM call" in result.stdout

    listing = agentgrad("rollouts", "list", "--store", url, "--json")
    assert listing.returncode == 0, listing.stderr
    rollouts = json.loads(listing.stdout)
    assert len(rollouts) == 4 and {r["status"] for r in rollouts} == {"succeeded"}
    table = agentgrad("rollouts", "list", "--store", url)
    assert table.returncode == 0 and "of 4" in table.stdout and rollouts[0]["rollout_id"] in table.stdout

    shown = agentgrad("rollouts", "show", rollouts[0]["rollout_id"], "--store", url)
    assert shown.returncode == 0, shown.stderr
    header, *rest = shown.stdout.splitlines()
    reward = f"{rollouts[0]['reward']:.4g}"
    assert header.startswith(f"rollout {rollouts[0]['rollout_id']} · succeeded · train · reward {reward} · ")
    assert any(line.startswith("  agentgrad.message task {") for line in rest), rest
    assert rest[-1] == f"reward {reward}"
    raw = agentgrad("rollouts", "show", rollouts[0]["rollout_id"], "--store", url, "--json")
    assert raw.returncode == 0, raw.stderr
    detail = json.loads(raw.stdout)
    assert detail["rollout"]["rollout_id"] == rollouts[0]["rollout_id"]
    assert [a["status"] for a in detail["attempts"]] == ["succeeded"]
    assert [s["name"] for s in detail["spans"]] == ["agentgrad.message", "agentgrad.reward"]

    missing = agentgrad("rollouts", "show", "ro-nope", "--store", url)
    assert missing.returncode == 1 and "ro-nope" in missing.stderr and "Traceback" not in missing.stderr


def test_reading_commands_refuse_a_store_file_that_is_not_there(tmp_path):
    """A mistyped path (or ``sqlite:///runs/x.db`` meant as relative) names the file looked for,
    instead of creating an empty store that lists "0 of 0"; nothing is created."""
    commands = (("rollouts", "list"), ("rollouts", "show", "ro-1"), ("export", "--output", "o.jsonl"), ("dashboard",))
    for command in commands:
        for url in ("runs/missing.db", f"sqlite://{tmp_path}/missing.db"):
            result = agentgrad(*command, "--store", url, cwd=tmp_path)
            assert result.returncode == 1, (command, url, result.stdout)
            assert (
                f"no store at {url}: there is no file {tmp_path}/" in result.stderr and "Traceback" not in result.stderr
            )
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_dev_failures_exit_nonzero(tmp_path):
    tasks = tmp_path / "tasks.json"
    tasks.write_text(json.dumps([{"x": 1, "fail": True}]))  # a JSON array works too
    result = agentgrad("dev", "agents_for_tests:failing_agent", "--tasks", str(tasks), "--timeout", "30")
    assert result.returncode == 1
    assert "ValueError: bad task 1" in result.stdout


@pytest.mark.parametrize(
    ("agent_spec", "tasks_text", "needle"),
    [
        ("agents_for_tests:reward_agent", '{"x": 1}\n{"x": \n', "tasks.jsonl:2: not JSON"),
        ("agents_for_tests:reward_agent", "[1, 2", "not JSON"),
        ("agents_for_tests:reward_agent", None, "cannot read tasks file"),
        ("agents_for_tests", '{"x": 1}\n', "module:attribute"),
        ("no_such_module_xyz:agent", '{"x": 1}\n', "cannot import 'no_such_module_xyz'"),
        ("agents_for_tests:missing", '{"x": 1}\n', "has no attribute 'missing'"),
        ("agents_for_tests:not_an_agent", '{"x": 1}\n', "not an agent"),
        ("agents_for_tests:bad_signature", '{"x": 1}\n', "temperature"),
    ],
    ids=[
        "bad-jsonl-line",
        "bad-json-array",
        "missing-file",
        "no-colon",
        "no-module",
        "no-attribute",
        "not-an-agent",
        "bad-signature",
    ],
)
def test_dev_bad_input_gets_a_clear_message(tmp_path, agent_spec, tasks_text, needle):
    tasks = tmp_path / "tasks.jsonl"
    if tasks_text is not None:
        tasks.write_text(tasks_text)
    result = agentgrad("dev", agent_spec, "--tasks", str(tasks), "--timeout", "10")
    assert result.returncode != 0
    assert needle in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_runner_command_serves_until_sigterm(tmp_path):
    db = tmp_path / "runner.db"
    store = SqliteStore(db, watchdog_interval=None)
    ids = [store.enqueue_rollout({"x": x}).rollout_id for x in range(3)]
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentgrad",
            "runner",
            "agents_for_tests:reward_agent",
            "--store",
            f"sqlite://{db}",
            "--worker-id",
            "cli-runner",
        ],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        done = store.wait_for_rollouts(ids, timeout=30)
        assert [r.status for r in done] == [RolloutStatus.SUCCEEDED] * 3
        time.sleep(0.2)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err
    assert "taking rollouts from" in out and "runner stopped: 3 succeeded, 0 failed, 0 handed back" in out
    (worker,) = store.query_workers()
    assert worker.worker_id == "cli-runner" and worker.status == "stopped"
    store.close()


def test_runner_command_shares_the_default_tls_context_of_the_agents_clients(tmp_path):
    db = tmp_path / "tls.db"
    store = SqliteStore(db, watchdog_interval=None)
    rollout = store.enqueue_rollout({"x": 1})
    result = subprocess.run(
        [sys.executable, "-m", "agentgrad", "runner", "agents_for_runner_start:tls_agent"]
        + ["--store", f"sqlite://{db}", "--max-rollouts", "1"],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert store.get_rollout(rollout.rollout_id).reward == 1.0
    store.close()


def test_dev_with_a_wrong_llm_endpoint_names_the_url(tasks_file):
    """Once, every rollout failed on a bare "APIConnectionError: Connection error."."""
    result = agentgrad(
        "dev",
        "llm_resource_agent:main_llm_agent",
        "--tasks",
        str(tasks_file),
        "--llm-endpoint",
        "http://127.0.0.1:9/v1",
        "--llm-resource",
        "main_llm",
        "--timeout",
        "30",
    )
    assert result.returncode == 1
    assert "--llm-endpoint http://127.0.0.1:9/v1: cannot reach it" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    bad = agentgrad("dev", "agents_for_tests:reward_agent", "--tasks", str(tasks_file), "--proxy", "localhost:8400")
    assert bad.returncode == 1 and "--proxy 'localhost:8400' is not an http:// or https:// URL" in bad.stderr
    alone = agentgrad("dev", "agents_for_tests:reward_agent", "--tasks", str(tasks_file), "--llm-resource", "x")
    assert (
        alone.returncode == 1 and "--llm-resource names the LLM resource of --llm-endpoint or --proxy" in alone.stderr
    )
    elsewhere = ("--llm-endpoint", "http://127.0.0.1:9/v1", "--model", "m", "--engine-dtype", "bfloat16")
    dtype = agentgrad("dev", "agents_for_tests:reward_agent", "--tasks", str(tasks_file), *elsewhere)
    assert dtype.returncode == 1 and "--engine-dtype sets up the engine a local --model runs on" in dtype.stderr
    cache = agentgrad(
        "dev", "agents_for_tests:reward_agent", "--tasks", str(tasks_file), *elsewhere[:4], "--no-prefix-caching"
    )
    assert cache.returncode == 1 and "--no-prefix-caching sets up the engine a local --model" in cache.stderr
    runner = agentgrad("runner", "agents_for_tests:reward_agent", "--store", "memory", "--llm-resource", "x")
    assert (
        runner.returncode == 1 and "--llm-resource names the LLM resource the runner points at --proxy" in runner.stderr
    )
    apo = agentgrad(
        "apo",
        "agents_for_tests:reward_agent",
        "--tasks",
        str(tasks_file),
        "--prompt",
        "p",
        "--critic-base-url",
        "http://127.0.0.1:9/v1",
        "--critic-model",
        "m",
        "--proxy",
        "localhost:8400",
    )
    assert apo.returncode == 1 and "--proxy 'localhost:8400' is not an http:// or https:// URL" in apo.stderr
    apo_alone = agentgrad(
        "apo",
        "agents_for_tests:reward_agent",
        "--tasks",
        str(tasks_file),
        "--prompt",
        "p",
        "--critic-base-url",
        "http://127.0.0.1:9/v1",
        "--critic-model",
        "m",
        "--llm-resource",
        "x",
    )
    assert apo_alone.returncode == 1 and "--llm-resource names the LLM resource" in apo_alone.stderr
    # a mistyped model name, once a traceback after a minute of trying to reach the Hugging Face hub
    sft = agentgrad("sft", "--store", "memory", "--model-dir", "tinyy", "--output", "out")
    assert sft.returncode == 1 and "model tinyy: the directory does not exist" in sft.stderr, sft.stderr


def test_dev_runs_the_agent_on_a_local_model(tmp_path, tiny_model_dir):
    """``dev --model DIR`` without an endpoint serves the model here behind the capture proxy, as
    ``train`` and ``eval`` do: every call is recorded with its token ids. (Once, ``--model`` there
    only named the model of an endpoint not given, and every rollout failed on "no LLM".) A
    ``--model`` that is no model is refused, naming it."""
    from agentgrad import semconv

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"question": f"say {i}", "max_chars": 12}) + "\n" for i in range(4)))
    db = tmp_path / "dev.db"
    common = ("--tasks", str(tasks), "--store", f"sqlite://{db}", "--temperature", "0", "--json")
    result = agentgrad("dev", "train_agents:short_answer_agent", "--model", str(tiny_model_dir), *common, timeout=120)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["succeeded"] == 4 and summary["llm_calls_per_rollout"] == 1.0, summary
    assert "Loading weights" not in result.stderr  # transformers' bars are off under the command line
    store = SqliteStore(db, watchdog_interval=None)
    try:
        rollouts = store.query_rollouts()
        assert len(rollouts) == 4
        for rollout in rollouts:
            (span,) = store.query_spans(rollout.rollout_id, name=semconv.SPAN_LLM_CALL)
            assert span.attributes[semconv.LLM_PROMPT_TOKEN_IDS] and span.attributes[semconv.LLM_COMPLETION_TOKEN_IDS]
    finally:
        store.close()
    missing = agentgrad("dev", "train_agents:short_answer_agent", "--model", str(tmp_path / "nope"), *common)
    assert missing.returncode == 1 and f"{tmp_path / 'nope'}" in missing.stderr and "does not exist" in missing.stderr
    assert "named models (tiny, tiny-sql, tiny-rag, smollm2)" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_dev_and_runner_capture_through_the_proxy(tmp_path, tasks_file):
    """``dev --proxy`` and ``runner --proxy``: each attempt's LLM resource (named by
    ``--llm-resource``) points through the capture proxy, and its calls are flushed into the store
    before the attempt is reported — no false "no captured LLM call"."""
    from agentgrad.proxy import LLMProxy
    from agentgrad.testing.stub import StubUpstream

    db = tmp_path / "proxied.db"
    store = SqliteStore(db, watchdog_interval=None)
    with (
        StubUpstream(["The answer is 5."]) as upstream,
        LLMProxy(store, f"http://127.0.0.1:{upstream.port}/v1") as proxy,
    ):
        result = agentgrad(
            "dev",
            "llm_resource_agent:main_llm_agent",
            "--tasks",
            str(tasks_file),
            "--store",
            f"sqlite://{db}",
            "--proxy",
            proxy.url,
            "--llm-resource",
            "main_llm",
            "--model",
            "stub",
            "--json",
            "--timeout",
            "60",
        )
        assert result.returncode == 0, result.stderr
        summary = json.loads(result.stdout.strip().splitlines()[-1])
        assert summary["succeeded"] == 4 and summary["rollouts_without_llm_calls"] == 0
        assert "captured no LLM call" not in result.stdout + result.stderr

        # One rollout on dev's resources (its main_llm is rewritten), one on resources without any LLM:
        # the runner adds one through the proxy, named by --llm-resource (not the default "llm").
        no_llm = store.add_resources({"note": JsonResource(value="no LLM here")})
        ids = [
            store.enqueue_rollout({"x": x}, resources_id=resources_id).rollout_id
            for x, resources_id in enumerate([store.get_latest_resources().resources_id, no_llm.resources_id])
        ]
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agentgrad",
                "runner",
                "llm_resource_agent:main_llm_agent",
                "--store",
                f"sqlite://{db}",
                "--proxy",
                proxy.url,
                "--llm-resource",
                "main_llm",
            ],
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            done = store.wait_for_rollouts(ids, timeout=60)
            process.send_signal(signal.SIGTERM)
            out, err = process.communicate(timeout=20)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert [r.status for r in done] == [RolloutStatus.SUCCEEDED] * 2, err
    assert f"LLM calls through the proxy {proxy.url}" in out
    assert "no captured LLM call" not in err
    for rollout_id in ids:  # stored before the attempt was reported: no waiting needed
        assert len(store.query_spans(rollout_id, name="agentgrad.llm.call")) == 1
    store.close()


@pytest.mark.parametrize(
    ("argv", "missing", "extra"),
    [
        (["store", "serve", "--backend", "memory", "--port", "0"], "fastapi", "server"),
        (["dashboard", "--store", "memory"], "fastapi", "server"),
        (["train", "agents_for_tests:reward_agent", "--model", "tiny", "--tasks", "t.jsonl"], "torch", "train"),
        (["demo", "--steps", "1"], "torch", "train"),
    ],
)
def test_a_command_without_its_extra_names_the_extra(tmp_path, argv, missing, extra):
    (tmp_path / "t.jsonl").write_text('{"x": 1}\n')
    code = (
        f"import sys; sys.modules[{missing!r}] = None\n"  # as on a core install: the import fails
        "from agentgrad.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *argv], cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1, done.stderr
    assert f"pip install 'agentgrad[{extra}]'" in done.stderr and "Traceback" not in done.stderr
