"""The scenario models the package ships (``tiny-sql``, ``tiny-rag``): each shipped build is of its
recipe's current format, and ``--model NAME`` installs it from the package on first use instead of
building it (a build takes minutes; the shipped one is copied in a second)."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from agentgrad.cli import main
from agentgrad.cli.named_models import resolve_model
from agentgrad.scenarios.rag import model as rag_model
from agentgrad.scenarios.sql import model as sql_model

# (module, --model name, its build function, its build command)
SHIPPED = [
    pytest.param(sql_model, "tiny-sql", "build_sql_model", "build-sql", id="tiny-sql"),
    pytest.param(rag_model, "tiny-rag", "build_rag_model", "build-rag", id="tiny-rag"),
]


@pytest.mark.parametrize(("module", "name", "build", "command"), SHIPPED)
def test_the_shipped_build_is_of_the_current_recipe(module: ModuleType, name: str, build: str, command: str) -> None:
    manifest = json.loads((module.RECIPE.shipped / "agentgrad_build.json").read_text())
    assert manifest["name"] == name
    assert manifest["format"] == module.BUILD_FORMAT, (
        "the recipe changed (BUILD_FORMAT) but the shipped build did not: rebuild it with "
        f"`agentgrad models {command} --output {module.RECIPE.shipped}`"
    )


@pytest.mark.parametrize(("module", "name", "build", "command"), SHIPPED)
def test_a_named_model_is_installed_from_the_package_on_first_use(
    module: ModuleType,
    name: str,
    build: str,
    command: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("AGENTGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(module, build, lambda *a, **k: pytest.fail("built instead of installing"))
    path = resolve_model(name)
    assert path == tmp_path / "models" / name and (path / "config.json").is_file()
    assert f"installed the shipped build of {module.RECIPE.what}" in capsys.readouterr().out
    assert main(["models", command, "--if-missing"]) == 0  # already there: prints it, builds nothing
    assert capsys.readouterr().out.strip() == str(path)
