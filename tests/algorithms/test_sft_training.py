"""SFT training with the shared training module on the tiny model.

* fast: train a few steps on traces captured through the proxy (scripted upstream), publish to a
  directory, and check the published model loads and the store announces the new version;
* slow: rejection sampling end to end — the tiny model served by the local engine, the real
  calculator agent in runners, every call captured by the proxy; SFT trains only on what its own
  runners produced and must raise greedy validation success.
"""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from agentgrad.algorithms.base import AlgorithmContext
from agentgrad.algorithms.sft import SFT, SaveToDirectory, SelectionCriteria
from agentgrad.demo.agent import calc_agent
from agentgrad.errors import AgentGradError
from agentgrad.proxy import LLMProxy, ProxyResourcesHook
from agentgrad.store.memory import MemoryStore
from agentgrad.testing.stub import StubUpstream, tool_reply
from agentgrad.trainer import Trainer
from agentgrad.types import LLM

pytest.importorskip("torch")

pytestmark = pytest.mark.tiny_model  # runs last: see tests/conftest.py


@pytest.fixture(scope="module")
def demo_model_dir():
    """The trained demo model (SFT must raise its success): not the root conftest's random
    ``tiny_model_dir``."""
    from agentgrad.demo.tiny import ensure_tiny_model

    return ensure_tiny_model()


def captured_store() -> MemoryStore:
    """Two calculator rollouts captured through the proxy from a scripted upstream: one right (two
    calls), one wrong."""
    store = MemoryStore()
    tasks = [{"question": "What is 2 + 3?", "answer": 5}, {"question": "What is 2 + 4?", "answer": 6}]
    with (
        StubUpstream([tool_reply("calculator", {"expression": "2 + 3"}), "The answer is 5."]) as upstream,
        LLMProxy(store, f"http://127.0.0.1:{upstream.port}/v1") as proxy,
    ):
        trainer = Trainer(store, runner_options={"resources_hook": ProxyResourcesHook(proxy.base_url)})
        trainer.dev(calc_agent, tasks, {"llm": LLM(endpoint="unused", model="stub-model")}, print_summary=False)
    return store


def four_step_sft(model_dir, tmp_path, **options) -> SFT:
    from agentgrad.training import TrainConfig

    return SFT(
        model_dir,
        train_config=TrainConfig(lr=1e-3),
        steps=4,
        batch_size=2,
        publisher=SaveToDirectory(tmp_path / "out"),
        **options,
    )


def test_sft_fast_trains_publishes_and_announces(demo_model_dir, tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    store = captured_store()
    sft = four_step_sft(demo_model_dir, tmp_path)
    out = Console(file=io.StringIO(), width=80)
    result = sft.run(AlgorithmContext(store=store, console=out))
    assert result.samples == [2]  # the successful rollout's two calls; the failed one is rejected
    step_lines = [line for line in out.file.getvalue().splitlines() if line.startswith("SFT step")]
    assert [line.split()[2] for line in step_lines] == ["1/4", "2/4", "3/4", "4/4"]  # a line a step: 4 < 10
    assert all(" loss " in line and line.endswith("tok/s") for line in step_lines)
    losses = [m.loss for m in result.history]
    assert len(losses) == 4 and losses[-1] < losses[0]
    AutoModelForCausalLM.from_pretrained(result.versions[0])  # a loadable model directory
    assert store.get_latest_resources().items["policy_version"].value == result.versions[0]
    assert [m.step for m in store.query_metrics("sft:sft")] == [1, 2, 3, 4]
    with pytest.raises(AgentGradError, match="somewhere to publish"):
        SFT(demo_model_dir).run(AlgorithmContext(store=store))
    store.close()


def test_an_interrupted_sft_run_says_where_its_checkpoint_is(demo_model_dir, tmp_path, monkeypatch) -> None:
    from agentgrad.algorithms.runlog import RunLog

    def log_then_stop(self, step, values) -> None:  # Ctrl-C between steps 2 and 3
        if step == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(RunLog, "log", log_then_stop)
    checkpoints = tmp_path / "checkpoints"
    sft = four_step_sft(demo_model_dir, tmp_path, checkpoint_dir=checkpoints)
    out = Console(file=io.StringIO(), width=200)
    with pytest.raises(KeyboardInterrupt):
        sft.run(AlgorithmContext(store=captured_store(), console=out))
    assert f"interrupted after SFT step 2; its checkpoint is in {checkpoints}: the same command" in out.file.getvalue()
    assert (checkpoints / "step-000002").is_dir()


@pytest.mark.slow
def test_rejection_sampling_raises_greedy_success(demo_model_dir) -> None:
    from agentgrad.demo.calc import generate_problems
    from agentgrad.training import TrainConfig
    from agentgrad.training.local import LocalPolicy

    store = MemoryStore()
    val = generate_problems(64, 1, "val")
    train = generate_problems(200, 1, "train")
    with LocalPolicy(demo_model_dir, max_batch_size=32, served_model_name="tiny").serving(store) as policy:
        greedy, sampling = {"llm": policy.llm(temperature=0.0)}, {"llm": policy.llm(temperature=1.0)}
        trainer = Trainer(store, concurrency=16, policy=policy)  # SFT publishes into the policy's engine
        before = trainer.dev(calc_agent, val, greedy, mode="val", print_summary=False).reward_mean
        trainer.algorithm = SFT(
            demo_model_dir,
            criteria=SelectionCriteria(min_reward=1.0),
            train_config=TrainConfig(lr=5e-4),
            iterations=3,
            samples_per_task=2,
            steps=40,
            batch_size=32,
        )
        result = trainer.fit(calc_agent, train, resources=sampling)
        after = trainer.dev(calc_agent, val, greedy, mode="val", print_summary=False).reward_mean
    print(f"greedy success before {before:.3f} → after {after:.3f}; samples per iteration {result.samples}")
    assert after >= 0.8 > before
    store.close()
