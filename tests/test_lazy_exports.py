"""Package exports: one lazy idiom (``agentgrad/_lazy.py``) in every ``__init__`` that re-exports.

Each such ``__init__`` has a table ``_EXPORTS`` (public name → defining module), a
``TYPE_CHECKING`` block importing exactly those names from exactly those modules (what editors
and type checkers read), and ``__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)``. The
table and the block are read here from the source, so they cannot drift apart.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "agentgrad"

#: Packages whose ``__init__`` re-exports names; a new one is found by ``_faces`` and must be added.
FACES = (
    "agentgrad",
    "agentgrad.adapters",
    "agentgrad.algorithms",
    "agentgrad.compat",
    "agentgrad.dashboard",
    "agentgrad.demo",
    "agentgrad.inference",
    "agentgrad.proxy",
    "agentgrad.scenarios.rag",
    "agentgrad.scenarios.sql",
    "agentgrad.store",
    "agentgrad.tracing",
    "agentgrad.training",
)

#: What ``import agentgrad`` (and importing each face) must not load.
HEAVY = (
    "torch",
    "transformers",
    "peft",
    "fastapi",
    "starlette",
    "uvicorn",
    "jinja2",
    "httpx",
    "pydantic",
    "psycopg",
    "openai",
    "opentelemetry",
)


def _init_of(package: str) -> Path:
    return SRC.joinpath(*package.split(".")[1:], "__init__.py")


def _faces() -> list[str]:
    """Packages whose ``__init__`` names exports: an ``__all__``, an ``_EXPORTS`` or a ``__getattr__``."""
    found = []
    for init in sorted(SRC.rglob("__init__.py")):
        tree = ast.parse(init.read_text(encoding="utf-8"))
        bound = {
            target.id
            for node in tree.body
            if isinstance(node, ast.Assign)
            for target in ast.walk(node)
            if isinstance(target, ast.Name) and isinstance(target.ctx, ast.Store)
        }
        bound |= {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
        if bound & {"__all__", "_EXPORTS", "__getattr__"}:
            found.append(".".join(("agentgrad", *init.parent.relative_to(SRC).parts)))
    return found


def _is_type_checking(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def _table(tree: ast.Module) -> dict[str, str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["_EXPORTS"]:
            return ast.literal_eval(node.value)
    raise AssertionError("no _EXPORTS table")


def _mirror(tree: ast.Module) -> tuple[dict[str, str], list[str]]:
    """The TYPE_CHECKING block's imports (name → module) and any that are not ``from m import X as X``."""
    names: dict[str, str] = {}
    odd: list[str] = []
    for node in tree.body:
        if not _is_type_checking(node):
            continue
        for statement in node.body:
            if not isinstance(statement, ast.ImportFrom):
                odd.append(ast.unparse(statement))
                continue
            for alias in statement.names:
                if alias.asname != alias.name:
                    odd.append(f"line {statement.lineno}: {ast.unparse(statement)} (write `import X as X`)")
                if alias.name in names:
                    odd.append(f"line {statement.lineno}: {alias.name} imported twice")
                names[alias.name] = statement.module or ""
    return names, odd


def test_every_face_is_listed() -> None:
    assert _faces() == sorted(FACES)


@pytest.mark.parametrize("package", FACES)
def test_face_uses_the_one_idiom(package: str) -> None:
    tree = ast.parse(_init_of(package).read_text(encoding="utf-8"))
    table = _table(tree)
    mirror, odd = _mirror(tree)
    assert odd == [], f"{package}: the TYPE_CHECKING block may only hold `from m import X as X` lines"
    only_table = {name: module for name, module in table.items() if mirror.get(name) != module}
    only_mirror = {name: module for name, module in mirror.items() if table.get(name) != module}
    assert only_table == only_mirror == {}, (
        f"{package}: _EXPORTS and the TYPE_CHECKING block differ\n"
        f"  in _EXPORTS only (or another module): {only_table}\n  in TYPE_CHECKING only: {only_mirror}"
    )

    hooks = [
        ast.unparse(node) for node in tree.body if isinstance(node, ast.Assign) and "lazy_exports" in ast.unparse(node)
    ]
    assert hooks == ["__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)"]
    assert not [node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "__getattr__"]
    runtime = [
        ast.unparse(node)
        for node in tree.body
        if isinstance(node, ast.ImportFrom)
        and (node.module or "").startswith("agentgrad")
        and node.module != "agentgrad._lazy"
    ]
    assert runtime == [], f"{package}: eager re-exports; put them in _EXPORTS"


@pytest.mark.parametrize("package", FACES)
def test_every_exported_name_resolves(package: str) -> None:
    module = importlib.import_module(package)
    table = _table(ast.parse(_init_of(package).read_text(encoding="utf-8")))
    assert set(table) <= set(module.__all__)
    assert set(module.__all__) <= set(dir(module))
    for name in module.__all__:
        try:
            value = getattr(module, name)
        except ModuleNotFoundError as exc:  # an optional extra (torch, fastapi) is not installed
            if (exc.name or "").startswith("agentgrad"):
                raise
            continue
        if name in table and name != "__version__":
            assert getattr(value, "__module__", table[name]) == table[name], f"{package}.{name}"


def test_unknown_names_raise_attribute_error() -> None:
    import agentgrad

    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        agentgrad.nope  # noqa: B018


def test_the_training_surface_is_exported_from_the_top() -> None:
    import agentgrad

    wanted = {
        "GRPO",
        "APO",
        "SFT",
        "Evaluate",
        "TrainConfig",
        "LLMProxy",
        "Engine",
        "ModelServer",
        "AgentGradError",
        "load_agent",
        "read_tasks",
        "instrument",
        "__version__",
    }
    assert wanted <= set(agentgrad.__all__)


def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_importing_the_package_and_its_faces_stays_light() -> None:
    faces = ", ".join(FACES)
    out = _run(
        f"import sys, {faces}; "
        f"print(sorted(m.partition('.')[0] for m in sys.modules if m.partition('.')[0] in {HEAVY!r}))"
    )
    assert out == "[]"
    assert (
        _run("import sys, agentgrad; print(sorted(m for m in sys.modules if m.startswith('agentgrad')))")
        == "['agentgrad', 'agentgrad._lazy']"
    )


def test_a_name_shared_with_its_module_stays_the_exported_object() -> None:
    # Importing the submodule first used to rebind the package attribute to the module.
    code = (
        "import sys, agentgrad.tracing.instrument, agentgrad.tracing as t, agentgrad; "
        "m = sys.modules['agentgrad.tracing.instrument']; "
        "print(t.instrument is m.instrument is agentgrad.instrument)"
    )
    assert _run(code) == "True"
