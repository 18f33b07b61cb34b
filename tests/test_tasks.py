"""Task files: every format read from a real file, and every way one can be wrong."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from agentgrad.errors import InvalidInputError
from agentgrad.tasks import read_tasks

TASKS = [{"question": "1+1", "answer": 2}, {"question": "2*3", "answer": 6, "tags": ["mul"]}]


def write(path: Path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


def refused(source, *needles: str) -> str:
    with pytest.raises(InvalidInputError) as info:
        read_tasks(source)
    message = str(info.value)
    for needle in needles:
        assert needle in message, message
    return message


# ---- formats -------------------------------------------------------------------------------------


def test_jsonl(tmp_path):
    path = write(tmp_path / "t.jsonl", "".join(json.dumps(t) + "\n" for t in TASKS) + "\n  \n")
    assert read_tasks(path) == TASKS
    assert read_tasks(Path(path)) == TASKS  # a Path as well as a str


def test_jsonl_lines_may_be_any_json_value(tmp_path):
    path = write(tmp_path / "t.jsonl", '[1, 2]\n[3]\n"text"\n7\n')
    assert read_tasks(path) == [[1, 2], [3], "text", 7]


def test_ndjson_is_jsonl(tmp_path):
    assert read_tasks(write(tmp_path / "t.ndjson", '{"a": 1}\n{"a": 2}\n')) == [{"a": 1}, {"a": 2}]


def test_json_array(tmp_path):
    assert read_tasks(write(tmp_path / "t.json", json.dumps(TASKS, indent=2))) == TASKS


def test_json_file_holding_json_lines(tmp_path):
    assert read_tasks(write(tmp_path / "t.json", '{"a": 1}\n{"a": 2}\n')) == [{"a": 1}, {"a": 2}]


def test_a_byte_order_mark_is_not_data(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + b'{"a": 1}\n')
    assert read_tasks(str(path)) == [{"a": 1}]


def test_other_extensions_are_sniffed(tmp_path):
    assert read_tasks(write(tmp_path / "tasks.txt", json.dumps(TASKS))) == TASKS
    assert read_tasks(write(tmp_path / "tasks", '{"a": 1}\n{"a": 2}\n')) == [{"a": 1}, {"a": 2}]
    assert read_tasks(write(tmp_path / "rows.data", "[1, 2]\n[3, 4]\n")) == [[1, 2], [3, 4]]


def test_csv_rows_are_dicts_of_strings(tmp_path):
    text = 'question, answer ,note\n1+1,2,\n"say ""hi""",007,"two\nlines"\n\ntrue,3.5,x\n'
    assert read_tasks(write(tmp_path / "t.csv", text)) == [
        {"question": "1+1", "answer": "2", "note": ""},
        {"question": 'say "hi"', "answer": "007", "note": "two\nlines"},
        {"question": "true", "answer": "3.5", "note": "x"},
    ]


def test_tsv(tmp_path):
    assert read_tasks(write(tmp_path / "t.tsv", "q\ta\n1+1\t2\n")) == [{"q": "1+1", "a": "2"}]


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "t.parquet"
    pq.write_table(
        pa.Table.from_pylist(
            [{"question": "1+1", "answer": 2, "tags": ["add"]}, {"question": "2*3", "answer": 6, "tags": []}]
        ),
        path,
    )
    assert read_tasks(str(path)) == [
        {"question": "1+1", "answer": 2, "tags": ["add"]},
        {"question": "2*3", "answer": 6, "tags": []},
    ]


def test_tasks_in_memory_pass_through():
    assert read_tasks(TASKS) == TASKS and read_tasks(TASKS) is not TASKS
    assert read_tasks((1, 2)) == [1, 2]
    assert read_tasks(x for x in "ab") == ["a", "b"]
    assert read_tasks([]) == []  # a list is the caller's: an empty one is theirs to refuse


def test_a_dataframe_gives_one_dict_per_row():
    class Frame:  # what read_tasks asks of a pandas DataFrame (pandas is not a dependency)
        columns = ("q", "n")

        def __iter__(self):  # iterating a DataFrame gives its column names: not what anyone means
            return iter(self.columns)

        def to_dict(self, orient):
            assert orient == "records"
            return [{"q": "a", "n": 1}, {"q": "b", "n": 2}]

    assert read_tasks(Frame()) == [{"q": "a", "n": 1}, {"q": "b", "n": 2}]


# ---- errors --------------------------------------------------------------------------------------


def test_bad_jsonl_line_names_file_and_line(tmp_path):
    path = write(tmp_path / "t.jsonl", '{"a": 1}\n\n{"a": \n')
    refused(path, f"{path}:3: not JSON")


def test_bad_json_array_names_file_and_line(tmp_path):
    path = write(tmp_path / "t.json", '[\n  {"a": 1},\n  {"a" 2}\n]\n')
    refused(path, f"{path}:3: not JSON")


def test_bad_line_of_a_json_file_of_lines(tmp_path):
    path = write(tmp_path / "t.json", '{"a": 1}\n{"a": 2}\n{oops}\n')
    refused(path, f"{path}:3: not JSON")


def test_json_file_that_is_not_an_array(tmp_path):
    path = write(tmp_path / "t.json", '{\n  "tasks": [1, 2]\n}\n')
    refused(path, path, "a JSON array of tasks", "got a JSON object")
    refused(write(tmp_path / "n.json", "3\n"), "got a JSON number")


def test_jsonl_array_that_spans_lines(tmp_path):  # a .jsonl file is read line by line, always
    path = write(tmp_path / "t.jsonl", "[1,\n 2]\n")
    refused(path, f"{path}:1: not JSON")


@pytest.mark.parametrize("name", ["t.jsonl", "t.json", "t.csv", "t.txt"])
@pytest.mark.parametrize("text", ["", "\n  \n", "[]"])
def test_a_file_without_tasks_is_an_error(tmp_path, name, text):
    if text == "[]" and name == "t.csv":
        text = "question,answer\n"  # a header and no rows
    elif text == "[]" and name == "t.jsonl":
        text = "\n"  # in a .jsonl file, [] is one task: the empty list
    path = write(tmp_path / name, text)
    refused(path, f"no tasks in {path}")


def test_empty_parquet_file(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"q": pa.array([], pa.string())}), path)
    refused(str(path), f"no tasks in {path}")


@pytest.mark.parametrize(
    ("text", "line", "needle"),
    [
        ("q,a\n1,2\n3,4,5\n", 3, "the row has 3 cell(s), the header has 2 (q, a)"),
        ("q,a\n1,2\n\n3\n", 4, "the row has 1 cell(s), the header has 2"),
        ('q,a\n"multi\nline",1\n5,6,7\n', 4, "the row has 3 cell(s)"),  # numbered from the row's first line
        ('q,a\n1,"unterminated\n', 2, "not CSV"),
        ('q,a\n1,"x"y\n', 2, "not CSV"),
        ("q,,a\n1,2,3\n", 1, "empty column name (column 2)"),
        ("q,a,q\n1,2,3\n", 1, "names q twice"),
    ],
    ids=[
        "too-many-cells",
        "too-few-cells",
        "after-a-multiline-cell",
        "unterminated-quote",
        "stray-quote",
        "empty-header-name",
        "duplicate-header-name",
    ],
)
def test_bad_csv_row_names_file_and_line(tmp_path, text, line, needle):
    path = write(tmp_path / "t.csv", text)
    refused(path, f"{path}:{line}: ", needle)


def test_parquet_value_that_is_not_json(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"q": ["a", "b"], "blob": pa.array([None, b"\x00"], pa.binary())}), path)
    refused(str(path), f"{path}: row 2: column 'blob' holds a bytes, which is not JSON")


def test_a_file_that_is_not_parquet(tmp_path):
    pytest.importorskip("pyarrow")
    path = write(tmp_path / "t.parquet", '{"a": 1}\n')
    refused(path, f"cannot read tasks file {path} as Parquet")


def test_parquet_without_pyarrow_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow raises ImportError
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    path = tmp_path / "t.parquet"
    path.write_bytes(b"PAR1")
    refused(str(path), "needs pyarrow", "pip install 'agentgrad[export]'", str(path))


@pytest.mark.parametrize("name", ["missing.jsonl", "missing.csv", "missing.parquet"])
def test_missing_file(tmp_path, name):
    pytest.importorskip("pyarrow") if name.endswith(".parquet") else None
    path = str(tmp_path / name)
    refused(path, f"cannot read tasks file {path}", "No such file")


def test_a_directory_is_not_a_tasks_file(tmp_path):
    refused(str(tmp_path), f"cannot read tasks file {tmp_path}")


def test_a_file_that_is_not_text(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\xff\xfe\x00bad")
    refused(str(path), f"cannot read tasks file {path}")


@pytest.mark.parametrize("source", [b'{"a": 1}', {"a": 1}, 3])
def test_tasks_must_be_a_path_or_a_list(source):
    refused(source, "a file path or a list of tasks")
