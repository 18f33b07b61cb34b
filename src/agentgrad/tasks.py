"""Task files: what ``agentgrad dev``, ``agentgrad train`` and the examples read tasks from.

:func:`read_tasks` takes a file or tasks already in memory. The file's format comes from its
extension:

========================  ===================================================================
``.jsonl``, ``.ndjson``   one JSON value per line (blank lines are skipped)
``.json``                 a JSON array of tasks (a file of one JSON value per line also works)
``.csv``, ``.tsv``        a header row, then one task per row: a dict from column name (spaces
                          around it stripped) to the cell's text. Values stay strings, always
                          (``"007"`` stays ``"007"``, ``"true"`` stays ``"true"``, an empty cell
                          is ``""``): convert in the agent, or use JSONL/Parquet when tasks need
                          numbers or nested values
``.parquet``              one task per row, a dict with the column's Python values (needs
                          ``pyarrow``: ``pip install 'agentgrad[export]'``)
anything else             sniffed: a JSON array if the text starts with ``[``, else JSONL
========================  ===================================================================

A line or row that cannot be read is reported with the file and its line (row for Parquet)
number, and a file without tasks is an error: the run does not start on bad input.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from agentgrad.errors import InvalidInputError

#: Extensions :func:`read_tasks` knows, and the reader each one gets.
FORMATS: dict[str, str] = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".csv": "csv",
    ".tsv": "tsv",
    ".parquet": "parquet",
    ".pq": "parquet",
}


def read_tasks(source: str | os.PathLike[str] | Iterable[Any]) -> list[Any]:
    """The tasks in ``source``: a task file (see the module's table of formats), or tasks in memory.

    A list, tuple or other iterable of tasks is returned as a list, unchanged (a pandas
    ``DataFrame`` gives one dict per row). Errors are :class:`~agentgrad.errors.InvalidInputError`
    naming the file and line: a line that is not JSON, a CSV row with more or fewer cells than the
    header, a Parquet value that is not JSON (a timestamp, bytes), an empty file.
    """
    if isinstance(source, (str, os.PathLike)):
        return _read_file(Path(source), str(source))
    if isinstance(source, (bytes, bytearray, Mapping)):
        raise InvalidInputError(f"tasks must be a file path or a list of tasks, got a {type(source).__name__}")
    if hasattr(source, "columns") and hasattr(source, "to_dict"):  # a pandas DataFrame: its rows
        return list(source.to_dict(orient="records"))
    if isinstance(source, Iterable):
        return list(source)
    raise InvalidInputError(f"tasks must be a file path or a list of tasks, got a {type(source).__name__}")


def _read_file(path: Path, shown: str) -> list[Any]:
    kind = FORMATS.get(path.suffix.lower(), "sniff")
    if kind == "parquet":
        tasks = _read_parquet(path, shown)
    else:
        try:
            text = path.read_text(encoding="utf-8-sig")  # -sig: a byte-order mark is not part of the data
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or exc
            raise InvalidInputError(f"cannot read tasks file {shown}: {reason}") from None
        if kind in ("csv", "tsv"):
            tasks = _read_csv(text, shown, delimiter="," if kind == "csv" else "\t")
        elif kind == "jsonl":
            tasks = _read_jsonl(text, shown)
        elif kind == "json" or text.lstrip().startswith("["):
            tasks = _read_json(text, shown, strict=kind == "json")
        else:
            tasks = _read_jsonl(text, shown)
    if not tasks:
        raise InvalidInputError(f"no tasks in {shown}")
    return tasks


def _read_jsonl(text: str, shown: str) -> list[Any]:
    tasks = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                tasks.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise InvalidInputError(f"{shown}:{number}: not JSON ({exc.msg})") from None
    return tasks


def _read_json(text: str, shown: str, *, strict: bool) -> list[Any]:
    """A JSON array; JSONL when the text holds several values (lines that are arrays, or objects)."""
    try:
        value = json.loads(text) if text.strip() else []
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data":  # several values: JSON Lines under another name
            return _read_jsonl(text, shown)
        raise InvalidInputError(f"{shown}:{exc.lineno}: not JSON ({exc.msg})") from None
    if isinstance(value, list):
        return value
    if strict:
        raise InvalidInputError(
            f"{shown}: a .json tasks file holds a JSON array of tasks (or one task per line), "
            f"got a JSON {_JSON_KINDS.get(type(value), type(value).__name__)}"
        )
    return [value]  # a one-line JSONL file


_JSON_KINDS = {dict: "object", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}


def _read_csv(text: str, shown: str, *, delimiter: str) -> list[dict[str, str]]:
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    header: list[str] | None = None
    tasks: list[dict[str, str]] = []
    line = 1  # the line the next row starts on (a quoted cell may span lines)
    while True:
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            raise InvalidInputError(f"{shown}:{line}: not CSV ({exc})") from None
        start, line = line, reader.line_num + 1
        if not row or (len(row) == 1 and not row[0].strip()):  # a blank line
            continue
        if header is None:
            names = [name.strip() for name in row]
            if "" in names:
                raise InvalidInputError(
                    f"{shown}:{start}: the header row has an empty column name (column {names.index('') + 1})"
                )
            twice = sorted({name for name in names if names.count(name) > 1})
            if twice:
                raise InvalidInputError(f"{shown}:{start}: the header row names {', '.join(twice)} twice")
            header = names
            continue
        if len(row) != len(header):
            raise InvalidInputError(
                f"{shown}:{start}: the row has {len(row)} cell(s), the header has {len(header)} ({', '.join(header)})"
            )
        tasks.append(dict(zip(header, row, strict=True)))
    return tasks


def _read_parquet(path: Path, shown: str) -> list[Any]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise InvalidInputError(
            f"reading Parquet tasks ({shown}) needs pyarrow: pip install 'agentgrad[export]'"
        ) from None
    if not path.is_file():
        raise InvalidInputError(
            f"cannot read tasks file {shown}: {'Is a directory' if path.is_dir() else 'No such file or directory'}"
        )
    try:
        rows = pq.read_table(path).to_pylist()
    except (OSError, ValueError, pa.ArrowException) as exc:  # ArrowInvalid is a ValueError
        raise InvalidInputError(f"cannot read tasks file {shown} as Parquet: {exc}") from None
    for number, row in enumerate(rows, 1):
        try:
            json.dumps(row)
        except (TypeError, ValueError):
            bad = next(
                (f"column {key!r} holds a {type(value).__name__}" for key, value in row.items() if not _is_json(value)),
                "a value is not JSON",
            )
            raise InvalidInputError(
                f"{shown}: row {number}: {bad}, which is not JSON (tasks are stored as JSON; "
                "cast the column to a string or a number)"
            ) from None
    return rows


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True
