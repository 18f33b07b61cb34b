"""The embedded tiny model: a normal HF directory with a Qwen2.5-style tool chat template."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agentgrad.demo import calc, tiny


def test_random_tiny_model_loads_through_auto_classes(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.monotonic()
    path = tiny.random_tiny_model(tmp_path / "m")
    elapsed = time.monotonic() - started
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.config.model_type == "qwen2" and model.config.vocab_size == len(tokenizer)
    assert sum(p.numel() for p in model.parameters()) < 1_500_000
    assert elapsed < 30  # ≈ 1 s after imports on an idle machine; generous for loaded CI
    text = "What is 12 * 34?\n<tool_call>"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    assert [tokenizer.decode([i]) for i in tokenizer.encode("123", add_special_tokens=False)] == ["1", "2", "3"]


def test_chat_template_renders_tools_like_qwen(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny.random_tiny_model(tmp_path / "m"))
    messages = [{"role": "system", "content": calc.SYSTEM_PROMPT}, {"role": "user", "content": "What is 2 + 3?"}]
    text = tokenizer.apply_chat_template(
        messages, tools=[calc.CALCULATOR_TOOL], add_generation_prompt=True, tokenize=False
    )
    assert text.startswith("<|im_start|>system\n" + calc.SYSTEM_PROMPT + "\n\n# Tools\n")
    assert '"name": "calculator"' in text and text.endswith("<|im_start|>assistant\n")
    full = messages + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": {"expression": "2 + 3"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c", "content": "5"},
    ]
    rendered = tokenizer.apply_chat_template(full, tools=[calc.CALCULATOR_TOOL], tokenize=False)
    assert calc.tool_call_text("2 + 3") + "<|im_end|>" in rendered
    assert "<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>" in rendered
    plain = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert plain == "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"


def test_training_samples_are_prefix_stable(tmp_path: Path) -> None:
    """Each turn's prompt, tokenized alone, extends the previous prompt + completion exactly."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny.random_tiny_model(tmp_path / "m"))
    for problem in calc.generate_problems(20, 0):
        ids, mask = tiny.encode_sample(tokenizer, problem)
        assert len(ids) == len(mask) and 0 < sum(mask) < len(ids)
        assert str(problem["answer"]) in tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])


def test_direct_answer_samples_skip_the_tool(tmp_path: Path) -> None:
    """The warm-up's bad habit: one trained turn, the final answer, no tool call."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny.random_tiny_model(tmp_path / "m"))
    problem = calc.generate_problems(1, 0)[0]
    ids, mask = tiny.encode_sample(tokenizer, problem, direct=True)
    trained = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    assert trained == calc.final_answer_text(problem["answer"]) + "<|im_end|>"
    assert mask == [0] * (len(ids) - sum(mask)) + [1] * sum(mask)  # one trained turn, at the end
    with_tool, _ = tiny.encode_sample(tokenizer, problem)
    assert with_tool[: len(ids) - sum(mask)] == ids[: len(ids) - sum(mask)]  # same prompt either way


def test_batch_encoding_matches_one_by_one(tmp_path: Path) -> None:
    """The build encodes its conversations in batches: a batch mixing tool and direct-answer
    conversations (different turn counts) yields each one exactly as encoding it alone."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny.random_tiny_model(tmp_path / "m"))
    problems = calc.generate_problems(12, 3)
    direct = [i % 3 == 1 for i in range(len(problems))]
    batch = tiny.encode_samples(tokenizer, problems, direct)
    assert batch == [tiny.encode_sample(tokenizer, p, d) for p, d in zip(problems, direct, strict=True)]
    assert len({len(ids) for ids, _ in batch}) > 1


def test_default_model_dir_honours_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("AGENTGRAD_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert tiny.default_model_dir() == tmp_path / "xdg" / "agentgrad" / "models" / "tiny-calc"
    monkeypatch.setenv("AGENTGRAD_CACHE_DIR", str(tmp_path / "ag"))
    assert tiny.default_model_dir() == tmp_path / "ag" / "models" / "tiny-calc"


def test_concurrent_callers_share_one_build(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ensure_tiny_model's lock: the second caller waits for the first one's build and reuses it.
    (The builder here only writes the manifest: the lock, not the build, is under test.)"""
    import json
    import threading
    import time

    monkeypatch.setenv("AGENTGRAD_CACHE_DIR", str(tmp_path))
    builds = []

    def build(path: Path, threads: int | None = None) -> Path:
        builds.append(path)
        time.sleep(0.5)
        path.mkdir(parents=True)
        (path / "agentgrad_build.json").write_text(json.dumps({"format": tiny.BUILD_FORMAT}))
        return path

    monkeypatch.setattr(tiny, "build_tiny_model", build)
    monkeypatch.setattr(tiny, "SHIPPED_MODEL_DIR", tmp_path / "none-shipped")  # so it must build
    results: list[Path] = []
    callers = [threading.Thread(target=lambda: results.append(tiny.ensure_tiny_model())) for _ in range(2)]
    for caller in callers:
        caller.start()
        time.sleep(0.1)
    for caller in callers:
        caller.join(10)
    assert results == [tiny.default_model_dir()] * 2 and len(builds) == 1
    assert "waiting for another process building the tiny model" in capsys.readouterr().out


def test_the_shipped_model_is_of_the_current_recipe() -> None:
    import json

    build = json.loads((tiny.SHIPPED_MODEL_DIR / "agentgrad_build.json").read_text())
    assert build["format"] == tiny.BUILD_FORMAT, (
        "the recipe changed (BUILD_FORMAT) but the shipped build did not: rebuild it with "
        "`agentgrad models build-tiny --output src/agentgrad/demo/data/tiny-calc` and check its band"
    )
    assert 0.3 <= build["val_greedy_success"] <= 0.6 and build["val_greedy_tool_success"] > 0.9


def test_first_use_installs_the_shipped_build_instead_of_building(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import json

    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("AGENTGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tiny, "build_tiny_model", lambda *a, **k: pytest.fail("built instead of installing"))
    stale = tiny.default_model_dir()
    stale.mkdir(parents=True)
    (stale / "agentgrad_build.json").write_text(json.dumps({"format": tiny.BUILD_FORMAT - 1}))  # an older recipe
    path = tiny.ensure_tiny_model()
    assert path == stale and tiny._is_current(path)
    assert sorted(f.name for f in path.iterdir()) == sorted(f.name for f in tiny.SHIPPED_MODEL_DIR.iterdir())
    left = sorted(p.name for p in tmp_path.joinpath("models").iterdir() if not p.name.endswith(".lock"))
    assert left == ["tiny-calc"]  # no staging directory left behind
    AutoTokenizer.from_pretrained(path)
    assert AutoModelForCausalLM.from_pretrained(path).num_parameters() > 0
