"""GRPO of the calculator agent trained through the Tinker API on a real SkyRL Tinker server.

The same agent code, store, runners, capture proxy and adapter as a local run; only the update
(``forward_backward`` + ``optim_step``) and the sampling (``sample`` of the newest published
sampler) happen on the server. The local backend runs the same task next to it for the timing
comparison, written to ``test-artifacts/scale/timings.json``.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest

pytest.importorskip("tinker")
pytest.importorskip("torch")

pytestmark = pytest.mark.scale

REPO = Path(__file__).resolve().parents[2]
STEPS = 3


def _grpo(model_dir: Path, out: Path) -> object:
    from agentgrad.algorithms.grpo import GRPO, GRPOConfig
    from agentgrad.training.policy import LoraSettings, TrainConfig

    config = GRPOConfig(
        steps=STEPS,
        batch_size=4,
        group_size=4,
        val_every=0,
        checkpoint_every=2,
        output_dir=out,
        sampling={"temperature": 1.0, "max_tokens": 48},
        train=TrainConfig(lr=5e-3, lora=LoraSettings(r=8)),
    )
    return GRPO(model_dir, config)


def _run(policy: object, model_dir: Path, out: Path) -> tuple[object, object, float]:
    from agentgrad.demo.agent import calc_agent, train_tasks, val_tasks
    from agentgrad.store import open_store
    from agentgrad.trainer import Trainer

    store = open_store(f"sqlite:///{out / 'store.sqlite'}")
    grpo = _grpo(model_dir, out)
    started = time.monotonic()
    with policy.serving(store):  # type: ignore[attr-defined]
        result = Trainer(store, algorithm=grpo, policy=policy, n_runners=1, concurrency=16).fit(
            calc_agent, train_tasks(64, seed=3), val_tasks(16)
        )
    return result, store, time.monotonic() - started


def _metrics(out: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]


def _phases(rows: list[dict[str, float]]) -> dict[str, float]:
    """Median seconds per step: rollouts, the update, publishing (train_seconds minus the update)."""
    import statistics

    update = [r["tokens"] / r["tokens_per_second"] for r in rows]
    return {
        "rollout_seconds": statistics.median(r["rollout_seconds"] for r in rows),
        "update_seconds": statistics.median(update),
        "publish_seconds": statistics.median(r["train_seconds"] - u for r, u in zip(rows, update)),
        "step_seconds": statistics.median(r["step_seconds"] for r in rows),
        "steps_trained": len(rows),
    }


@pytest.mark.timeout(3600)
def test_grpo_trains_the_calculator_agent_through_a_skyrl_tinker_server(skyrl_server, qwen3_twin, tmp_path):
    from agentgrad import semconv
    from agentgrad.training.local import LocalPolicy
    from agentgrad.training.tinker import TinkerPolicy, TinkerSettings

    out = tmp_path / "tinker"
    result, store, seconds = _run(TinkerPolicy(qwen3_twin, TinkerSettings(skyrl_server)), qwen3_twin, out)

    # the published version changed, and rollouts after the first update sampled from it
    calls = [s for r in store.query_rollouts() for s in store.query_spans(r.rollout_id, name=semconv.SPAN_LLM_CALL)]
    versions = {s.attributes.get(semconv.MODEL_VERSION) for s in calls}
    assert "v0" in versions and len(versions - {"v0", None}) >= 1, versions
    # sampled token ids and logprobs came back through the proxy
    sampled = [s for s in calls if s.attributes.get(semconv.LLM_COMPLETION_TOKEN_IDS)]
    assert sampled, "no captured call carried completion token ids"
    for span in sampled[:20]:
        ids, logprobs = span.attributes[semconv.LLM_COMPLETION_TOKEN_IDS], span.attributes[semconv.LLM_LOGPROBS]
        assert len(ids) == len(logprobs) and all(math.isfinite(v) and v <= 0 for v in logprobs)
    # the loss moved: at least one update, with a finite, non-zero loss
    rows = _metrics(out)
    assert rows, "no step trained (every group had the same reward?)"
    assert all(math.isfinite(r["loss"]) for r in rows) and any(r["loss"] != 0 for r in rows)
    assert (out / "model" / "tinker_weights.json").is_file()
    assert result.steps == STEPS

    # the same run on the local backend, for the per-phase comparison
    local_out = tmp_path / "local"
    _run(LocalPolicy(qwen3_twin), qwen3_twin, local_out)
    timings = {
        "tinker": {**_phases(rows), "run_seconds": seconds},
        "local": _phases(_metrics(local_out)),
        "steps": STEPS,
        "batch": "4 tasks x 4 rollouts",
        "model": "tiny-calc Qwen3 twin (0.9M)",
        "server": "SkyRL 0.3.0 Tinker API, JAX backend, CPU",
    }
    artifacts = REPO / "test-artifacts" / "scale"
    artifacts.mkdir(parents=True, exist_ok=True)
    (artifacts / "timings.json").write_text(json.dumps(timings, indent=2))
    print(json.dumps(timings, indent=2))
