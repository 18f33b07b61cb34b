"""agentgrad.compat.agentlightning without a model: each name's mapping, and every refusal saying
what to use instead."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from agentgrad import semconv
from agentgrad.compat import agentlightning as agl
from agentgrad.store import open_store
from agentgrad.trainer import Trainer as AgTrainer
from agentgrad.types import LLM

ROOT = Path(__file__).resolve().parents[2]
FAST = {"poll_timeout": 0.05, "heartbeat_interval": 0.2}

#: Agent Lightning's spider example config (examples/spider/train_sql_agent.py), model path local.
SPIDER_CONFIG: dict[str, Any] = {
    "algorithm": {"adv_estimator": "grpo", "use_kl_in_reward": False},
    "data": {
        "train_files": "data/train_spider.parquet",
        "val_files": "data/test_dev_500.parquet",
        "train_batch_size": 32,
        "max_prompt_length": 4096,
        "max_response_length": 2048,
        "truncation": "error",
    },
    "actor_rollout_ref": {
        "rollout": {
            "tensor_model_parallel_size": 1,
            "n": 4,
            "log_prob_micro_batch_size_per_gpu": 4,
            "multi_turn": {"format": "hermes"},
            "name": "vllm",
            "gpu_memory_utilization": 0.8,
            "engine_kwargs": {"vllm": {"enable_auto_tool_choice": True, "tool_call_parser": "hermes"}},
        },
        "actor": {
            "ppo_mini_batch_size": 32,
            "ppo_micro_batch_size_per_gpu": 4,
            "optim": {"lr": 1e-6},
            "use_kl_loss": False,
            "kl_loss_coef": 0.0,
            "entropy_coeff": 0,
            "clip_ratio_low": 0.2,
            "clip_ratio_high": 0.3,
            "fsdp_config": {"param_offload": True, "optimizer_offload": True},
        },
        "ref": {"log_prob_micro_batch_size_per_gpu": 8, "fsdp_config": {"param_offload": True}},
        "model": {"path": "models/qwen", "use_remove_padding": True, "enable_gradient_checkpointing": True},
    },
    "trainer": {
        "n_gpus_per_node": 1,
        "val_before_train": True,
        "critic_warmup": 0,
        "logger": ["console", "wandb"],
        "project_name": "AgentLightning",
        "experiment_name": "spider",
        "nnodes": 1,
        "test_freq": 32,
        "total_epochs": 2,
    },
}


def quiet() -> Console:
    return Console(file=io.StringIO(), width=120)


def dev(agent: Any, tasks: list[Any], resources: dict[str, Any] | None, mode: str = "train") -> tuple[Any, Any]:
    store = open_store("memory", watchdog=False)
    report = AgTrainer(store, runner_options=FAST, console=quiet()).dev(
        agent, tasks, resources, mode=mode, print_summary=False
    )
    return store, report


# ---- types ------------------------------------------------------------------------------------------


def test_sampling_parameters_are_kept_through_the_store_and_reach_the_agent(tmp_path: Path) -> None:
    seen: list[dict[str, Any]] = []

    @agl.rollout
    def agent(task: int, llm: agl.LLM) -> float:
        seen.append(llm.sampling_parameters)
        assert isinstance(llm, agl.LLM) and "/rollout/" in llm.get_base_url()  # the capture proxy's, per attempt
        return 1.0

    llm = agl.LLM(endpoint="http://up/v1", model="m", sampling_parameters={"temperature": 0.7, "max_tokens": 9})
    assert llm.sampling == {"temperature": 0.7, "max_tokens": 9}  # one setting, two names
    store = open_store(f"sqlite://{tmp_path / 's.db'}", watchdog=False)
    report = AgTrainer(store, runner_options=FAST, console=quiet()).dev(
        agent, [1], {"main_llm": llm}, print_summary=False
    )
    assert report.succeeded and seen == [{"temperature": 0.7, "max_tokens": 9}]
    assert store.get_latest_resources().items["main_llm"].sampling_parameters == {"temperature": 0.7, "max_tokens": 9}
    with pytest.raises(ValueError, match="one setting under two names"):
        LLM(endpoint="e", model="m", sampling={"temperature": 1.0}, sampling_parameters={"temperature": 0.5})


def test_get_base_url_takes_both_ids_or_neither() -> None:
    llm = agl.LLM(endpoint="http://proxy/rollout/r/attempt/a/v1", model="m")
    assert llm.get_base_url("r", "a") == llm.get_base_url() == llm.endpoint
    with pytest.raises(ValueError, match="both"):
        llm.get_base_url("r", None)


def test_prompt_templates_format_f_string_and_jinja_and_refuse_poml() -> None:
    assert agl.PromptTemplate(template="Hi {name}", engine="f-string").format(name="x") == "Hi x"
    assert agl.PromptTemplate(template="Hi {{ name }}", engine="jinja").format(name="x") == "Hi x"
    with pytest.raises(agl.UnsupportedError, match="f-string"):
        agl.PromptTemplate(template="<poml/>", engine="poml")


# ---- LitAgent ---------------------------------------------------------------------------------------


class ModeAgent(agl.LitAgent[dict]):
    """Training and validation differ; the agent reads what Agent Lightning agents read."""

    def training_rollout(self, task: dict, resources: agl.NamedResources, rollout: agl.Rollout) -> float:
        assert isinstance(resources, dict) and isinstance(resources["main_llm"], agl.LLM)
        assert rollout.attempt.attempt_id and rollout.attempt.rollout_id == rollout.rollout_id
        assert resources["prompt"].format(x=task["x"]) == f"say {task['x']}"
        return 0.25

    def validation_rollout(self, task: dict, resources: agl.NamedResources, rollout: agl.Rollout) -> float:
        assert rollout.mode == "val"
        return 0.75


RESOURCES = {
    "main_llm": agl.LLM(endpoint="http://up/v1", model="m"),
    "prompt": agl.PromptTemplate(template="say {x}", engine="f-string"),
}


def test_lit_agent_training_and_validation_rollouts() -> None:
    agent = ModeAgent(trained_agents="write")
    assert agent.trained_agents == "write" and agent.llm_resource == "main_llm"
    _, train = dev(agent, [{"x": 1}], RESOURCES)
    _, val = dev(agent, [{"x": 1}], RESOURCES, mode="val")
    assert [r.reward for r in train.rollouts] == [0.25] and [r.reward for r in val.rollouts] == [0.75]


class AsyncAgent(agl.LitAgent[int]):
    async def rollout_async(self, task: int, resources: agl.NamedResources, rollout: agl.Rollout) -> None:
        agl.emit_reward({"correct": float(task), "short": 0.5}, primary_key="correct")


def test_async_lit_agent_and_multi_dimension_reward() -> None:
    agent = AsyncAgent()
    assert agent.is_async()
    store, report = dev(agent, [1], RESOURCES)
    assert [r.reward for r in report.rollouts] == [1.0]
    (span,) = store.query_spans(report.rollouts[0].rollout_id, name=semconv.SPAN_REWARD)
    assert span.attributes[semconv.REWARD_PRIMARY] == "correct" and span.attributes["agentgrad.reward.short"] == 0.5
    assert agl.find_final_reward(store.query_spans(report.rollouts[0].rollout_id)) == 1.0


def test_reward_decorator_and_find_final_reward() -> None:
    @agl.reward
    def score(x: float) -> float:
        return x

    @agl.rollout
    def agent(task: float, prompt_template: agl.PromptTemplate) -> None:
        score(0.5)
        score(task)

    store, report = dev(agent, [0.875], RESOURCES)
    spans = store.query_spans(report.rollouts[0].rollout_id)
    assert [agl.get_reward_value(s) for s in agl.find_reward_spans(spans)] == [0.5, 0.875]
    assert agl.find_final_reward(spans) == 0.875 == report.rollouts[0].reward


def test_emitters_refuse_what_agentgrad_cannot_honour() -> None:
    @agl.rollout
    def agent(task: str, llm: agl.LLM) -> float:
        with pytest.raises(ValueError, match="primary_key"):
            agl.emit_reward({"a": 1.0, "b": 0.0})
        with pytest.raises(agl.UnsupportedError, match="emit_object"):
            agl.emit_reward(1.0, attributes={"k": "v"})
        with pytest.raises(agl.UnsupportedError, match="propagate"):
            agl.emit_message("hi", propagate=False)
        agl.emit_message("hello", {"k": "v"})
        return 1.0

    store, report = dev(agent, ["t"], RESOURCES)
    assert report.succeeded
    (message,) = store.query_spans(report.rollouts[0].rollout_id, name=semconv.SPAN_MESSAGE)
    assert message.attributes["k"] == "v"


def test_the_langchain_handler_is_a_callback_langchain_accepts() -> None:
    langchain_core = pytest.importorskip("langchain_core")
    from langchain_core.runnables import RunnableLambda

    handler = agl.LitAgent().tracer.get_langchain_handler()
    assert isinstance(handler, langchain_core.callbacks.BaseCallbackHandler)
    assert RunnableLambda(lambda x: x + 1).invoke(1, {"callbacks": [handler]}) == 2
    with pytest.raises(agl.UnsupportedError, match="proxy"):
        agl.LitAgent().tracer.trace_context()


def test_rollout_decorator_refuses_an_unknown_shape_and_ambiguous_resources() -> None:
    with pytest.raises(TypeError, match="f\\(task, llm"):
        agl.rollout(lambda task, model: 1.0)

    @agl.rollout
    def agent(task: int, llm: agl.LLM) -> float:
        return 1.0

    two = {"a": agl.LLM(endpoint="http://a/v1", model="m"), "b": agl.LLM(endpoint="http://b/v1", model="m")}
    store, report = dev(agent, [1], two)
    error = store.get_attempts(report.rollouts[0].rollout_id)[-1].error
    assert error is not None and "of type LLM" in error.message


# ---- Trainer, VERL, APO ------------------------------------------------------------------------------


def test_verl_maps_the_reference_config_onto_grpo() -> None:
    verl = agl.VERL(SPIDER_CONFIG)
    config = verl.grpo_config(100, "write|rewrite")
    assert str(verl.model_dir) == "models/qwen" and verl.trackers == ["wandb"]
    assert (config.batch_size, config.group_size, config.mini_batches, config.steps) == (32, 4, 1, 2 * (100 // 32))
    assert (config.train.lr, config.train.clip_eps_low, config.train.clip_eps_high, config.train.kl_coef) == (
        1e-6,
        0.2,
        0.3,
        0.0,
    )
    assert config.sampling == {"temperature": 1.0, "max_tokens": 2048}
    assert (config.val_every, config.run_id, config.agent_match) == (32, "spider", "write|rewrite")
    assert "actor_rollout_ref.actor.fsdp_config" in verl.not_applied
    assert "FSDP" in verl.not_applied["actor_rollout_ref.actor.fsdp_config"]


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"algorithm": {"adv_estimator": "gae"}}, "GRPO"),
        ({"algorithm": {"use_kl_in_reward": True}}, "use_kl_loss"),
        ({"trainer": {"nnodes": 2}}, "one device"),
        ({"trainer": {"total_epochs": 1, "val_before_train": False}}, "val_dataset"),
        ({"actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 5}}}, "divide"),
        ({"actor_rollout_ref": {"rollout": {"top_k": 20}}}, r"actor_rollout_ref\.rollout\.top_k"),
        ({"trainer": {"logger": ["swanlab"]}}, "swanlab"),
        ({"custom_reward_function": {"path": "r.py"}}, "custom_reward_function.path"),
    ],
)
def test_verl_refuses_keys_and_values_without_an_equivalent(change: dict[str, Any], match: str) -> None:
    config = {"actor_rollout_ref": {"model": {"path": "m"}}, **change}
    if "actor_rollout_ref" in change:
        config["actor_rollout_ref"] = {**change["actor_rollout_ref"], "model": {"path": "m"}}
    with pytest.raises(agl.UnsupportedError, match=match):
        agl.VERL(config)
    with pytest.raises(agl.UnsupportedError, match="model.path"):
        agl.VERL({"trainer": {"total_epochs": 1}})


@pytest.mark.parametrize(
    ("algorithm", "estimator"),
    [
        ({"adv_estimator": "grpo"}, "grpo"),
        ({"adv_estimator": "grpo", "norm_adv_by_std_in_grpo": False}, "dr_grpo"),
        ({"norm_adv_by_std_in_grpo": False}, "dr_grpo"),
        ({"adv_estimator": "rloo", "norm_adv_by_std_in_grpo": False}, "rloo"),  # VERL reads it for GRPO only
        ({"adv_estimator": "reinforce_plus_plus_baseline"}, "reinforce++"),
    ],
)
def test_verl_estimator_keys_choose_the_estimator(algorithm: dict[str, Any], estimator: str) -> None:
    verl = agl.VERL({"actor_rollout_ref": {"model": {"path": "m"}}, "algorithm": algorithm})
    assert verl.grpo_config(100, None).estimator == estimator


def test_apo_maps_the_client_onto_critic_and_editor() -> None:
    class Client:
        base_url = "http://critic/v1/"
        api_key = "k"

    apo = agl.APO(
        Client(),
        gradient_model="g",
        apply_edit_model="e",
        beam_width=2,
        branch_factor=3,
        beam_rounds=1,
        gradient_batch_size=5,
        val_batch_size=6,
        diversity_temperature=0.3,
    )
    assert (apo.critic.model, apo.editor.model, apo.critic.base_url, apo.critic.api_key) == (
        "g",
        "e",
        "http://critic/v1/",
        "k",
    )
    assert (
        apo.beam_width,
        apo.branch_factor,
        apo.rounds,
        apo.train_batch_size,
        apo.val_batch_size,
        apo.critic.temperature,
    ) == (2, 3, 1, 5, 6, 0.3)
    with pytest.raises(agl.UnsupportedError, match="POML|plain text"):
        agl.APO(Client(), _poml_trace=True)
    with pytest.raises(agl.UnsupportedError, match="seed prompt"):
        agl.APO(Client(), run_initial_validation=False)


def test_trainer_arguments() -> None:
    trainer = agl.Trainer(n_workers=3, adapter={"agent_match": "write"}, algorithm=agl.VERL(SPIDER_CONFIG))
    assert trainer.n_runners == 3 and trainer.adapter.agent_match == "write"
    for kwargs, match in [
        ({"tracer": object()}, "proxy"),
        ({"runner": object()}, "n_runners"),
        ({"n_runners": 1, "n_workers": 2}, "disagree"),
        ({"hooks": [object()]}, "Runner"),
        ({"adapter": {"agent_match": "x", "llm_call_match": "y"}}, "llm_call_match"),
        ({"algorithm": object()}, "VERL"),
        ({"adapter": agl.TraceToMessages()}, "APO"),
        ({"dev": True}, "trainer.dev"),
    ]:
        with pytest.raises(agl.UnsupportedError, match=match):
            agl.Trainer(**kwargs)
    with pytest.raises(agl.UnsupportedError, match="algorithm"):
        agl.Trainer().fit(ModeAgent(), train_dataset=[1])


def test_trainer_dev_runs_a_function_agent_with_initial_resources() -> None:
    @agl.rollout
    def agent(task: int, prompt_template: agl.PromptTemplate) -> float:
        return float(prompt_template.format(x=task) == "say 2")

    trainer = agl.Trainer(n_workers=1, initial_resources={"prompt": RESOURCES["prompt"]})
    report = trainer.dev(agent, [2])
    assert [r.reward for r in report.rollouts] == [1.0]
    assert agent.trainer is trainer


# ---- names and the alias ----------------------------------------------------------------------------


def test_unsupported_names_say_what_to_use_instead() -> None:
    with pytest.raises(agl.UnsupportedError, match="open_store"):
        from agentgrad.compat.agentlightning import InMemoryLightningStore  # noqa: F401
    with pytest.raises(agl.UnsupportedError, match="agentgrad.Runner"):
        agl.LitAgentRunner  # noqa: B018
    with pytest.raises(AttributeError):
        agl.NoSuchName  # noqa: B018


def run_python(code: str, cwd: Path, extra_path: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (extra_path, str(ROOT / "src")) if p)}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        check=False,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_alias_gives_import_agentlightning_when_none_is_installed(tmp_path: Path) -> None:
    done = run_python(
        """
        import agentgrad.compat
        assert agentgrad.compat.install_alias()
        import agentlightning as agl
        from agentlightning.litagent import LitAgent
        from agentlightning.algorithm.apo import APO
        from agentgrad.compat import agentlightning as compat
        assert agl is compat and LitAgent is compat.LitAgent and APO is compat.APO
        print("ok")
    """,
        tmp_path,
    )
    assert done.stdout.strip() == "ok", done.stderr


def test_the_alias_never_shadows_a_real_agentlightning(tmp_path: Path) -> None:
    real = tmp_path / "site" / "agentlightning"
    real.mkdir(parents=True)
    (real / "__init__.py").write_text("REAL = True\n")
    done = run_python(
        """
        import agentgrad.compat
        assert agentgrad.compat.install_alias() is False
        import agentlightning
        assert agentlightning.REAL
        print("ok")
    """,
        tmp_path,
        extra_path=str(tmp_path / "site"),
    )
    assert done.stdout.strip() == "ok", done.stderr
