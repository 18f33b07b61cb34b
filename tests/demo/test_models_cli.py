"""``agentgrad models build-tiny``: arguments reach the builder; ``--if-missing`` keeps a current cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentgrad.cli import build_parser as _parser


def test_build_tiny_arguments_reach_the_builder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = []
    monkeypatch.setattr(
        "agentgrad.demo.tiny.build_tiny_model", lambda output, **kw: calls.append((output, kw)) or Path(output)
    )
    args = _parser().parse_args(
        ["models", "build-tiny", "--output", str(tmp_path), "--steps", "7", "--seed", "3", "--threads", "1"]
    )
    assert args.func(args) == 0
    assert calls == [(str(tmp_path), {"seed": 3, "threads": 1, "warmup_steps": 7})]
    assert capsys.readouterr().out.strip() == str(tmp_path)


def test_build_tiny_if_missing_keeps_a_current_cached_model(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from agentgrad.demo import tiny

    monkeypatch.setenv("AGENTGRAD_CACHE_DIR", str(tmp_path))
    cached = tiny.default_model_dir()
    cached.mkdir(parents=True)
    (cached / "agentgrad_build.json").write_text(json.dumps({"format": tiny.BUILD_FORMAT}))
    monkeypatch.setattr("agentgrad.demo.tiny.build_tiny_model", lambda *a, **kw: pytest.fail("rebuilt"))
    args = _parser().parse_args(["models", "build-tiny", "--if-missing"])
    assert args.func(args) == 0
    assert capsys.readouterr().out.strip() == str(cached)
    with pytest.raises(SystemExit, match="default model only"):
        args = _parser().parse_args(["models", "build-tiny", "--if-missing", "--steps", "5"])
        args.func(args)
