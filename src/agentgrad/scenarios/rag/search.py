"""The RAG scenario's retrieval tool: BM25 over a corpus file, with SQLite's FTS5.

FTS5 ships with Python's ``sqlite3`` (no new dependency) and ranks with Okapi BM25 (``bm25()``).
A corpus is a JSONL file of ``{"id", "title", "text"}`` documents; its index is built once, next
to it (``corpus-train.jsonl`` → ``corpus-train.fts5.sqlite``), written to a temporary file and
renamed into place so runner processes that start together never see half an index, and rebuilt
when the corpus's content changes (its SHA-256 is kept in the index). Searches open the index
read-only, one connection per search, so any number of threads and processes can share it.

A query is free text, as a model writes it: its words are OR-ed (a question's words, or a name)
and the best ``k`` documents by BM25 come back, a title match counting more than one in the text.
A query the tool refuses (empty, too long, a bad ``k``) raises :class:`QueryError`, whose
message is written for the model; :func:`run_search` turns it into the tool's reply text, so a
bad call costs the agent a turn, never the rollout.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sqlite3
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from agentgrad.errors import InvalidInputError
from agentgrad.scenarios.rag.world import Document

#: Longest query accepted, in characters and in words: a name or a few keywords, not a document.
MAX_QUERY_CHARS = 300
MAX_QUERY_TERMS = 32
MAX_K = 10
#: Documents a search returns unless asked otherwise: the reference's retriever returns 3 chunks.
DEFAULT_K = 3
#: BM25 weights of the indexed columns (title, text): a name in the title is the strongest match.
_WEIGHTS = (5.0, 1.0)
_INDEX_VERSION = "1"
_TERM = re.compile(r"\w+")


class QueryError(ValueError):
    """A search the tool refuses; the message says why, in words a model can act on."""


class CorpusError(InvalidInputError):
    """A corpus file that cannot be indexed (missing, or a line that is not a document)."""


def index_path(corpus: str | Path) -> Path:
    """Where the index of ``corpus`` lives: beside it, ``NAME.fts5.sqlite``."""
    corpus = Path(corpus)
    return corpus.with_name(corpus.stem + ".fts5.sqlite")


def _check_fts5() -> None:
    try:
        sqlite3.connect(":memory:").execute("CREATE VIRTUAL TABLE t USING fts5(x)")
    except sqlite3.OperationalError as exc:  # a Python built against an SQLite without FTS5
        raise RuntimeError(
            f"this Python's SQLite {sqlite3.sqlite_version} has no FTS5 module, which the RAG search tool needs"
        ) from exc


def _read_corpus(corpus: Path) -> list[Document]:
    if not corpus.is_file():
        raise CorpusError(
            f"corpus file {str(corpus)!r} does not exist (write it with `agentgrad scenarios rag generate`)"
        )
    docs = []
    with corpus.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                docs.append(Document(str(row["id"]), str(row["title"]), str(row["text"])))
            except (ValueError, KeyError, TypeError) as exc:
                raise CorpusError(f"{corpus}:{number}: not a document with id, title and text ({exc})") from None
    return docs


def _digest(corpus: Path) -> str:
    return hashlib.sha256(corpus.read_bytes()).hexdigest()


def _indexed_digest(index: Path) -> str | None:
    if not index.is_file():
        return None
    try:
        with contextlib.closing(sqlite3.connect(index.as_uri() + "?mode=ro", uri=True)) as db:
            rows = dict(db.execute("SELECT key, value FROM meta").fetchall())
    except sqlite3.DatabaseError:  # not an index of ours: rebuild it
        return None
    return rows.get("corpus_sha256") if rows.get("version") == _INDEX_VERSION else None


def build_index(corpus: str | Path) -> Path:
    """Index ``corpus`` now (atomically replacing any index beside it); returns the index's path."""
    _check_fts5()
    corpus = Path(corpus)
    docs, digest, target = _read_corpus(corpus), _digest(corpus), index_path(corpus)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.name, suffix=".tmp")
    os.close(fd)
    try:
        with contextlib.closing(sqlite3.connect(tmp)) as db, db:
            db.execute("CREATE VIRTUAL TABLE docs USING fts5(id UNINDEXED, title, text, tokenize='porter unicode61')")
            db.executemany(
                "INSERT INTO docs (id, title, text) VALUES (?, ?, ?)", [(d.id, d.title, d.text) for d in docs]
            )
            db.execute("INSERT INTO docs (docs) VALUES ('optimize')")
            db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
            db.executemany("INSERT INTO meta VALUES (?, ?)", [("version", _INDEX_VERSION), ("corpus_sha256", digest)])
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return target


@dataclass(frozen=True)
class SearchIndex:
    """A built index; :func:`open_index` gets one (building it when needed)."""

    path: Path

    def search(self, query: str, k: int = DEFAULT_K) -> list[Document]:
        """The ``k`` best documents for ``query`` by BM25, best first (fewer when fewer match)."""
        match = fts_query(query)
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
            raise QueryError(f"k must be a whole number from 1 to {MAX_K}, got {k!r}")
        with contextlib.closing(sqlite3.connect(self.path.as_uri() + "?mode=ro", uri=True)) as db:
            rows = db.execute(
                "SELECT id, title, text FROM docs WHERE docs MATCH ? "
                f"ORDER BY bm25(docs, 0.0, {_WEIGHTS[0]}, {_WEIGHTS[1]}) LIMIT ?",
                (match, k),
            ).fetchall()
        return [Document(*row) for row in rows]


def fts_query(query: str) -> str:
    """``query``'s words as an FTS5 expression (each quoted, OR-ed), or :class:`QueryError`.

    Quoting every word keeps FTS5's own syntax (``AND``, ``NEAR``, ``col:``, ``*``, quotes) out
    of the model's hands: whatever it writes is searched for as words.
    """
    if not isinstance(query, str):
        raise QueryError(f"the query must be text, got {type(query).__name__}")
    if len(query) > MAX_QUERY_CHARS:
        raise QueryError(
            f"query too long ({len(query)} characters; at most {MAX_QUERY_CHARS}): search for a name or a few keywords"
        )
    terms = list(dict.fromkeys(t.lower() for t in _TERM.findall(query)))
    if not terms:
        raise QueryError("empty query: give the words to look for, e.g. a name")
    if len(terms) > MAX_QUERY_TERMS:
        raise QueryError(
            f"query too long ({len(terms)} words; at most {MAX_QUERY_TERMS}): search for a name or a few keywords"
        )
    return " OR ".join(f'"{t}"' for t in terms)


_opened: dict[tuple[Path, int, int], SearchIndex] = {}
_opening = threading.Lock()


def open_index(corpus: str | Path) -> SearchIndex:
    """The index of ``corpus``, built on first use and whenever the corpus changed.

    Cached per process (by the corpus's path, size and modification time), so an agent may call
    this on every rollout; the first call in each process checks the index against the corpus.
    """
    corpus = Path(corpus).resolve()
    try:
        stat = corpus.stat()
    except FileNotFoundError:
        raise CorpusError(
            f"corpus file {str(corpus)!r} does not exist (write it with `agentgrad scenarios rag generate`)"
        ) from None
    key = (corpus, stat.st_size, stat.st_mtime_ns)
    with _opening:
        if key not in _opened:
            index = index_path(corpus)
            if _indexed_digest(index) != _digest(corpus):
                build_index(corpus)
            _opened[key] = SearchIndex(index)
        return _opened[key]


def format_results(docs: list[Document]) -> str:
    """The tool's reply: one numbered line per document, title first."""
    if not docs:
        return "No documents match this query."
    return "\n".join(f"[{i}] {d.title}: {d.text}" for i, d in enumerate(docs, 1))


def run_search(index: SearchIndex, query: str, k: int = DEFAULT_K) -> str:
    """What the search tool answers: the results, or ``Error: …`` for a query it refuses."""
    try:
        return format_results(index.search(query, k))
    except QueryError as exc:
        return f"Error: {exc}"
