"""Small models of several architectures, built locally from configs in well under a second each.

``model_zoo[kind]`` is a Hugging Face directory with random weights and the tiny model's trained
tokenizer: ``qwen2`` (the tiny model itself: Qwen2.5-style template with tools), ``llama``
(the same template), ``gpt2`` (dropout 0.1 everywhere, absolute positions, context 256, and a
ChatML template with no tool section), ``no_template`` (a Llama without any chat template).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

#: ChatML without a tool section: renders messages, silently ignores ``tools``.
PLAIN_CHATML = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def build_model(kind: str, out: Path, seed: int = 0) -> Path:
    """A random model of architecture ``kind`` (``qwen2``, ``llama``, ``gpt2``, ``no_template``) in ``out``."""
    import torch
    from transformers import (
        GenerationConfig,
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
    )

    from agentgrad.demo.tiny import build_tokenizer, random_tiny_model

    if kind == "qwen2":
        return random_tiny_model(out, seed=seed)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out, seed=0)
    im_end, pad = tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")
    torch.manual_seed(seed)
    if kind == "gpt2":
        config = GPT2Config(
            vocab_size=len(tokenizer),
            n_positions=256,
            n_embd=64,
            n_layer=2,
            n_head=4,
            resid_pdrop=0.1,
            embd_pdrop=0.1,
            attn_pdrop=0.1,
            bos_token_id=im_end,
            eos_token_id=im_end,
            pad_token_id=pad,
        )
        model = GPT2LMHeadModel(config)
        tokenizer.chat_template = PLAIN_CHATML
    else:
        config = LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
            bos_token_id=None,
            eos_token_id=im_end,
            pad_token_id=pad,
            tie_word_embeddings=False,
        )
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=[im_end, pad], pad_token_id=pad)
    model.save_pretrained(str(out))
    for f in out.glob("chat_template.jinja"):
        f.unlink()
    if kind == "no_template":
        tokenizer.chat_template = None
    tokenizer.save_pretrained(str(out))
    return out


@pytest.fixture(scope="session")
def model_zoo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("zoo")
    return {kind: build_model(kind, root / kind) for kind in ("qwen2", "llama", "gpt2", "no_template")}


@pytest.fixture
def copy_model(tmp_path: Path):
    """A copy of a model directory at a new path (the same model, moved)."""

    def copy(src: Path, name: str = "moved") -> Path:
        return Path(shutil.copytree(src, tmp_path / name))

    return copy
