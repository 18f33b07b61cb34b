"""GRPO of the calculator agent trained through the Tinker API on a real SkyRL Tinker server.

The same agent code, store, runners, capture proxy and adapter as a local run; only the update
(``forward_backward`` + ``optim_step``) and the sampling (``sample`` of the newest published
sampler) happen on the server. The local backend runs the same task next to it for the timing
comparison, written to ``test-artifacts/scale/timings.json``.
"""

from __future__ import annotations

import json
import math

import pytest
from scale_run import DESCRIPTION, REPO, grpo_run, phases, trained_steps

pytest.importorskip("tinker")
pytest.importorskip("torch")

pytestmark = pytest.mark.scale

STEPS = 3


@pytest.mark.timeout(3600)
def test_grpo_trains_the_calculator_agent_through_a_skyrl_tinker_server(skyrl_server, qwen3_twin, tmp_path):
    from agentgrad import semconv
    from agentgrad.training.local import LocalPolicy
    from agentgrad.training.tinker import TinkerPolicy, TinkerSettings

    out = tmp_path / "tinker"
    result, store, seconds = grpo_run(
        TinkerPolicy(qwen3_twin, TinkerSettings(skyrl_server)), qwen3_twin, out, steps=STEPS
    )

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
    rows = trained_steps(out)
    assert rows, "no step trained (every group had the same reward?)"
    assert all(math.isfinite(r["loss"]) for r in rows) and any(r["loss"] != 0 for r in rows)
    assert (out / "model" / "tinker_weights.json").is_file()
    assert result.steps == STEPS

    # the same run on the local backend, for the per-phase comparison (bench/bench_tinker.py
    # repeats both for the table in docs/scale-out.md)
    local_out = tmp_path / "local"
    _, _, local_seconds = grpo_run(LocalPolicy(qwen3_twin), qwen3_twin, local_out, steps=STEPS)
    timings = {
        "tinker": {**phases(rows), "run_seconds": seconds},
        "local": {**phases(trained_steps(local_out)), "run_seconds": local_seconds},
        "steps": STEPS,
        "model": qwen3_twin.name,
        **DESCRIPTION,
    }
    artifacts = REPO / "test-artifacts" / "scale"
    artifacts.mkdir(parents=True, exist_ok=True)
    (artifacts / "timings.json").write_text(json.dumps(timings, indent=2))
    print(json.dumps(timings, indent=2))
