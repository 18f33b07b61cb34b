"""Lazy package exports: the one idiom every ``__init__`` that re-exports names uses.

A package's ``__init__`` lists what it exports in a table, public name → the module that
defines it, and gets its module-level ``__getattr__`` and ``__dir__`` from :func:`lazy_exports`.
A name's module is imported the first time the name is looked up, so ``import agentgrad`` or
``import agentgrad.store`` imports no submodule, and nothing heavy (pydantic, httpx, torch,
FastAPI). A ``TYPE_CHECKING`` block in the same file imports the same names from the same
modules, in the re-export form ``from m import X as X``, so editors and type checkers see each
name and its type; ``tests/test_lazy_exports.py`` reads both and fails when they differ::

    from typing import TYPE_CHECKING

    from agentgrad._lazy import lazy_exports

    if TYPE_CHECKING:
        from agentgrad.store.memory import MemoryStore as MemoryStore

    _EXPORTS = {"MemoryStore": "agentgrad.store.memory"}

    __all__ = list(_EXPORTS)
    __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

Names the ``__init__`` defines itself (``open_store``, ``TOKEN_ENV``) are ordinary module
attributes; they join ``__all__`` but not the table.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, which exports ``exports`` lazily.

    ``exports`` maps each public name to the module that defines it. A looked-up name is bound
    on the package, so later lookups are plain attribute reads.

    A name exported from a submodule of the same name (``agentgrad.tracing.instrument``, the
    function, from ``agentgrad.tracing.instrument``, the module) is bound at once instead: the
    first import of that submodule, from anywhere, sets the package's attribute of that name to
    the module, and a lazy lookup would never run.
    """

    def __getattr__(name: str) -> Any:
        module_name = exports.get(name)
        if module_name is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}", name=name, obj=sys.modules[package])
        value = getattr(importlib.import_module(module_name), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *exports})

    for name, module_name in exports.items():
        if module_name == f"{package}.{name}":
            setattr(sys.modules[package], name, getattr(importlib.import_module(module_name), name))
    return __getattr__, __dir__
