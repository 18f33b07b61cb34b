"""Where model directories are cached, and how one is installed whole or not at all.

Every writer of a model directory (the tiny model's build and shipped copy, a GGUF import, an
export) fills a staging directory beside the target and renames it into place, so a crash, an
interrupt or a bad input never leaves a half-written model where a loader would pick it up.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from agentgrad.errors import InvalidInputError


def models_cache_dir() -> Path:
    """The cache of model directories: ``$AGENTGRAD_CACHE_DIR/models``, else
    ``$XDG_CACHE_HOME/agentgrad/models``, else ``~/.cache/agentgrad/models``."""
    root = os.environ.get("AGENTGRAD_CACHE_DIR")
    if root:
        base = Path(root).expanduser()
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "agentgrad"
    return base / "models"


def check_replaceable(out: Path, marker: str, what: str) -> None:
    """Refuse ``out`` as the target of an ``what`` (``export``, ``import``) when it is a file, or a
    non-empty directory without ``marker`` (the file every ``what`` writes): replacing it would
    delete files that are not ours."""
    if out.exists() and not out.is_dir():
        raise InvalidInputError(f"{what} target {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / marker).is_file():
        raise InvalidInputError(
            f"{what} target {out} is a non-empty directory that no {what} wrote "
            f"(no {marker}): choose another directory, or empty it"
        )


@contextlib.contextmanager
def staged_dir(out: str | Path, *, label: str = "staging") -> Iterator[Path]:
    """Yield an empty directory beside ``out`` to write a model into. When the block ends
    normally it replaces ``out`` (a rename; a directory already there is moved aside first and
    removed after); when the block raises, it is removed and ``out`` is left as it was."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.{label}-", dir=out.parent))
    try:
        yield tmp
        _swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _swap_into_place(tmp: Path, out: Path) -> None:
    """Put ``tmp`` at ``out``: a rename; an earlier directory there is moved aside first."""
    if not out.exists():
        os.replace(tmp, out)
        return
    if out.is_dir() and not any(out.iterdir()):
        out.rmdir()
        os.replace(tmp, out)
        return
    old = out.with_name(f".{out.name}.old-{os.getpid()}-{time.monotonic_ns()}")
    os.replace(out, old)
    os.replace(tmp, out)
    if old.is_dir():
        shutil.rmtree(old, ignore_errors=True)
    else:
        old.unlink()


@contextlib.contextmanager
def install_lock(lock_path: Path, activity: str) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_path`` while installing a model, saying so (``activity``:
    what the holder does) when another process holds it: concurrent first uses take turns, and
    the later ones reuse the result."""
    import fcntl

    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another process {activity} (lock {lock_path})", flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


__all__ = ["check_replaceable", "install_lock", "models_cache_dir", "staged_dir"]
