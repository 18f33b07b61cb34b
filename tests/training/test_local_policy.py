"""LocalPolicy: the engine, model server and capture proxy of a local model, started and closed
as one; and the Trainer that starts it, points its runners at its proxy and hands it on."""

from __future__ import annotations

import importlib
import io

import pytest
from rich.console import Console

from agentgrad import semconv
from agentgrad.algorithms.base import Algorithm, AlgorithmContext
from agentgrad.store.memory import MemoryStore
from agentgrad.trainer import Trainer
from agentgrad.training.local import NAMED_MODEL_CALLS, LocalPolicy
from agentgrad.types import LLM

pytest.importorskip("torch")

FAST = {"poll_timeout": 0.05, "heartbeat_interval": 0.2}


def quiet() -> Console:
    return Console(file=io.StringIO(), width=120)


def ask(task: dict, llm: LLM) -> float:
    """A plain OpenAI-client agent: one short completion."""
    import openai

    client = openai.OpenAI(base_url=llm.endpoint, api_key="none", max_retries=0)
    client.chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": task["q"]}], max_tokens=4, **llm.sampling
    )
    return 1.0


def test_a_model_dir_that_does_not_exist_is_named(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match=str(missing)):
        LocalPolicy(missing)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        LocalPolicy(tmp_path / "empty")


def test_the_command_lines_model_names_get_the_python_way(tmp_path, monkeypatch):
    from agentgrad.cli.named_models import MODEL_HELP, NAMED_MODELS

    assert set(NAMED_MODEL_CALLS) == set(NAMED_MODELS)
    assert all(repr(name) in MODEL_HELP for name in NAMED_MODELS)  # the --model help names each
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"ensure_tiny_model\(\)"):
        LocalPolicy("tiny")
    with pytest.raises(FileNotFoundError, match=r"`smollm2` is the command line's name.*import_smollm2\(\)"):
        LocalPolicy("smollm2")
    for call in NAMED_MODEL_CALLS.values():  # each call names a function that exists
        module, _, function = call.removesuffix("()").rpartition(".")
        assert callable(getattr(importlib.import_module(module), function)), call


def test_the_prefix_cache_settings_reach_the_engine(tiny_model_dir):
    """``prefix_caching`` / ``prefix_cache_mb``, from Python and from the command line's flags
    (``agentgrad train/eval/dev --no-prefix-caching --prefix-cache-mb``)."""
    from agentgrad.cli import build_parser
    from agentgrad.cli.named_models import engine_flags_given, engine_keywords

    parse = build_parser().parse_args
    base = ["train", "a:b", "--model", "tiny", "--tasks", "t.jsonl"]
    assert engine_keywords(parse(base)) == {
        "device": None,
        "dtype": None,
        "prefix_caching": True,
        "prefix_cache_mb": 256.0,
    }
    assert engine_keywords(parse([*base, "--no-prefix-caching"]))["prefix_caching"] is False
    keywords = engine_keywords(parse([*base, "--prefix-cache-mb", "8"]))
    # a flag given is a flag asked for, even at its default's value: refused where no engine runs
    assert engine_flags_given(parse(base)) == []
    assert engine_flags_given(parse([*base, "--prefix-cache-mb", "256"])) == ["--prefix-cache-mb"]
    for bad in (-1, float("nan")):
        with pytest.raises(ValueError, match="prefix_cache_mb must be 0 or more"):
            LocalPolicy(tiny_model_dir, prefix_cache_mb=bad)
    store = MemoryStore(watchdog_interval=None)
    try:
        with LocalPolicy(tiny_model_dir, **{**keywords, "device": "cpu"}).serving(store) as policy:
            assert policy.engine._prefixes.max_bytes == 8 * 2**20
        with LocalPolicy(tiny_model_dir, prefix_caching=False).serving(store) as policy:
            assert policy.engine._prefixes is None
    finally:
        store.close()


def test_start_serve_close_in_order_and_idempotent(tiny_model_dir):
    store = MemoryStore(watchdog_interval=None)
    policy = LocalPolicy(tiny_model_dir, served_model_name="tiny", max_batch_size=4)
    assert not policy.started and "not started" in repr(policy)
    with pytest.raises(RuntimeError, match="not started"):
        policy.llm()
    with policy.serving(store) as served:
        assert served is policy and policy.started and policy.store is store
        assert policy.upstream_url.endswith("/v1") and policy.proxy_url.startswith("http://127.0.0.1:")
        assert policy.proxy.upstream_url == policy.upstream_url  # the proxy sits in front of the server
        llm = policy.llm(temperature=0.0)
        assert (llm.endpoint, llm.model, llm.sampling) == (policy.upstream_url, "tiny", {"temperature": 0.0})
        assert policy.model_version == "v0"
        publisher = policy.publisher()
        assert publisher.engine is policy.engine
        assert policy.start(store) is policy  # already serving this store: nothing happens
        with pytest.raises(RuntimeError, match="another store"):
            policy.start(MemoryStore(watchdog_interval=None))
        engine = policy.engine
    assert not policy.started and policy.engine is None and policy.proxy is None
    assert engine._closed  # the engine closed last, after the server and the proxy
    policy.close()  # again: nothing to do
    store.close()


def test_a_call_through_the_trainer_lands_as_a_span_with_token_ids(tiny_model_dir):
    """A policy given to the Trainer unstarted: started on its store, the runner's LLM calls go
    through its proxy (recorded with token ids), and it is closed when dev() returns."""
    store = MemoryStore(watchdog_interval=None)
    policy = LocalPolicy(tiny_model_dir, max_batch_size=4)
    trainer = Trainer(store, policy=policy, llm_resource="main_llm", runner_options=FAST, console=quiet())

    def agent(task: dict, resources) -> float:  # the resource name the Trainer was told
        return ask(task, resources.get("main_llm"))

    report = trainer.dev(agent, [{"q": "1 + 1"}, {"q": "2 + 2"}], timeout=60, print_summary=False)
    assert report.succeeded == 2 and report.llm_calls_per_rollout == [1, 1]
    assert not policy.started  # the Trainer started it, so the Trainer closed it
    (published,) = store.query_resources()
    assert set(published.items) == {"main_llm"} and published.items["main_llm"].model == tiny_model_dir.name
    for rollout in report.rollouts:
        (span,) = store.query_spans(rollout.rollout_id, name=semconv.SPAN_LLM_CALL)
        prompt_ids = span.attributes[semconv.LLM_PROMPT_TOKEN_IDS]
        completion_ids = span.attributes[semconv.LLM_COMPLETION_TOKEN_IDS]
        assert prompt_ids and all(isinstance(t, int) for t in prompt_ids)
        assert 1 <= len(completion_ids) <= 4
    store.close()


class PolicyProbe(Algorithm):
    """Reads what GRPO reads from the policy, then runs one rollout per task."""

    def run(self, context: AlgorithmContext):
        from agentgrad.algorithms.batch import run_batch
        from agentgrad.store.protocol import RolloutRequest

        assert context.policy is not None
        version, publisher = context.policy.model_version, context.policy.publisher()
        batch = run_batch(
            context.store, [RolloutRequest(input=t) for t in context.train_tasks], timeout=60, on_straggler="cancel"
        )
        return version, type(publisher).__name__, [r.status.value for r in batch.rollouts], context.initial_resources


def test_fit_hands_a_started_policy_to_the_algorithm_and_leaves_it_running(tiny_model_dir):
    store = MemoryStore(watchdog_interval=None)
    with LocalPolicy(tiny_model_dir, served_model_name="tiny").serving(store) as policy:
        trainer = Trainer(policy=policy, algorithm=PolicyProbe(), runner_options=FAST, console=quiet())
        assert trainer.store is store  # the started policy's store
        version, publisher, statuses, initial = trainer.fit(ask, [{"q": "3 + 4"}])
        assert (version, publisher, statuses) == ("v0", "LocalEnginePublisher", ["succeeded"])
        assert initial == {"llm": policy.llm()}
        assert policy.started  # started by the caller: still the caller's
        with pytest.raises(ValueError, match="another store"):
            Trainer(MemoryStore(watchdog_interval=None), policy=policy)
        with pytest.raises(ValueError, match="not both"):
            Trainer(store, policy=policy, proxy="http://127.0.0.1:1")
    store.close()


def test_a_model_without_a_chat_template_is_refused_before_anything_loads(model_zoo):
    from agentgrad.errors import InvalidInputError

    store = MemoryStore(watchdog_interval=None)
    policy = LocalPolicy(model_zoo["no_template"])
    with pytest.raises(InvalidInputError, match="chat template"):
        policy.start(store)
    assert not policy.started and policy.engine is None  # nothing was loaded or left running
    store.close()


def test_a_lora_policy_is_published_by_hot_loading_its_adapter(tiny_model_dir):
    """``lora_hot_swap``: a LoRA trainer's adapter is loaded into the engine under a new name (the
    base weights are not copied): requests for that name, through the model server and through the
    capture proxy, get the trained policy and name it as their version, ``policy.llm()`` names it,
    and the two newest adapters stay loaded. By default the merged weights are copied in."""
    import torch

    from agentgrad.inference import Engine, SamplingParams
    from agentgrad.training import LoraSettings, PolicyTrainer, TrainConfig

    trainer = PolicyTrainer(tiny_model_dir, TrainConfig(lr=1e-2, lora=LoraSettings(r=4)))
    store = MemoryStore(watchdog_interval=None)
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    with LocalPolicy(tiny_model_dir, served_model_name="tiny", lora_hot_swap=True).serving(store) as policy:
        assert policy.engine is not None
        prompt = policy.engine.tokenizer.encode("What is 3 + 4?")
        base = policy.engine.generate(prompt, params)
        assert _chat(f"{policy.proxy_url}/v1", "tiny")["model_version"] == "v0"  # the proxy reads the served names
        publisher = policy.publisher()
        for step in (1, 2, 3):
            with torch.no_grad():  # a trained adapter: B moved away from its zero start
                for name, param in trainer.model.named_parameters():
                    if "lora_B" in name:
                        param.normal_(0, 0.3)
            trainer.step = step
            published = publisher.publish(trainer)
            assert (published.version, published.model) == (f"policy-v{step}", f"policy-v{step}")
        assert policy.engine.loras == ["policy-v2", "policy-v3"] and policy.engine.model_version == "v0"
        assert policy.llm().model == "policy-v3"
        adapted = policy.engine.generate(prompt, params, lora="policy-v3")
        assert adapted.model_version == "policy-v3" and adapted.logprobs != pytest.approx(base.logprobs)
        assert _chat(policy.upstream_url, "policy-v3")["model_version"] == "policy-v3"  # the model server
        # the capture proxy read the served names before the adapters existed: it must not map the new name away
        assert _chat(f"{policy.proxy_url}/v1", "policy-v3")["model_version"] == "policy-v3"
    with LocalPolicy(tiny_model_dir).serving(store) as default:  # the default: the merged weights, copied
        assert default.publisher().publish(trainer).version == "v3" and default.engine.loras == []
        assert default.llm().model == default.model_name
    with Engine(tiny_model_dir) as merged:  # the same policy, its weights copied in full
        merged.update_weights(trainer.engine_state_dict())
        expected = merged.generate(prompt, params)
    assert adapted.token_ids == expected.token_ids
    assert adapted.logprobs == pytest.approx(expected.logprobs, abs=1e-4)
    store.close()


def _chat(base_url: str | None, model: str) -> dict:
    import httpx

    reply = httpx.post(
        f"{base_url}/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "3 + 4"}], "max_tokens": 2},
        timeout=60,
    )
    reply.raise_for_status()
    return reply.json()


def test_a_bfloat16_engine_serves_and_takes_a_float32_trainers_weights(tiny_model_dir):
    """``LocalPolicy(dtype="bfloat16")``: the engine holds its weights in bf16 (the faster CPU
    path, docs/training.md), a float32 trainer's published weights land there rounded to bf16, and
    it answers through the capture proxy; a dtype it does not know is refused before anything loads."""
    import torch

    from agentgrad.training import PolicyTrainer, TrainConfig

    with pytest.raises(ValueError, match="bfloat16"):
        LocalPolicy(tiny_model_dir, dtype="float16")
    trainer = PolicyTrainer(tiny_model_dir, TrainConfig(lr=1e-2))
    with torch.no_grad():
        for param in trainer.model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    trainer.step = 1  # as after one update
    store = MemoryStore(watchdog_interval=None)
    with LocalPolicy(tiny_model_dir, served_model_name="tiny", dtype="bfloat16").serving(store) as policy:
        assert policy.engine is not None
        weights = policy.engine._base.state_dict()
        assert {p.dtype for p in weights.values()} == {torch.bfloat16}
        assert policy.publisher().publish(trainer).version == "v1"
        for name, value in trainer.engine_state_dict().items():
            torch.testing.assert_close(weights[name], value.to(torch.bfloat16), rtol=0, atol=0)
        assert _chat(f"{policy.proxy_url}/v1", "tiny")["model_version"] == "v1"
    store.close()
