"""``agentgrad train`` and ``agentgrad eval`` end to end: real runner processes, engine, proxy and a
SQLite store, on a random tiny model (a few steps: the learning itself is measured in docs/training.md)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from agentgrad_command import ENV
from agentgrad_command import agentgrad as run_agentgrad

pytest.importorskip("torch")


def agentgrad(*args: str, cwd: Path, timeout: float = 280) -> subprocess.CompletedProcess:
    return run_agentgrad(*args, cwd=cwd, timeout=timeout)  # a training run takes minutes


@pytest.fixture
def tasks(tmp_path: Path) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"question": f"say {i}", "max_chars": 12}) + "\n" for i in range(8)))
    return path


def test_train_runs_exports_and_records_its_config(tmp_path: Path, tasks: Path, tiny_model_dir: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("batch_size: 2\ngroup_size: 4\ntrain:\n  lr: 0.001\n")
    out = tmp_path / "run"
    done = agentgrad(
        "train",
        "train_agents:short_answer_agent",
        "--model",
        str(tiny_model_dir),
        "--tasks",
        str(tasks),
        "--val",
        str(tasks),
        "--test",
        str(tasks),
        "--config",
        str(config),
        "--steps",
        "2",
        "--val-every",
        "1",
        "--output-dir",
        str(out),
        "--runners",
        "1",
        "--concurrency",
        "8",
        "--device",
        "cpu",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    recorded = (out / "config.yaml").read_text()
    assert "steps: 2" in recorded and "batch_size: 2" in recorded and "lr: 0.001" in recorded  # file < flags
    assert "\n  device: cpu\n" in recorded  # --device cpu keeps the trainer off a GPU too (train.device auto)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 and [step for step, _ in summary["validation"]][0] == 0
    assert (out / "model" / "config.json").is_file() and (out / "best" / "config.json").is_file()
    assert "agentgrad serve-model" in done.stdout
    # in a log, a step's line comes before the validation that follows it
    assert done.stdout.index("GRPO step 1/2") < done.stdout.index("at step 1: ") < done.stdout.index("GRPO step 2/2")
    assert (out / "reward_curve.png").stat().st_size > 1000 and summary["reward_curve"] == str(out / "reward_curve.png")
    # --test: the start model before training, the exported final and best models after, each on all 8 tasks
    assert set(summary["test"]) == {"start", "final", "best"} and all(0 <= v <= 1 for v in summary["test"].values())
    assert "greedy test on 8 held-out tasks" in done.stdout
    assert f"greedy validation on 8 tasks: {summary['validation'][0][1]:.3f} → " in done.stdout
    assert f"(best {summary['best_score']:.3f} at step {summary['best_step']})" in done.stdout
    assert_test_rollouts(out / "store.sqlite", {"start": 8, "final": 8, "best": 8})

    scored = agentgrad(
        "eval",
        "train_agents:short_answer_agent",
        "--model",
        str(out),
        "--tasks",
        str(tasks),
        "--runners",
        "1",
        "--engine-dtype",
        "bfloat16",
        "--json",
        cwd=tmp_path,
    )  # a run directory: exported, then served (by an engine in bf16)
    assert scored.returncode in (0, 1), scored.stdout + scored.stderr
    report = json.loads(scored.stdout.strip().splitlines()[-1])
    assert report["total"] == 8 and report["llm_calls_per_rollout"] == 1.0
    assert 0 <= report["score"] <= 1 and "AgentGrad evaluation" in scored.stdout and "dev run" not in scored.stdout


def assert_test_rollouts(store_path: Path, expected: dict[str, int]) -> None:
    """The store holds, for each --test evaluation, that many rollouts in mode "test", recorded
    as the evaluation run ``<run_id>-test-<label>``."""
    from agentgrad.store import open_store
    from agentgrad.store.protocol import RolloutFilter

    store = open_store(f"sqlite://{store_path}")
    try:
        tested = store.query_rollouts(RolloutFilter(mode="test"))
        assert len(tested) == sum(expected.values()), len(tested)
        runs = {m.run_id for m in store.query_metrics()}
        assert {label for label in expected if any(r.endswith(f"-test-{label}") for r in runs)} == set(expected), runs
    finally:
        store.close()


def test_train_with_nothing_to_train_on_exits_nonzero_and_says_why(
    tmp_path: Path, tasks: Path, tiny_model_dir: Path
) -> None:
    done = agentgrad(
        "train",
        "train_agents:no_llm_agent",
        "--model",
        str(tiny_model_dir),
        "--tasks",
        str(tasks),
        "--steps",
        "1",
        "--batch-size",
        "2",
        "--group-size",
        "2",
        "--max-empty-retries",
        "0",
        "--output-dir",
        str(tmp_path / "run"),
        "--runners",
        "1",
        cwd=tmp_path,
    )
    assert done.returncode == 1
    assert "no usable LLM call" in done.stdout + done.stderr


def refused_train(tmp_path: Path, model: Path, tasks: Path, *flags: str) -> subprocess.CompletedProcess:
    """``agentgrad train`` with ``flags``, which must exit 1 before writing its output directory."""
    done = agentgrad(
        "train",
        "train_agents:short_answer_agent",
        "--model",
        str(model),
        "--tasks",
        str(tasks),
        *flags,
        "--output-dir",
        str(tmp_path / "run"),
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 1
    assert not (tmp_path / "run").exists()
    return done


def test_train_refuses_bad_input_before_starting(tmp_path: Path, tasks: Path, tiny_model_dir: Path) -> None:
    def refused(*flags: str, model: Path = tiny_model_dir) -> subprocess.CompletedProcess:
        return refused_train(tmp_path, model, tasks, *flags)

    bad = tmp_path / "bad.yaml"
    bad.write_text("batch_sise: 2\n")
    config = refused("--config", str(bad))
    assert "batch_sise" in config.stderr and "batch_size" in config.stderr
    assert "nope" in refused(model=tmp_path / "nope").stderr
    remote_test = refused("--test", str(tasks), "--upstream", "http://127.0.0.1:9/v1")
    assert "--test" in remote_test.stderr and "agentgrad eval" in remote_test.stderr
    remote_swap = refused("--lora-hot-swap", "--backend", "tinker", "--tinker-url", "http://127.0.0.1:9")
    assert "--lora-hot-swap" in remote_swap.stderr
    remote_dtype = refused("--engine-dtype", "bfloat16", "--upstream", "http://127.0.0.1:9/v1")
    assert "--engine-dtype" in remote_dtype.stderr
    remote_cache = refused("--prefix-cache-mb", "64", "--backend", "tinker", "--tinker-url", "http://127.0.0.1:9")
    assert "--prefix-cache-mb need" in remote_cache.stderr


def test_train_algorithm_sft_trains_on_kept_rollouts_validates_and_exports(
    tmp_path: Path, tasks: Path, tiny_model_dir: Path
) -> None:
    config = tmp_path / "sft.yaml"
    config.write_text("iterations: 2\nmin_reward: 0\nsamples_per_task: 2\nbatch_size: 4\n")
    out = tmp_path / "sft"
    done = agentgrad(
        "train",
        "train_agents:short_answer_agent",
        "--algorithm",
        "sft",
        "--model",
        str(tiny_model_dir),
        "--tasks",
        str(tasks),
        "--val",
        str(tasks),
        "--test",
        str(tasks),
        "--config",
        str(config),
        "--steps",
        "1",
        "--train.lr",
        "0.001",
        "--output-dir",
        str(out),
        "--runners",
        "1",
        "--concurrency",
        "8",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["algorithm"] == "sft" and summary["iterations"] == 2 and summary["steps"] == 2
    assert summary["samples"][0] == 16  # 8 tasks × 2 samples, every reward kept (min_reward 0)
    assert [iteration for iteration, _ in summary["validation"]] == [0, 1, 2]  # before, then after each
    assert f"greedy validation on 8 tasks: {summary['validation'][0][1]:.3f} → " in done.stdout
    assert "after iteration" in done.stdout
    recorded = (out / "config.yaml").read_text()  # SFTConfig's settings: file < flags
    assert "iterations: 2" in recorded and "samples_per_task: 2" in recorded and "lr: 0.001" in recorded
    assert "group_size" not in recorded
    assert "\n  device: auto\n" in recorded  # no --device: the trainer takes a GPU where there is one
    assert (out / "model" / "config.json").is_file() and (out / "best" / "config.json").is_file()
    assert summary["best_model"] == str(out / "best") and "agentgrad serve-model" in done.stdout
    assert set(summary["test"]) == {"start", "final", "best"}
    assert_test_rollouts(out / "store.sqlite", {"start": 8, "final": 8, "best": 8})


def test_train_refuses_the_other_algorithms_settings(tmp_path: Path, tasks: Path, tiny_model_dir: Path) -> None:
    grpo_flag = agentgrad(
        "train",
        "train_agents:short_answer_agent",
        "--algorithm",
        "sft",
        "--model",
        str(tiny_model_dir),
        "--tasks",
        str(tasks),
        "--group-size",
        "2",
        "--output-dir",
        str(tmp_path / "a"),
        cwd=tmp_path,
        timeout=60,
    )
    assert grpo_flag.returncode == 1 and "--group-size" in grpo_flag.stderr and "SFTConfig" in grpo_flag.stderr
    sft_flag = agentgrad(
        "train",
        "train_agents:short_answer_agent",
        "--model",
        str(tiny_model_dir),
        "--tasks",
        str(tasks),
        "--iterations",
        "2",
        "--output-dir",
        str(tmp_path / "b"),
        cwd=tmp_path,
        timeout=60,
    )
    assert sft_flag.returncode == 1 and "--iterations" in sft_flag.stderr and "GRPOConfig" in sft_flag.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_train_algorithm_evaluate_is_eval_on_the_local_model(tmp_path: Path, tasks: Path, tiny_model_dir: Path) -> None:
    done = agentgrad(
        "train",
        "train_agents:short_answer_agent",
        "--algorithm",
        "evaluate",
        "--model",
        str(tiny_model_dir),
        "--tasks",
        str(tasks),
        "--runners",
        "1",
        "--llm-resource",
        "main_llm",
        cwd=tmp_path,
    )
    assert done.returncode in (0, 1), done.stdout + done.stderr
    assert re.search(r"total\s*│\s*8\b", done.stdout) and re.search(r"llm calls per rollout\s*│\s*1\b", done.stdout)
    assert "Traceback" not in done.stderr and not (tmp_path / "runs").exists()  # no GRPO output directory


def test_train_algorithm_apo_points_to_agentgrad_apo(tmp_path: Path, tasks: Path, tiny_model_dir: Path) -> None:
    done = refused_train(tmp_path, tiny_model_dir, tasks, "--algorithm", "apo")
    assert "agentgrad apo" in done.stderr and "critic" in done.stderr


def test_train_publishes_to_a_model_server_started_elsewhere(tmp_path: Path, tasks: Path, tiny_model_dir: Path) -> None:
    from agentgrad.inference.engine import Engine
    from agentgrad.inference.server import ModelServer

    engine = Engine(tiny_model_dir, max_batch_size=16)
    with ModelServer(engine) as server:  # as `agentgrad serve-model DIR` would serve it
        before = engine.model_version
        out = tmp_path / "run"
        done = agentgrad(
            "train",
            "train_agents:parity_agent",
            "--model",
            str(tiny_model_dir),
            "--tasks",
            str(tasks),
            "--upstream",
            server.base_url,
            "--steps",
            "2",
            "--batch-size",
            "2",
            "--group-size",
            "8",
            "--train.lr",
            "0.001",
            "--output-dir",
            str(out),
            "--runners",
            "1",
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert json.loads((out / "summary.json").read_text())["steps"] == 2
        # every step that trained was published to the server, which serves it now
        assert engine.model_version != before and (out / "published" / engine.model_version).is_dir()
    engine.close()

    refused = agentgrad(
        "train",
        "train_agents:short_answer_agent",
        "--model",
        str(tiny_model_dir),
        "--tasks",
        str(tasks),
        "--upstream",
        "http://127.0.0.1:9",
        "--output-dir",
        str(tmp_path / "r2"),
        cwd=tmp_path,
        timeout=60,
    )
    assert refused.returncode == 1 and "--upstream http://127.0.0.1:9" in refused.stderr + refused.stdout


def test_a_cpu_run_on_a_sizeable_model_is_pointed_at_the_bf16_switches(tmp_path: Path, monkeypatch) -> None:
    """The hint appears for a local CPU run on a model with 20 MB of weights or more when the CPU
    multiplies bf16 natively and neither switch is set; not otherwise."""
    import argparse

    import agentgrad.training.policy as policy
    from agentgrad.cli.train import _bf16_hint
    from agentgrad.training import TrainConfig

    model = tmp_path / "model"
    model.mkdir()
    with (model / "model.safetensors").open("wb") as weights:
        weights.truncate(21 * 2**20)  # sparse: only its size counts
    args = argparse.Namespace(backend="local", upstream=None, engine_dtype=None, device="cpu")
    train = TrainConfig(device="cpu")
    monkeypatch.setattr(policy, "native_cpu_bf16", lambda: True)
    hint = _bf16_hint(args, train, model)
    assert hint is not None and "--engine-dtype bfloat16 --train.autocast bfloat16" in hint
    assert _bf16_hint(argparse.Namespace(**{**vars(args), "engine_dtype": "float32"}), train, model) is None
    assert _bf16_hint(args, TrainConfig(device="cpu", autocast="bfloat16"), model) is None
    assert _bf16_hint(argparse.Namespace(**{**vars(args), "backend": "tinker"}), train, model) is None
    assert _bf16_hint(args, TrainConfig(device="cuda"), model) is None  # the trainer is not on the CPU
    monkeypatch.setattr(policy, "native_cpu_bf16", lambda: False)
    assert _bf16_hint(args, train, model) is None
    monkeypatch.setattr(policy, "native_cpu_bf16", lambda: True)
    with (model / "model.safetensors").open("wb") as weights:
        weights.truncate(3 * 2**20)  # the tiny models' size
    assert _bf16_hint(args, train, model) is None


def test_a_run_stopped_by_sigterm_keeps_its_last_step_and_resumes_from_it(
    tmp_path: Path, tasks: Path, tiny_model_dir: Path
) -> None:
    """SIGTERM (a scheduler's stop, ``timeout``, ``docker stop``) once killed the trainer where it
    stood: no cleanup, no word, and every step since the last periodic checkpoint lost."""
    out = tmp_path / "run"
    command = [
        *("train", "train_agents:short_answer_agent", "--model", str(tiny_model_dir), "--tasks", str(tasks)),
        *("--val", str(tasks), "--val-every", "0", "--batch-size", "2", "--group-size", "4", "--runners", "1"),
        *("--checkpoint-every", "100", "--output-dir", str(out), "--device", "cpu"),
    ]
    process = subprocess.Popen(
        [sys.executable, "-m", "agentgrad", *command, "--steps", "200"],
        cwd=tmp_path,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    for line in process.stdout:  # type: ignore[union-attr]
        lines.append(line)
        if line.startswith("GRPO step 2/200"):
            process.send_signal(signal.SIGTERM)
            break
    rest, _ = process.communicate(timeout=120)
    output = "".join(lines) + rest
    assert process.returncode == 130, output
    stopped = re.search(r"interrupted after step (\d+) of 200; its checkpoint is in (\S+): the same command", output)
    assert stopped, output
    step = int(stopped[1])
    assert step >= 2 and (out / "checkpoints" / f"step-{step:06d}").is_dir()  # not a periodic one: every 100

    resumed = agentgrad(*command, "--steps", str(step + 1), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resumed from step {step}" in resumed.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert [s for s, _ in summary["validation"]] == [0, step + 1]  # the run's start, from before the stop
