"""Any model: Qwen2, Llama and GPT-2-style models built from configs go through the engine, the
trainer and export; what a model lacks for a run (a chat template, a tool section, context) is
named in a clear error."""

from __future__ import annotations

import httpx
import pytest

torch = pytest.importorskip("torch")

from agentgrad.errors import InvalidInputError  # noqa: E402
from agentgrad.inference.engine import Engine, RequestError, SamplingParams  # noqa: E402
from agentgrad.training import (  # noqa: E402
    PolicyTrainer,
    Sample,
    TrainConfig,
    check_model,
    export_model,
)

ARCHITECTURES = ("qwen2", "llama", "gpt2")
MESSAGES = [{"role": "system", "content": "You are a calculator."}, {"role": "user", "content": "What is 2 + 3?"}]
TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}


@pytest.mark.parametrize("kind", ARCHITECTURES)
def test_engine_samples_and_trainer_learns_on_policy(model_zoo, kind, tmp_path):
    """The engine's sampled logprobs are the trainer's: the first PPO step has ratio 1 (GPT-2's
    dropout 0.1 included), and the trained policy exports and serves."""
    model_dir = model_zoo[kind]
    with Engine(model_dir, max_batch_size=8) as engine:
        prompts = [
            engine.tokenizer.apply_chat_template(
                [*MESSAGES[:1], {"role": "user", "content": f"What is {i} + {2 * i}?"}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
            )
            for i in range(6)
        ]
        futures = [
            engine.submit(p, SamplingParams(max_tokens=12, temperature=1.0, seed=i, logprobs=0))
            for i, p in enumerate(prompts)
        ]  # submitted together: batched, left-padded
        results = [f.result() for f in futures]
    samples = [
        Sample(r.prompt_token_ids, r.token_ids, old_logprobs=r.logprobs, advantage=(-1.0) ** i)
        for i, r in enumerate(results)
    ]
    trainer = PolicyTrainer(model_dir, TrainConfig())
    metrics = trainer.ppo_step(samples)
    assert metrics.clip_fraction == 0.0 and metrics.ratio_mean == pytest.approx(1.0, abs=1e-4)
    assert trainer.nll_step(samples).tokens == sum(len(r.token_ids) for r in results)
    out = export_model(trainer, tmp_path / "exported")
    with Engine(out) as served:
        assert len(served.generate(prompts[0], SamplingParams(max_tokens=4, temperature=0)).token_ids) >= 1


def test_check_model_accepts_each_architecture(model_zoo):
    for kind in ("qwen2", "llama"):
        info = check_model(model_zoo[kind], tools=True, prompt_tokens=100)
        assert info["renders_tools"] and info["tool_call_format"] and info["fingerprint"]["model_type"] == kind
    info = check_model(model_zoo["gpt2"], prompt_tokens=100)  # no tools asked: the plain template will do
    assert info["chat_template"] and not info["renders_tools"] and info["context"] == 256


def test_check_model_names_what_is_missing(model_zoo, tmp_path):
    with pytest.raises(InvalidInputError, match="no chat template"):
        check_model(model_zoo["no_template"])
    with pytest.raises(InvalidInputError, match="chat template has no tool section"):
        check_model(model_zoo["gpt2"], tools=True)
    with pytest.raises(InvalidInputError, match=r"the prompt has 300 tokens, the model's context .* is 256"):
        check_model(model_zoo["gpt2"], prompt_tokens=300)
    with pytest.raises(InvalidInputError, match="no config.json"):
        check_model(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text((model_zoo["llama"] / "config.json").read_text())
    with pytest.raises(InvalidInputError, match=r"no weights .*no usable tokenizer"):
        check_model(tmp_path / "empty")


def test_server_refuses_tools_the_template_cannot_show_and_a_missing_template(model_zoo):
    from agentgrad.inference import ModelServer

    for kind, body, expected in (
        ("gpt2", {"messages": MESSAGES, "tools": [TOOL]}, "chat template has no tool section"),
        ("no_template", {"messages": MESSAGES}, "has no chat template"),
    ):
        with Engine(model_zoo[kind]) as engine:
            server = ModelServer(engine, served_model_name=kind)
            url = server.start()
            try:
                refused = httpx.post(f"{url}/chat/completions", json={**body, "max_tokens": 3}, timeout=60)
                assert refused.status_code == 400, refused.text
                assert expected in refused.json()["error"]["message"]
                if kind == "gpt2":  # without tools the plain template serves
                    ok = httpx.post(f"{url}/chat/completions", json={"messages": MESSAGES, "max_tokens": 3}, timeout=60)
                    assert ok.status_code == 200, ok.text
            finally:
                server.stop()


def test_prompts_longer_than_the_context_are_named(model_zoo):
    with Engine(model_zoo["gpt2"]) as engine:
        with pytest.raises(RequestError, match="maximum context length is 256 tokens; the prompt has 300"):
            engine.generate(list(range(5, 305)), SamplingParams(max_tokens=2))
    trainer = PolicyTrainer(model_zoo["gpt2"], TrainConfig(lr=1e-3))
    with pytest.raises(InvalidInputError, match=r"300 tokens, longer than the context of model .* \(256 tokens"):
        trainer.ppo_step([Sample(list(range(5, 295)), list(range(5, 15)), advantage=1.0)])
    assert trainer.step == 0
