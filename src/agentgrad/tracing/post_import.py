"""Run a function when a module is imported — or now, if it already is.

:func:`agentgrad.tracing.instrument` patches a few framework entry points so LLM calls can be
named after the calling agent. It must neither import a framework the agent does not use (CrewAI
alone takes seconds and a gigabyte) nor miss one imported later, lazily, inside the first rollout
— then the first rollout's calls would go unnamed. So a patch waits for its module: a finder at
the front of ``sys.meta_path`` notices the import of a watched module name, lets the normal
machinery load it, and runs the callbacks right after the module's code has executed (before the
importer sees it, so ``from module import function`` already gets the patched function).

A finder only sees watched names (one dict lookup for every other import) and is never removed;
callbacks run once. A failing callback is logged and does not break the import.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

log = logging.getLogger(__name__)

Callback = Callable[[ModuleType], None]

_lock = threading.Lock()
_waiting: dict[str, list[Callback]] = {}
_finder: _Finder | None = None


def when_imported(module_name: str, callback: Callback) -> None:
    """Call ``callback(module)`` once ``module_name`` is imported (at once if it already is)."""
    with _lock:
        module = sys.modules.get(module_name)
        if module is None:
            _waiting.setdefault(module_name, []).append(callback)
            _install_finder()
            return
    _run(module, [callback])


def _run(module: ModuleType, callbacks: Sequence[Callback]) -> None:
    for callback in callbacks:
        try:
            callback(module)
        except Exception:  # a broken patch must never break the user's import
            log.warning("post-import hook for %s failed", module.__name__, exc_info=True)


def _install_finder() -> None:
    global _finder
    if _finder is None:
        _finder = _Finder()
        sys.meta_path.insert(0, _finder)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a watched name it asks the finders after it, then wraps the loader."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _waiting:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


class _Loader(importlib.abc.Loader):
    """The real loader, plus the waiting callbacks after the module's code ran."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # The module keeps its real loader (importlib.resources, pkgutil and reloads use it).
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        with _lock:
            callbacks = _waiting.pop(module.__name__, [])
        _run(module, callbacks)

    def __getattr__(self, name: str) -> Any:  # get_data, get_source, is_package, ...
        return getattr(self._loader, name)
