"""Export: a checkpoint (full or LoRA) or a live trainer → a Hugging Face directory whose greedy
answers equal the checkpoint's; the command; atomic replacement; what it refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from agentgrad.errors import InvalidInputError  # noqa: E402
from agentgrad.training import (  # noqa: E402
    LoraSettings,
    PolicyTrainer,
    Sample,
    TrainConfig,
    export_model,
)
from agentgrad.training.export import MANIFEST  # noqa: E402

ANSWER = "The answer is 42."


def _prompts(model_dir: Path, n: int = 20) -> list[list[int]]:
    from transformers import AutoTokenizer

    from agentgrad.demo import calc

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    problems = calc.generate_problems(n, 3, "test")
    return [calc.prompt_ids(tokenizer, p["question"]) for p in problems]


def _greedy(model, prompts: list[list[int]], max_new_tokens: int = 10) -> list[list[int]]:
    """Plain transformers greedy decoding, one prompt at a time (no padding to differ on)."""
    model.eval()
    out = []
    with torch.no_grad():
        for ids in prompts:
            x = torch.tensor([ids])
            y = model.generate(
                input_ids=x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=0,
            )
            out.append(y[0, len(ids) :].tolist())
    return out


def _trained_run(model_dir: Path, run_dir: Path, lora: LoraSettings | None) -> PolicyTrainer:
    """A trainer nudged towards answering every calculator question with ANSWER (far enough that
    its greedy answers differ from the base model's), checkpointed like GRPO does."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    answer = tokenizer.encode(ANSWER, add_special_tokens=False) + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    samples = [Sample(p, answer) for p in _prompts(model_dir, 8)]
    trainer = PolicyTrainer(model_dir, TrainConfig(lr=1e-2 if lora is None else 2e-2, lora=lora))
    for _ in range(8):
        trainer.nll_step(samples)
    trainer.save_checkpoint(run_dir / "checkpoints", cursor=0)
    return trainer


@pytest.mark.parametrize("lora", [None, LoraSettings(r=4)], ids=["full", "lora"])
def test_exported_model_answers_like_the_checkpoint(tiny_model_dir, tmp_path, lora):
    from transformers import AutoModelForCausalLM

    run = tmp_path / "run"
    trained = _trained_run(tiny_model_dir, run, lora)
    prompts = _prompts(tiny_model_dir)
    out = export_model(run, tmp_path / "exported")  # a run directory: its latest checkpoint
    assert out == tmp_path / "exported"
    names = {p.name for p in out.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "generation_config.json",
        MANIFEST,
    } <= names
    assert not any(n.startswith(".") for n in {p.name for p in tmp_path.iterdir()})  # no temp dir left
    assert (out / "chat_template.jinja").read_bytes() == (tiny_model_dir / "chat_template.jinja").read_bytes()
    assert json.loads((out / "config.json").read_text())["use_cache"] is True
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["base_model"] == str(tiny_model_dir.resolve()) and manifest["step"] == 8

    restored = PolicyTrainer(tiny_model_dir, TrainConfig(lr=1e-2, lora=lora))  # the checkpoint, as training has it
    restored.load_checkpoint(run / "checkpoints")
    expected = _greedy(restored.model, prompts)
    exported = _greedy(AutoModelForCausalLM.from_pretrained(str(out)), prompts)
    assert exported == expected
    base = _greedy(AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)), prompts)
    assert sum(a != b for a, b in zip(expected, base, strict=True)) >= 15  # the training is in the export
    # the live trainer exports the same model (for LoRA through a merged copy: its adapter stays)
    live = export_model(trained, tmp_path / "live")
    assert _greedy(AutoModelForCausalLM.from_pretrained(str(live)), prompts) == expected
    if lora is not None:
        assert any("lora_" in n for n, _ in trained.model.named_parameters())


def test_the_engine_serves_the_export_with_the_same_greedy_answers(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from agentgrad.inference.engine import Engine, SamplingParams

    run = tmp_path / "run"
    _trained_run(tiny_model_dir, run, None)
    out = export_model(run / "checkpoints", tmp_path / "exported")  # a checkpoint root: its latest
    prompts = _prompts(tiny_model_dir, 6)
    with Engine(out) as engine:
        served = [
            engine.generate(p, SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)).token_ids for p in prompts
        ]
    assert served == _greedy(AutoModelForCausalLM.from_pretrained(str(out)), prompts)


def test_export_model_command_prints_the_directory(tiny_model_dir, tmp_path, capsys):
    from agentgrad.cli import main

    run = tmp_path / "run"
    _trained_run(tiny_model_dir, run, None)
    step_dir = run / "checkpoints" / (run / "checkpoints" / "latest").read_text()
    assert main(["export-model", str(step_dir), str(tmp_path / "m")]) == 0  # a step-N checkpoint itself
    assert capsys.readouterr().out.strip() == str(tmp_path / "m")
    assert (tmp_path / "m" / "model.safetensors").is_file()
    assert main(["export-model", str(tmp_path / "nothing"), str(tmp_path / "x")]) == 1
    assert "no checkpoint at" in capsys.readouterr().err


def test_export_replaces_an_earlier_export_and_refuses_other_directories(tiny_model_dir, tmp_path):
    trainer = PolicyTrainer(tiny_model_dir, TrainConfig(lr=1e-2))
    best = export_model(trainer, tmp_path / "best")
    trainer.nll_step([Sample([5, 6, 7], [8, 9])])
    assert export_model(trainer, tmp_path / "best") == best  # training re-exports best/ at each new best
    assert json.loads((best / MANIFEST).read_text())["step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best"]
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    with pytest.raises(InvalidInputError, match="no export wrote"):
        export_model(trainer, other)
    assert (other / "notes.txt").read_text() == "keep me"


def test_old_checkpoint_without_model_record_needs_the_base_model(tiny_model_dir, tmp_path):
    trainer = PolicyTrainer(tiny_model_dir, TrainConfig(lr=1e-2))
    target = trainer.save_checkpoint(tmp_path / "ckpt")
    state = json.loads((target / "state.json").read_text())
    del state["model"]
    (target / "state.json").write_text(json.dumps(state))
    with pytest.raises(InvalidInputError, match="base_model"):
        export_model(tmp_path / "ckpt", tmp_path / "out")
    assert (
        export_model(tmp_path / "ckpt", tmp_path / "out", base_model=tiny_model_dir) / "model.safetensors"
    ).is_file()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_publishing_lora_weights_leaves_the_frozen_base_untouched(tiny_model_dir, dtype):
    """``engine_state_dict`` adds ΔW into new tensors: peft's merge-then-unmerge would round the
    frozen weights twice per publish (in bfloat16 that drift grows with every step)."""
    trainer = PolicyTrainer(tiny_model_dir, TrainConfig(lr=5e-2, lora=LoraSettings(r=4), dtype=dtype))
    trainer.nll_step([Sample([5, 6, 7, 8], [9, 10, 11])])
    frozen = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if not p.requires_grad}
    state = trainer.engine_state_dict()
    for _ in range(5):
        trainer.engine_state_dict()
    assert all(torch.equal(frozen[n], p) for n, p in trainer.model.named_parameters() if not p.requires_grad)
    merged = trainer.model.merge_and_unload().state_dict()  # peft's own merge, for reference
    assert state.keys() == merged.keys()
    for key, value in merged.items():
        assert torch.equal(state[key], value), key
