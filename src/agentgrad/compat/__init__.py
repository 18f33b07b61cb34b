"""Compatibility layers: code written for another library, run by AgentGrad.

:mod:`agentgrad.compat.agentlightning` offers the names Agent Lightning 0.x examples use
(``LitAgent``, ``Trainer``, ``VERL``, ``emit_reward``…) mapped onto AgentGrad, so such an agent runs
with one changed line::

    from agentgrad.compat import agentlightning as agl   # instead of: import agentlightning as agl

To leave even that line alone, :func:`install_alias` makes ``import agentlightning`` (and the
submodule paths the examples import from) resolve to the compat module — only when no real
``agentlightning`` is installed, so it never shadows one. ``agentgrad dev`` / ``train`` / ``runner``
call it before loading an agent; a script calls it itself, before its first ``import agentlightning``.

Importing this package imports nothing; ``install_alias`` (from the compat module) is imported on
first use. See docs/migrating-from-agent-lightning.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentgrad._lazy import lazy_exports

if TYPE_CHECKING:
    from agentgrad.compat.agentlightning import install_alias as install_alias

_EXPORTS = {"install_alias": "agentgrad.compat.agentlightning"}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
