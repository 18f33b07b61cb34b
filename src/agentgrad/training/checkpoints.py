"""Checkpoint directories: ``step-NNNNNN/`` folders and a ``latest`` pointer, written so that a
kill at any moment leaves the previous checkpoint intact and loadable.

Every trainer (the local PyTorch one, the Tinker one) lays its checkpoints out this way, so
``find_checkpoint``, ``export-model`` and resuming read all of them alike.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

LATEST = "latest"


def commit_checkpoint(directory: str | Path, step: int, fill: Callable[[Path], None], *, keep: int = 2) -> Path:
    """Write checkpoint ``step`` under ``directory`` and point ``latest`` at it; return its folder.

    ``fill`` writes the checkpoint's files into a staging folder; only when it returns is the
    folder renamed into place and then the pointer replaced (both atomic renames). The newest
    ``keep`` checkpoints stay; older ones are removed.
    """
    root = Path(directory)
    target = root / f"step-{step:06d}"
    tmp = root / f".tmp-step-{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    fill(tmp)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
    pointer = root / ".latest.tmp"
    pointer.write_text(target.name)
    os.replace(pointer, root / LATEST)
    for old in sorted(root.glob("step-*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return target


def latest_checkpoint(directory: str | Path) -> Path | None:
    """The folder ``latest`` points at under ``directory``, or None when there is no checkpoint."""
    pointer = Path(directory) / LATEST
    if not pointer.exists():
        return None
    return Path(directory) / pointer.read_text().strip()


def find_checkpoint(path: str | Path) -> Path:
    """The checkpoint ``path`` names: a checkpoint itself (``step-NNNNNN/`` with ``state.json``),
    a checkpoint root (its ``latest``), or a run directory (``checkpoints/latest``)."""
    from agentgrad.errors import InvalidInputError

    p = Path(path)
    if (p / "state.json").is_file():
        return p
    for root in (p, p / "checkpoints"):
        target = latest_checkpoint(root)
        if target is not None:
            if not (target / "state.json").is_file():
                raise InvalidInputError(f"{root / LATEST} points at {target}, which holds no checkpoint")
            return target
    raise InvalidInputError(
        f"no checkpoint at {p}: expected a checkpoint (a step-NNNNNN directory with "
        "state.json), a checkpoint root (with a 'latest' file) or a run directory "
        "(with checkpoints/latest)" + ("" if p.exists() else f"; {p} does not exist")
    )
