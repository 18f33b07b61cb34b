"""Helpers of the Agent Lightning compatibility tests: the examples, loaded as written or with the
one line an Agent Lightning user would keep (``import agentlightning as agl``) under the alias."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "agentlightning"
COMPAT_IMPORT = "from agentgrad.compat import agentlightning as agl\n"


@pytest.fixture
def agentlightning_alias() -> Iterator[ModuleType]:
    """``import agentlightning`` resolving to the compat module for the test, removed after."""
    from agentgrad.compat import agentlightning as compat

    before = {name: sys.modules.get(name) for name in compat.ALIASED_MODULES}
    assert compat.install_alias()
    yield compat
    for name, module in before.items():
        if module is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = module


@pytest.fixture
def load_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., ModuleType]:
    """``load_example("sql_agent", alias=True)``: the example as a fresh module from ``tmp_path``
    (importable by runner processes too). ``alias=True`` swaps its import line for Agent
    Lightning's own (the caller installs the alias first); nothing else in the file changes."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def load(name: str, *, alias: bool = False) -> ModuleType:
        source = (EXAMPLES / f"{name}.py").read_text()
        assert source.count(COMPAT_IMPORT) == 1, f"{name}.py must have exactly one compat import line"
        module_name = f"{name}_{'al' if alias else 'ag'}_{tmp_path.name.replace('-', '_')}"
        if alias:
            source = source.replace(COMPAT_IMPORT, "import agentlightning as agl\n")
        (tmp_path / f"{module_name}.py").write_text(source)
        return importlib.import_module(module_name)

    return load
