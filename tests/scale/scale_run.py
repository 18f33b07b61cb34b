"""What ``make test-scale`` and ``bench/bench_tinker.py`` share: the tiny model's Qwen3 twin, a
fresh SkyRL Tinker server on 127.0.0.1, one short GRPO run of the calculator agent on either
backend, and that run's step times split by phase.

One GRPO configuration for both backends, so the timings compare the backends and nothing else.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SERVER_PROJECT = REPO / "scripts" / "skyrl-server"
#: A Qwen3 model directory to train instead of the tiny twin (the twin is then neither built nor
#: rebuilt: a run can go on while the tiny recipe changes under it).
MODEL_ENV = "AGENTGRAD_SCALE_MODEL"
#: The JAX backend compiles once per input shape, and without these settings a shape is the
#: number of sequences a call happens to batch: every new batch size of ``sample`` (the concurrent
#: rollouts' calls the server gathered) and of ``forward_backward`` (the step's kept samples)
#: recompiled, ~10 s each on this CPU, in every step. Sampling batches padded to 16 sequences and
#: training micro-batches of one sequence leave the (bucketed) sequence length as the only shape,
#: compiled once per run; the gradient is the same (SkyRL sums per-sequence means over micro-batches
#: and divides by the sequence count).
BACKEND_CONFIG = {"sample_max_num_sequences": 16, "train_micro_batch_size": 1}
#: What the runs are, for the timing records.
DESCRIPTION = {
    "batch": "4 tasks x 4 rollouts",
    "train": "LoRA r=8, lr 5e-3, one update per step",
    "server": f"SkyRL 0.3.0 Tinker API (tinker 0.24.1 client), JAX backend, CPU, {BACKEND_CONFIG}",
}


def qwen3_twin() -> Path:
    """The model the scale runs train: ``$AGENTGRAD_SCALE_MODEL``, else the tiny calculator model
    in its Qwen3 form (SkyRL's JAX models have no Qwen2), cached beside the default tiny model
    and built (minutes) when missing or built by another recipe format (``BUILD_FORMAT``)."""
    from agentgrad.demo.tiny import BUILD_FORMAT, build_tiny_model
    from agentgrad.models.cache import models_cache_dir

    if os.environ.get(MODEL_ENV):
        path = Path(os.environ[MODEL_ENV]).expanduser().resolve()
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"${MODEL_ENV}={path} is not a model directory (no config.json)")
        return path
    path = models_cache_dir() / "tiny-calc-qwen3"
    build = path / "agentgrad_build.json"
    if not (build.is_file() and json.loads(build.read_text()).get("format") == BUILD_FORMAT):
        build_tiny_model(path, architecture="qwen3")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def skyrl_server(model_dir: Path, workdir: Path, *, timeout: float = 300.0) -> Iterator[str]:
    """A fresh SkyRL Tinker server on 127.0.0.1 serving ``model_dir`` (JAX backend, its checkpoints,
    database and log ``skyrl-server.log`` under ``workdir``); yields its root URL once it answers.
    Fresh each time: a server keeps a LoRA slot until its session's heartbeat times out."""
    uv = REPO / ".venv" / "bin" / "uv"
    if not (SERVER_PROJECT / ".venv").is_dir() or not uv.exists():
        raise RuntimeError(
            "the SkyRL server environment is missing: run scripts/setup_scale_env.sh (make test-scale does)"
        )
    workdir.mkdir(parents=True, exist_ok=True)
    port, log_path = _free_port(), workdir / "skyrl-server.log"
    command = [
        str(uv),
        "run",
        "--no-sync",
        "--extra",
        "tinker",
        "--extra",
        "jax",
        "-m",
        "skyrl.tinker.api",
        "--base-model",
        str(model_dir),
        "--backend",
        "jax",
        "--backend-config",
        json.dumps(BACKEND_CONFIG),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--checkpoints-base",
        str(workdir / "checkpoints"),
        "--database-url",
        f"sqlite:///{workdir / 'tinker.db'}",
    ]
    env = {**os.environ, "PATH": f"{uv.parent}:{os.environ['PATH']}"}  # the server spawns its engine with `uv run`
    with log_path.open("w") as log:
        process = subprocess.Popen(
            command, cwd=SERVER_PROJECT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_until_serving(url, process, log_path, timeout)
            yield url
        finally:
            os.killpg(process.pid, signal.SIGTERM)  # the server and the engine it spawned, by our own group id
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def _wait_until_serving(url: str, process: subprocess.Popen, log: Path, timeout: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the SkyRL server exited ({process.returncode}):\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/api/v1/healthz", timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise RuntimeError(f"the SkyRL server did not answer within {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def grpo_run(policy: Any, model_dir: Path, out: Path, *, steps: int, seed: int = 3) -> tuple[Any, Any, float]:
    """GRPO of the calculator agent on ``policy`` (a ``LocalPolicy`` or a ``TinkerPolicy``) for
    ``steps`` steps, with a SQLite store in ``out``; returns (result, store, seconds)."""
    from agentgrad.algorithms.grpo import GRPO, GRPOConfig
    from agentgrad.demo.agent import calc_agent, train_tasks, val_tasks
    from agentgrad.store import open_store
    from agentgrad.trainer import Trainer
    from agentgrad.training.policy import LoraSettings, TrainConfig

    config = GRPOConfig(
        steps=steps,
        batch_size=4,
        group_size=4,
        val_every=0,
        checkpoint_every=2,
        output_dir=out,
        sampling={"temperature": 1.0, "max_tokens": 48},
        train=TrainConfig(lr=5e-3, lora=LoraSettings(r=8)),
    )
    out.mkdir(parents=True, exist_ok=True)
    store = open_store(f"sqlite:///{out / 'store.sqlite'}")
    started = time.monotonic()
    with policy.serving(store):
        result = Trainer(store, algorithm=GRPO(model_dir, config), policy=policy, n_runners=1, concurrency=16).fit(
            calc_agent, train_tasks(64, seed=seed), val_tasks(16)
        )
    return result, store, time.monotonic() - started


def trained_steps(out: Path) -> list[dict[str, float]]:
    """The run's ``metrics.jsonl`` rows of steps that made an update."""
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]


PHASES = ("rollout", "update", "publish", "step")


def step_phases(row: dict[str, float]) -> dict[str, float]:
    """One step's seconds by phase: the rollouts, the update (``forward_backward`` + ``optim_step``,
    or the local optimizer step), publishing the new weights to the sampler (the step's train time
    minus the update), and the whole step (with the adapter, advantages and any checkpoint)."""
    update = row["tokens"] / row["tokens_per_second"]
    return {
        "rollout": row["rollout_seconds"],
        "update": update,
        "publish": row["train_seconds"] - update,
        "step": row["step_seconds"],
    }


def phases(rows: list[dict[str, float]]) -> dict[str, Any]:
    """Cold (the first trained step: on the JAX server it compiles) and warm (the median of the
    later ones) seconds per phase."""
    per_step = [step_phases(r) for r in rows]
    warm = per_step[1:]
    return {
        "cold": per_step[0],
        "warm": {p: statistics.median(s[p] for s in warm) for p in PHASES} if warm else None,
        "steps_trained": len(rows),
    }
