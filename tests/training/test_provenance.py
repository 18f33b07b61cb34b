"""Checkpoints record the model they came from; a checkpoint of another model is refused with a
message naming both, an old one without the record still loads (with a log line)."""

from __future__ import annotations

import json
import logging

import pytest

torch = pytest.importorskip("torch")

from agentgrad.errors import InvalidInputError  # noqa: E402
from agentgrad.training import LoraSettings, PolicyTrainer, Sample, TrainConfig  # noqa: E402


def _checkpoint(model_dir, root, lora=None):
    trainer = PolicyTrainer(model_dir, TrainConfig(lr=1e-3, lora=lora))
    trainer.nll_step([Sample([5, 6, 7, 8], [9, 10])])
    return trainer, trainer.save_checkpoint(root, cursor=4)


def test_checkpoint_records_the_model(model_zoo, tmp_path):
    _, target = _checkpoint(model_zoo["llama"], tmp_path / "ckpt", LoraSettings(r=4))
    record = json.loads((target / "state.json").read_text())["model"]
    assert record["path"] == str(model_zoo["llama"].resolve())
    assert record["fingerprint"] == {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": json.loads((model_zoo["llama"] / "config.json").read_text())["vocab_size"],
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "max_position_embeddings": 512,
        "tie_word_embeddings": False,
    }
    assert record["lora"] == {"r": 4, "alpha": 32, "dropout": 0.0, "target_modules": "all-linear"}
    assert record["dtype"] == "float32" and len(record["weights"]) == 16


def test_a_checkpoint_of_another_architecture_is_refused_naming_both(model_zoo, tmp_path):
    _checkpoint(model_zoo["llama"], tmp_path / "ckpt")
    other = PolicyTrainer(model_zoo["gpt2"], TrainConfig(lr=1e-3))
    with pytest.raises(InvalidInputError) as info:
        other.load_checkpoint(tmp_path / "ckpt")
    message = str(info.value)
    assert str(model_zoo["llama"].resolve()) in message and str(model_zoo["gpt2"].resolve()) in message
    assert "another architecture" in message and "model_type 'llama' vs 'gpt2'" in message
    assert other.step == 0


def test_a_checkpoint_of_another_model_with_the_same_architecture_is_refused(tiny_model_dir, tmp_path):
    from agentgrad.demo.tiny import random_tiny_model

    _checkpoint(tiny_model_dir, tmp_path / "ckpt")
    sibling = random_tiny_model(tmp_path / "seed1", seed=1)  # same config, other weights
    trainer = PolicyTrainer(sibling, TrainConfig(lr=1e-3))
    with pytest.raises(InvalidInputError, match="other weights with the same architecture") as info:
        trainer.load_checkpoint(tmp_path / "ckpt")
    assert str(tiny_model_dir.resolve()) in str(info.value) and str(sibling.resolve()) in str(info.value)


def test_other_lora_settings_are_refused(tiny_model_dir, tmp_path):
    _checkpoint(tiny_model_dir, tmp_path / "lora", LoraSettings(r=4))
    with pytest.raises(InvalidInputError, match=r"other LoRA settings \(LoRA r=4 .* vs full fine-tuning\)"):
        PolicyTrainer(tiny_model_dir, TrainConfig(lr=1e-3)).load_checkpoint(tmp_path / "lora")
    with pytest.raises(InvalidInputError, match="other LoRA settings"):
        PolicyTrainer(tiny_model_dir, TrainConfig(lr=1e-3, lora=LoraSettings(r=8))).load_checkpoint(tmp_path / "lora")


def test_the_same_model_moved_still_resumes(tiny_model_dir, tmp_path, copy_model, caplog):
    trainer, _ = _checkpoint(tiny_model_dir, tmp_path / "ckpt")
    moved = PolicyTrainer(copy_model(tiny_model_dir), TrainConfig(lr=1e-3))
    with caplog.at_level(logging.INFO, logger="agentgrad.training.policy"):
        state = moved.load_checkpoint(tmp_path / "ckpt")
    assert state is not None and state["cursor"] == 4 and moved.step == 1
    assert "the same model (moved or copied)" in caplog.text
    for (name, a), (_, b) in zip(trainer.model.named_parameters(), moved.model.named_parameters(), strict=True):
        assert torch.equal(a, b), name


def test_an_old_checkpoint_without_the_record_loads_with_a_log_line(tiny_model_dir, model_zoo, tmp_path, caplog):
    _, target = _checkpoint(tiny_model_dir, tmp_path / "ckpt")
    state = json.loads((target / "state.json").read_text())
    del state["model"]
    (target / "state.json").write_text(json.dumps(state))
    trainer = PolicyTrainer(tiny_model_dir, TrainConfig(lr=1e-3))
    with caplog.at_level(logging.INFO, logger="agentgrad.training.policy"):
        assert trainer.load_checkpoint(tmp_path / "ckpt")["cursor"] == 4
    assert "does not record the model it came from" in caplog.text and trainer.step == 1
    # one of another architecture then gets a message naming the model, not a raw state_dict error
    with pytest.raises(InvalidInputError, match=f"does not fit model {model_zoo['llama']}"):
        PolicyTrainer(model_zoo["llama"], TrainConfig(lr=1e-3)).load_checkpoint(tmp_path / "ckpt")
