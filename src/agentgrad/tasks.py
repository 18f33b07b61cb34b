"""Task files: what ``agentgrad dev``, ``agentgrad train`` and the examples read tasks from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentgrad.errors import InvalidInputError


def read_tasks(path: str) -> list[Any]:
    """Tasks from a JSONL file (one JSON value per line) or a JSON array file."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInputError(f"cannot read tasks file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if text.lstrip().startswith("["):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            if exc.msg != "Extra data":  # "Extra data": JSONL whose lines are arrays
                raise InvalidInputError(f"{path}:{exc.lineno}: not JSON ({exc.msg})") from None
    tasks = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                tasks.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise InvalidInputError(f"{path}:{number}: not JSON ({exc.msg})") from None
    return tasks
