"""What may import what inside ``src/agentgrad``: one rule table, no upward imports, no cycles.

``LAYERS`` lists the floors of the package, lowest first. A module may import modules on its own
floor or on any floor below; ``FORBIDDEN`` names the few downward or sideways imports the design
still rules out (the local engine knows nothing of the store). A module never imports its own
package's ``__init__`` (the package's face, which re-exports its submodules), and no modules or
floors import each other in a circle. ``docs/architecture.md`` describes the same table in
prose; when a module moves, change both.

Every import counts: at the top of a file, inside a function (the lazy imports that keep
``import agentgrad`` light still run when the function does), under ``TYPE_CHECKING`` (the
mirrors that let editors see lazy exports still name the dependency), and
``importlib.import_module("agentgrad...")`` with a literal name. ``from agentgrad import semconv``
counts as an import of the module ``agentgrad.semconv``; ``from agentgrad.store import
TOKEN_ENV`` as an import of ``agentgrad.store``'s ``__init__``.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = "agentgrad"
SRC = Path(__file__).resolve().parents[1] / "src" / PACKAGE

#: The floors, lowest first. An entry names a module or a package (and then everything under it,
#: unless a longer entry names a part of it: ``agentgrad.store.service`` sits above the rest of
#: ``agentgrad.store``). The entry ``agentgrad`` names the package's own ``__init__`` only.
LAYERS: tuple[tuple[str, ...], ...] = (
    # foundations: the data model, span names, errors, the reward rule, the version
    (
        "agentgrad._version",
        "agentgrad._lazy",
        "agentgrad.config",
        "agentgrad.errors",
        "agentgrad.semconv",
        "agentgrad.types",
        "agentgrad.rewards",
    ),
    # the agent interface and task files
    ("agentgrad.agents", "agentgrad.tasks"),
    # HTTP plumbing shared by every service and client
    ("agentgrad.http",),
    # storage: protocol, semantics, backends, the HTTP client
    ("agentgrad.store",),
    # the store as an HTTP service
    ("agentgrad.store.service",),
    # the rollout context of the running code and the emitters that write spans into its store
    ("agentgrad.context", "agentgrad.emit"),
    # capture
    ("agentgrad.tracing", "agentgrad.proxy"),
    # the local engine and model server (see FORBIDDEN: it knows nothing of the store); model files
    # brought in from elsewhere (GGUF import)
    ("agentgrad.inference", "agentgrad.models"),
    # running agents; reading spans back into LLM calls and transitions
    ("agentgrad.runner", "agentgrad.adapters"),
    # learning
    ("agentgrad.algorithms", "agentgrad.training"),
    # wiring a store, runners and an algorithm
    ("agentgrad.trainer",),
    # the package's face: lazy re-exports of the public API
    ("agentgrad",),
    # other libraries' names mapped onto AgentGrad (Agent Lightning)
    ("agentgrad.compat",),
    # the web UI over a store
    ("agentgrad.dashboard",),
    # the calculator demo and the paper's scenario worlds (SQL, RAG), shipped inside the package
    ("agentgrad.demo", "agentgrad.scenarios"),
    # entry points
    ("agentgrad.cli", "agentgrad.__main__"),
    # stand-ins for tests and benchmarks: may use anything, imported by nothing in the package
    ("agentgrad.testing",),
)

#: Imports ruled out although the floors allow them: (importer, imported, why). Entries name
#: modules or packages, as in LAYERS.
FORBIDDEN: tuple[tuple[str, str, str], ...] = (
    ("agentgrad.inference", "agentgrad.store", "the inference engine knows nothing of the store"),
)


@dataclass(frozen=True)
class Edge:
    """One import: ``source`` imports ``target`` (both module names) at ``where`` (file:line)."""

    source: str
    target: str
    where: str

    def __str__(self) -> str:
        return f"{self.where}: {self.source} -> {self.target}"


# --- reading the package's imports ------------------------------------------------------------


def package_modules(root: Path = SRC, package: str = PACKAGE) -> dict[str, Path]:
    """Every module of the package by dotted name (a package's ``__init__`` under its own name)."""
    modules: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = (package, *path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _is_package(name: str, modules: Mapping[str, Path]) -> bool:
    return modules[name].name == "__init__.py"


def _import_module_literal(node: ast.Call) -> str | None:
    """The literal name of an ``importlib.import_module("...")`` call, if ``node`` is one."""
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if called != "import_module" or not node.args:
        return None
    first = node.args[0]
    return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None


def _imports(module: str, tree: ast.Module, modules: Mapping[str, Path]) -> Iterator[tuple[ast.AST, str, str | None]]:
    """Each import in ``tree``, anywhere in it: (node, the module named, the name taken from it or None).

    ``from m import x`` where ``m.x`` is a module yields ``(node, "m.x", None)``.
    """
    here = module if _is_package(module, modules) else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node, alias.name, None
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parents = here.split(".")[: len(here.split(".")) - node.level + 1]
                base = ".".join([*parents, node.module] if node.module else parents)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                yield (node, submodule, None) if submodule in modules else (node, base, alias.name)
        elif isinstance(node, ast.Call) and (literal := _import_module_literal(node)):
            yield node, literal, None


def _shown(path: Path, repo: Path | None) -> Path:
    repo = repo if repo is not None else SRC.parents[1]
    return path.relative_to(repo) if path.is_relative_to(repo) else path


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def import_edges(modules: Mapping[str, Path], package: str = PACKAGE, repo: Path | None = None) -> list[Edge]:
    """Every import from one module of the package to another, wherever in the file it sits."""
    edges: list[Edge] = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node, target, _ in _imports(module, tree, modules):
            if not _within(target, package):
                continue
            while target not in modules and "." in target:  # a module that is not there: its parent runs
                target = target.rpartition(".")[0]
            if target != module:
                edges.append(Edge(module, target, f"{_shown(path, repo)}:{node.lineno}"))
    return list(dict.fromkeys(edges))  # `from m import a, b` is one edge


def _bound_names(tree: ast.Module) -> set[str]:
    """Names a module binds at its top level, in ``if``/``try``/``with`` blocks too."""
    names: set[str] = set()
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).partition(".")[0] for alias in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name))
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                pending.extend(getattr(node, field, []))
    return names


def missing_imports(modules: Mapping[str, Path], package: str = PACKAGE, repo: Path | None = None) -> list[str]:
    """Imports of the package's modules or names that do not exist (a move that missed a caller)."""
    trees = {module: ast.parse(path.read_text(encoding="utf-8")) for module, path in modules.items()}
    bound = {module: _bound_names(tree) for module, tree in trees.items()}
    problems = []
    for module, tree in trees.items():
        for node, target, name in _imports(module, tree, modules):
            where = f"{_shown(modules[module], repo)}:{node.lineno}"
            if not _within(target, package):
                continue
            if target not in modules:
                problems.append(f"{where}: {module} imports {target}, which does not exist")
            elif name is not None and name != "*" and name not in bound[target]:
                problems.append(f"{where}: {module} imports {name} from {target}, which does not define it")
    return problems


# --- the rules ----------------------------------------------------------------------------------


def unit_of(module: str, layers: Sequence[Sequence[str]] = LAYERS) -> str | None:
    """The LAYERS entry a module belongs to: the longest entry naming it or a package above it.

    The top package's own entry (``agentgrad``) names its ``__init__`` alone.
    """
    best = None
    for floor in layers:
        for entry in floor:
            covers = module == entry if "." not in entry else _within(module, entry)
            if covers and (best is None or len(entry) > len(best)):
                best = entry
    return best


def _floors(layers: Sequence[Sequence[str]]) -> dict[str, int]:
    return {entry: number for number, floor in enumerate(layers) for entry in floor}


def rule_breaks(
    edges: Iterable[Edge],
    modules: Iterable[str],
    layers: Sequence[Sequence[str]] = LAYERS,
    forbidden: Sequence[tuple[str, str, str]] = FORBIDDEN,
    package_names: Iterable[str] = (),
) -> list[str]:
    """Modules LAYERS does not place, and imports that go upward or that FORBIDDEN rules out."""
    floors = _floors(layers)
    packages = set(package_names)
    problems = [
        f"{module}: not on any floor of LAYERS (place it in the table)"
        for module in sorted(modules)
        if unit_of(module, layers) is None
    ]
    for edge in edges:
        source_unit, target_unit = unit_of(edge.source, layers), unit_of(edge.target, layers)
        if source_unit is None or target_unit is None:
            continue
        source_floor, target_floor = floors[source_unit], floors[target_unit]
        if target_floor > source_floor:
            problems.append(
                f"{edge}  (upward: floor {source_floor} {source_unit} imports floor {target_floor} {target_unit})"
            )
        elif source_unit == target_unit and edge.target in packages and edge.source.startswith(edge.target + "."):
            problems.append(f"{edge}  (imports its own package's __init__)")
        for importer, imported, why in forbidden:
            if _within(edge.source, importer) and _within(edge.target, imported) and not _within(edge.source, imported):
                problems.append(f"{edge}  (forbidden: {why})")
    return problems


def _strongly_connected(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one node, each sorted, in a stable order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:  # recursion depth is bounded by the package's module count
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph.get(node, ())):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)


def cycles(edges: Sequence[Edge], layers: Sequence[Sequence[str]] = LAYERS) -> list[str]:
    """Circles of imports between modules, and between LAYERS entries; each with the edges in it."""
    problems = []
    for level, key in (("modules", lambda module: module), ("floor entries", lambda module: unit_of(module, layers))):
        graph: dict[str, set[str]] = defaultdict(set)
        named: dict[tuple[str, str], list[Edge]] = defaultdict(list)
        for edge in edges:
            source, target = key(edge.source), key(edge.target)
            if source is None or target is None or source == target:
                continue
            graph[source].add(target)
            named[source, target].append(edge)
        for component in _strongly_connected(graph):
            members = set(component)
            inside = [
                str(edge)
                for pair, found in sorted(named.items())
                if pair[0] in members and pair[1] in members
                for edge in found
            ]
            problems.append(f"cycle between {level} {', '.join(component)}:\n      " + "\n      ".join(inside))
    return problems


# --- the checks ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def graph() -> tuple[dict[str, Path], list[Edge]]:
    modules = package_modules()
    return modules, import_edges(modules)


def test_no_import_goes_upward(graph: tuple[dict[str, Path], list[Edge]]) -> None:
    modules, edges = graph
    problems = rule_breaks(edges, modules, package_names=[name for name in modules if _is_package(name, modules)])
    assert not problems, "imports against LAYERS in tests/test_layering.py:\n  " + "\n  ".join(problems)


def test_no_import_cycles(graph: tuple[dict[str, Path], list[Edge]]) -> None:
    _, edges = graph
    problems = cycles(edges)
    assert not problems, "import cycles:\n  " + "\n  ".join(problems)


def test_every_import_names_a_module_and_a_name_that_exist(graph: tuple[dict[str, Path], list[Edge]]) -> None:
    modules, _ = graph
    problems = missing_imports(modules)
    assert not problems, "imports of what is not there:\n  " + "\n  ".join(problems)


def test_every_floor_entry_exists(graph: tuple[dict[str, Path], list[Edge]]) -> None:
    modules, _ = graph
    entries = [entry for floor in LAYERS for entry in floor]
    assert len(entries) == len(set(entries)), "an entry appears twice in LAYERS"
    assert [entry for entry in entries if entry not in modules] == []


def test_the_reader_sees_every_kind_of_import(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("from pkg import low\n")
    (root / "low.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from pkg.sub.high import Thing\n"
        "def f():\n    import pkg.sub.high\n    from . import sub\n"
        "    importlib.import_module('pkg.sub')\n"
        "from pkg.sub import NAME, high\n"
    )
    (root / "sub" / "__init__.py").write_text("")
    (root / "sub" / "high.py").write_text("from ..low import f\nimport os\nclass Thing: ...\n")
    modules = package_modules(root, "pkg")
    edges = import_edges(modules, "pkg", tmp_path)
    found = {(edge.source, edge.target, edge.where.rpartition(":")[2]) for edge in edges}
    assert found == {
        ("pkg", "pkg.low", "1"),
        ("pkg.low", "pkg.sub.high", "3"),
        ("pkg.low", "pkg.sub.high", "5"),
        ("pkg.low", "pkg.sub", "6"),
        ("pkg.low", "pkg.sub", "7"),
        ("pkg.low", "pkg.sub", "8"),
        ("pkg.low", "pkg.sub.high", "8"),
        ("pkg.sub.high", "pkg.low", "1"),
    }
    assert missing_imports(modules, "pkg", tmp_path) == [
        "pkg/low.py:8: pkg.low imports NAME from pkg.sub, which does not define it",
    ]
    (root / "sub" / "__init__.py").write_text("if True:\n    NAME = 1\nfrom pkg.gone import x\n")
    assert missing_imports(package_modules(root, "pkg"), "pkg", tmp_path) == [
        "pkg/sub/__init__.py:3: pkg.sub imports pkg.gone, which does not exist",
    ]


def test_the_checker_catches_an_upward_import_a_forbidden_one_and_a_cycle() -> None:
    layers = (("p.low",), ("p.mid", "p.side"), ("p",), ("p.high",))
    forbidden = (("p.side", "p.low", "side stays apart"),)
    edges = [
        Edge("p.low.a", "p.high", "low/a.py:3"),  # upward
        Edge("p.high", "p.low.a", "high.py:1"),  # downward: fine, but closes a cycle with the one above
        Edge("p.mid", "p.low.b", "mid.py:2"),  # downward: fine
        Edge("p.side", "p.low.b", "side.py:4"),  # downward, but forbidden
        Edge("p.mid.x", "p.mid", "mid/x.py:5"),  # a submodule importing its package's face
        Edge("p.mid", "p.side", "mid.py:7"),  # same floor: fine, no cycle
        Edge("p.high", "p", "high.py:9"),  # the top package's face, from a floor above it: fine
    ]
    modules = ["p", "p.low.a", "p.low.b", "p.mid", "p.mid.x", "p.side", "p.high", "p.elsewhere"]
    problems = rule_breaks(edges, modules, layers, forbidden, package_names=["p", "p.mid"])
    assert problems == [
        "p.elsewhere: not on any floor of LAYERS (place it in the table)",
        "low/a.py:3: p.low.a -> p.high  (upward: floor 0 p.low imports floor 3 p.high)",
        "side.py:4: p.side -> p.low.b  (forbidden: side stays apart)",
        "mid/x.py:5: p.mid.x -> p.mid  (imports its own package's __init__)",
    ]
    circle = "\n      high.py:1: p.high -> p.low.a\n      low/a.py:3: p.low.a -> p.high"
    assert cycles(edges, layers) == [
        "cycle between modules p.high, p.low.a:" + circle,
        "cycle between floor entries p.high, p.low:" + circle,
    ]
    assert cycles([edge for edge in edges if edge.where != "high.py:1"], layers) == []
