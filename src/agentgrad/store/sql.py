"""One SQL implementation of the store primitives, shared by SQLite and PostgreSQL.

Records are kept whole as JSON (``data``) with the columns that queries filter or sort on copied
beside them. The SQL is written with ``?`` placeholders in the common subset of both dialects
(``ON CONFLICT``, partial indexes); a :class:`SqlDialect` supplies the few
differences (placeholder style, row locking for claims, column types).
"""

from __future__ import annotations

import functools
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import ValidationError

from agentgrad.store.core import (
    AttemptClock,
    StoreTx,
    TransactionalStore,
    evolved,
    from_json,
    from_json_many,
    to_json,
)
from agentgrad.store.protocol import RolloutFilter
from agentgrad.types import (
    Attempt,
    MetricRecord,
    Resources,
    Rollout,
    RolloutStatus,
    Span,
    Worker,
)

log = logging.getLogger(__name__)

SCHEMA_VERSION = "1"
_ROLLOUT_DATA = "SELECT data FROM rollouts WHERE rollout_id = ?"
_ATTEMPT_DATA = "SELECT data FROM attempts WHERE rollout_id = ? AND attempt_id = ?"
_TERMINAL = tuple(s.value for s in RolloutStatus if s.is_terminal)
_CHUNK = 500


@dataclass(frozen=True)
class SqlDialect:
    name: str
    placeholder: str = "?"
    #: Appended to the queue-claim SELECT (PostgreSQL: FOR UPDATE SKIP LOCKED).
    claim_lock: str = ""
    float_type: str = "DOUBLE PRECISION"
    autoincrement_pk: str = "INTEGER PRIMARY KEY AUTOINCREMENT"
    #: A key that grows with each insert (ids may be reused after the highest rows are deleted).
    serial_pk: str = "INTEGER PRIMARY KEY"

    @functools.lru_cache(maxsize=256)  # noqa: B019 - dialects are a handful of frozen singletons
    def sql(self, statement: str) -> str:
        return statement if self.placeholder == "?" else statement.replace("?", self.placeholder)

    def json_number(self, column: str, *keys: str) -> str:
        """SQL for the number at ``keys`` inside a JSON text column (NULL where absent)."""
        if self.name == "sqlite":
            return f"json_extract({column}, '$.{'.'.join(keys)}')"
        # PostgreSQL's JSON functions refuse the \u0000 escape, which JSON text may hold: swap it
        # for another escape first (of a space; "\\u0000" stays valid too, and numbers intact).
        text = f"replace({column}, E'\\\\u0000', E'\\\\u0020')"
        return f"CAST(CAST({text} AS json) #>> '{{{','.join(keys)}}}' AS DOUBLE PRECISION)"

    def schema(self) -> list[str]:
        f = self.float_type
        return [
            "CREATE TABLE IF NOT EXISTS agentgrad_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
            f"""CREATE TABLE IF NOT EXISTS rollouts (
                rollout_id TEXT PRIMARY KEY, status TEXT NOT NULL, mode TEXT NOT NULL, group_id TEXT,
                resources_id TEXT, enqueue_time {f} NOT NULL, start_time {f}, end_time {f}, reward {f},
                llm_calls INTEGER NOT NULL DEFAULT 0, queue_pos BIGINT, data TEXT NOT NULL)""",
            "CREATE INDEX IF NOT EXISTS rollouts_queue ON rollouts (queue_pos) WHERE queue_pos IS NOT NULL",
            "CREATE INDEX IF NOT EXISTS rollouts_status ON rollouts (status)",
            "CREATE INDEX IF NOT EXISTS rollouts_enqueue ON rollouts (enqueue_time)",
            """CREATE TABLE IF NOT EXISTS attempts (
                rollout_id TEXT NOT NULL, attempt_id TEXT NOT NULL, sequence_id INTEGER NOT NULL,
                status TEXT NOT NULL, data TEXT NOT NULL, PRIMARY KEY (rollout_id, attempt_id))""",
            "CREATE INDEX IF NOT EXISTS attempts_by_seq ON attempts (rollout_id, sequence_id)",
            "CREATE INDEX IF NOT EXISTS attempts_active ON attempts (status) WHERE status IN ('preparing', 'running')",
            """CREATE TABLE IF NOT EXISTS spans (
                rollout_id TEXT NOT NULL, attempt_id TEXT NOT NULL, span_id TEXT NOT NULL,
                sequence_id BIGINT NOT NULL, name TEXT NOT NULL, data TEXT NOT NULL,
                PRIMARY KEY (rollout_id, attempt_id, span_id))""",
            "CREATE UNIQUE INDEX IF NOT EXISTS spans_by_seq ON spans (rollout_id, sequence_id)",
            """CREATE TABLE IF NOT EXISTS resources (
                resources_id TEXT PRIMARY KEY, version INTEGER NOT NULL UNIQUE, data TEXT NOT NULL)""",
            "CREATE TABLE IF NOT EXISTS workers (worker_id TEXT PRIMARY KEY, data TEXT NOT NULL)",
            f"""CREATE TABLE IF NOT EXISTS metrics (
                id {self.autoincrement_pk}, run_id TEXT NOT NULL, step INTEGER NOT NULL, data TEXT NOT NULL)""",
            # Idempotency records (agentgrad.store.idempotency); ids grow in the order they are
            # written, which is the order they expire in.
            f"""CREATE TABLE IF NOT EXISTS replays (
                id {self.serial_pk}, scope TEXT NOT NULL, idem_key TEXT NOT NULL, fingerprint TEXT NOT NULL,
                answer TEXT NOT NULL, created {f} NOT NULL)""",
            "CREATE UNIQUE INDEX IF NOT EXISTS replays_by_key ON replays (scope, idem_key)",
        ]


SQLITE = SqlDialect(name="sqlite", float_type="REAL")
POSTGRES = SqlDialect(
    name="postgresql",
    placeholder="%s",
    claim_lock=" FOR UPDATE SKIP LOCKED",
    autoincrement_pk="BIGSERIAL PRIMARY KEY",
    serial_pk="BIGSERIAL PRIMARY KEY",
)


def _rollout_columns(r: Rollout) -> tuple[Any, ...]:
    return (
        r.status.value,
        r.mode,
        r.metadata.get("group_id"),
        r.resources_id,
        r.enqueue_time,
        r.start_time,
        r.end_time,
        r.reward,
        r.llm_calls,
        _text(r),
    )


def _text(record: Any) -> str:
    """The JSON text a record is stored as."""
    return to_json(record).decode()


def _chunks(items: Sequence[Any], size: int = _CHUNK) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class RowViews:
    """Parsed rollouts and attempts kept by their row's JSON text, so that a peek whose row has
    not changed reuses the object instead of validating the text again.

    Peeks are read-only views (see :class:`StoreTx`), and a store operation peeks the rollout and
    the attempt it touches: validating a rollout's JSON, its whole task input included, on every
    span insert and status update was a tenth of an SQLite call's work. A view is returned only
    for the very text it was made from (another process may have changed the row: then the text
    differs and it is parsed anew). Records saved ``private`` are kept as views; any other save
    drops the row's view, whose nested values the caller may now hold (a copy made with
    ``evolved`` shares them). Bounded; the oldest entries go first. Safe to share between
    threads: entries are replaced whole.
    """

    def __init__(self, max_entries: int = 4096) -> None:
        # An OrderedDict, not a dict: dropping a dict's first entry again and again leaves a run
        # of deleted slots that every later ``next(iter(...))`` walks through (a fifth of a busy
        # trainer process's time once the views filled up: issue 24).
        self._entries: OrderedDict[tuple[str, ...], tuple[str, Any]] = OrderedDict()
        self.max_entries = max_entries

    def view(self, model: type[Any], key: tuple[str, ...], text: str) -> Any:
        entry = self._entries.get(key)
        if entry is not None and entry[0] == text:
            return entry[1]
        record = from_json(model, text)
        self.keep(key, text, record)
        return record

    def keep(self, key: tuple[str, ...], text: str, record: Any) -> None:
        entries = self._entries
        entries[key] = (text, record)
        if len(entries) > self.max_entries:
            try:
                entries.popitem(last=False)
            except KeyError:  # another thread got there first
                pass

    def forget(self, key: tuple[str, ...]) -> None:
        self._entries.pop(key, None)


class SqlTx(StoreTx):
    """Store primitives over one DB-API cursor inside an open transaction."""

    def __init__(self, cursor: Any, dialect: SqlDialect, views: RowViews) -> None:
        self.cur = cursor
        self.dialect = dialect
        self.views = views

    def _exec(self, statement: str, params: Sequence[Any] = ()) -> Any:
        self.cur.execute(self.dialect.sql(statement), params)
        return self.cur

    def _rows(self, statement: str, params: Sequence[Any] = ()) -> list[tuple]:
        return self._exec(statement, params).fetchall()

    def _data(self, statement: str, params: Sequence[Any]) -> str | None:
        """The ``data`` text of the one row ``statement`` selects, or None."""
        rows = self._rows(statement, params)
        return rows[0][0] if rows else None

    def _marks(self, n: int) -> str:
        return ", ".join("?" * n)

    # ---- rollouts
    def get_rollout(self, rollout_id: str) -> Rollout | None:
        text = self._data(_ROLLOUT_DATA, (rollout_id,))
        return from_json(Rollout, text) if text is not None else None

    def peek_rollout(self, rollout_id: str) -> Rollout | None:
        text = self._data(_ROLLOUT_DATA, (rollout_id,))
        return self.views.view(Rollout, (rollout_id,), text) if text is not None else None

    def insert_rollouts(self, rollouts: Sequence[Rollout]) -> None:
        self.cur.executemany(
            self.dialect.sql(
                "INSERT INTO rollouts (status, mode, group_id, resources_id, enqueue_time, start_time, end_time, "
                "reward, llm_calls, data, rollout_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            ),
            [(*_rollout_columns(r), r.rollout_id) for r in rollouts],
        )

    def save_rollout(self, rollout: Rollout, *, private: bool = False) -> None:
        columns = _rollout_columns(rollout)
        self._exec(
            "UPDATE rollouts SET status = ?, mode = ?, group_id = ?, resources_id = ?, enqueue_time = ?, "
            "start_time = ?, end_time = ?, reward = ?, llm_calls = ?, data = ? WHERE rollout_id = ?",
            (*columns, rollout.rollout_id),
        )
        self._remember((rollout.rollout_id,), columns[-1], rollout, private)

    def _remember(self, key: tuple[str, ...], text: str, record: Any, private: bool) -> None:
        if private:
            self.views.keep(key, text, record)
        else:
            self.views.forget(key)

    def push_queue(self, rollout_ids: Sequence[str]) -> None:
        (top,) = self._rows("SELECT COALESCE(MAX(queue_pos), 0) FROM rollouts WHERE queue_pos IS NOT NULL")[0]
        self.cur.executemany(
            self.dialect.sql("UPDATE rollouts SET queue_pos = ? WHERE rollout_id = ?"),
            [(top + 1 + i, rollout_id) for i, rollout_id in enumerate(rollout_ids)],
        )

    def has_queued(self) -> bool:
        return bool(self._rows("SELECT 1 FROM rollouts WHERE queue_pos IS NOT NULL LIMIT 1"))

    def pop_queue(self, limit: int) -> list[str]:
        rows = self._rows(
            "SELECT rollout_id FROM rollouts WHERE queue_pos IS NOT NULL "
            "ORDER BY queue_pos, enqueue_time, rollout_id LIMIT ?" + self.dialect.claim_lock,
            (limit,),
        )
        ids = [row[0] for row in rows]
        if ids:
            self._exec(f"UPDATE rollouts SET queue_pos = NULL WHERE rollout_id IN ({self._marks(len(ids))})", ids)
        return ids

    def remove_from_queue(self, rollout_id: str) -> None:
        self._exec("UPDATE rollouts SET queue_pos = NULL WHERE rollout_id = ?", (rollout_id,))

    def _where(self, f: RolloutFilter) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        params: list[Any] = []
        if f.status is not None:
            clauses.append(f"status IN ({self._marks(len(f.status))})" if f.status else "1 = 0")
            params += [s.value for s in f.status]
        if f.mode is not None:
            clauses.append("mode = ?")
            params.append(f.mode)
        if f.rollout_ids is not None:
            clauses.append(f"rollout_id IN ({self._marks(len(f.rollout_ids))})" if f.rollout_ids else "1 = 0")
            params += f.rollout_ids
        if f.group_id is not None:
            clauses.append("group_id = ?")
            params.append(f.group_id)
        if f.resources_id is not None:
            clauses.append("resources_id = ?")
            params.append(f.resources_id)
        if f.no_llm_calls is not None:
            empty = f"(status IN ({self._marks(len(_TERMINAL))}) AND llm_calls = 0)"
            clauses.append(empty if f.no_llm_calls else f"NOT {empty}")
            params += _TERMINAL
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", params

    def query_rollouts(self, filter: RolloutFilter) -> list[Rollout]:
        where, params = self._where(filter)
        direction = " DESC" if filter.descending else ""
        key = filter.sort_by  # a Literal, validated by pydantic: safe to interpolate
        order = f" ORDER BY ({key} IS NULL), {key}{direction}, enqueue_time{direction}, rollout_id{direction}"
        page = ""
        if filter.limit is not None:
            page = " LIMIT ? OFFSET ?"
            params += [filter.limit, filter.offset]
        elif filter.offset:
            page = " LIMIT -1 OFFSET ?" if self.dialect.name == "sqlite" else " OFFSET ?"
            params.append(filter.offset)
        rows = self._rows("SELECT data FROM rollouts" + where + order + page, params)
        return from_json_many(Rollout, (row[0] for row in rows))

    def count_rollouts(self, filter: RolloutFilter) -> int:
        where, params = self._where(filter)
        return int(self._rows("SELECT COUNT(*) FROM rollouts" + where, params)[0][0])

    # ---- attempts
    def get_attempt(self, rollout_id: str, attempt_id: str) -> Attempt | None:
        text = self._data(_ATTEMPT_DATA, (rollout_id, attempt_id))
        return from_json(Attempt, text) if text is not None else None

    def peek_attempt(self, rollout_id: str, attempt_id: str) -> Attempt | None:
        key = (rollout_id, attempt_id)
        text = self._data(_ATTEMPT_DATA, key)
        return self.views.view(Attempt, key, text) if text is not None else None

    def get_attempts(self, rollout_id: str) -> list[Attempt]:
        rows = self._rows("SELECT data FROM attempts WHERE rollout_id = ? ORDER BY sequence_id", (rollout_id,))
        return from_json_many(Attempt, (row[0] for row in rows))

    def insert_attempt(self, attempt: Attempt) -> None:
        self._exec(
            "INSERT INTO attempts (rollout_id, attempt_id, sequence_id, status, data) VALUES (?, ?, ?, ?, ?)",
            (attempt.rollout_id, attempt.attempt_id, attempt.sequence_id, attempt.status.value, _text(attempt)),
        )

    def save_attempt(self, attempt: Attempt, *, private: bool = False) -> None:
        text = _text(attempt)
        self._exec(
            "UPDATE attempts SET status = ?, data = ? WHERE rollout_id = ? AND attempt_id = ?",
            (attempt.status.value, text, attempt.rollout_id, attempt.attempt_id),
        )
        self._remember((attempt.rollout_id, attempt.attempt_id), text, attempt, private)

    def attempt_clocks(self) -> list[AttemptClock]:
        number = self.dialect.json_number
        rows = self._rows(
            f"SELECT a.rollout_id, a.attempt_id, {number('a.data', 'start_time')}, "
            f"{number('a.data', 'last_heartbeat_time')}, {number('r.data', 'config', 'timeout_seconds')}, "
            f"{number('r.data', 'config', 'unresponsive_seconds')} "
            "FROM attempts a JOIN rollouts r ON r.rollout_id = a.rollout_id WHERE a.status IN ('preparing', 'running')"
        )
        return [AttemptClock(*row) for row in rows]

    # ---- spans
    def insert_spans(self, rollout_id: str, spans: Sequence[Span]) -> list[tuple[Span, bool]]:
        span_ids: dict[str, set[str]] = {}  # per attempt, so lookups use the whole primary key
        for span in spans:
            span_ids.setdefault(span.attempt_id, set()).add(span.span_id)
        existing: dict[tuple[str, str], str] = {}
        for attempt_id, ids in span_ids.items():
            for chunk in _chunks(sorted(ids)):
                for span_id, data in self._rows(
                    "SELECT span_id, data FROM spans WHERE rollout_id = ? AND attempt_id = ? "
                    f"AND span_id IN ({self._marks(len(chunk))})",
                    (rollout_id, attempt_id, *chunk),
                ):
                    existing[(attempt_id, span_id)] = data
        fresh: dict[tuple[str, str], Span] = {}
        for span in spans:
            key = (span.attempt_id, span.span_id)
            if key not in existing and key not in fresh:
                fresh[key] = span
        if fresh:
            # Writers are serialized (SQLite's write lock, PostgreSQL's advisory lock), so the next
            # number follows the highest stored one: an index lookup that, unlike a counter in the
            # rollout's row, leaves one page fewer for the commit to write.
            ((top,),) = self._rows(
                "SELECT COALESCE(MAX(sequence_id), 0) FROM spans WHERE rollout_id = ?", (rollout_id,)
            )
            first = top + 1
            fresh = {key: evolved(span, sequence_id=first + offset) for offset, (key, span) in enumerate(fresh.items())}
            self.cur.executemany(
                self.dialect.sql(
                    "INSERT INTO spans (rollout_id, attempt_id, span_id, sequence_id, name, data) "
                    "VALUES (?, ?, ?, ?, ?, ?)"
                ),
                [(rollout_id, s.attempt_id, s.span_id, s.sequence_id, s.name, _text(s)) for s in fresh.values()],
            )
        results: list[tuple[Span, bool]] = []
        reported: set[tuple[str, str]] = set()
        for span in spans:
            key = (span.attempt_id, span.span_id)
            if key in existing:
                results.append((from_json(Span, existing[key]), False))
            else:
                results.append((fresh[key], key not in reported))
                reported.add(key)
        return results

    def query_spans(
        self, rollout_id: str, attempt_id: str | None, name: str | None, after_sequence_id: int, limit: int | None
    ) -> list[Span]:
        statement = "SELECT data FROM spans WHERE rollout_id = ? AND sequence_id > ?"
        params: list[Any] = [rollout_id, after_sequence_id]
        if attempt_id is not None:
            statement += " AND attempt_id = ?"
            params.append(attempt_id)
        if name is not None:
            statement += " AND name = ?"
            params.append(name)
        statement += " ORDER BY sequence_id"
        if limit is not None:
            statement += " LIMIT ?"
            params.append(limit)
        return from_json_many(Span, (row[0] for row in self._rows(statement, params)))

    # ---- resources
    def get_resources(self, resources_id: str) -> Resources | None:
        rows = self._rows("SELECT data FROM resources WHERE resources_id = ?", (resources_id,))
        return from_json(Resources, rows[0][0]) if rows else None

    def latest_resources(self) -> Resources | None:
        rows = self._rows("SELECT data FROM resources ORDER BY version DESC LIMIT 1")
        return from_json(Resources, rows[0][0]) if rows else None

    def insert_resources(self, resources: Resources) -> None:
        self._exec(
            "INSERT INTO resources (resources_id, version, data) VALUES (?, ?, ?)",
            (resources.resources_id, resources.version, _text(resources)),
        )

    def all_resources(self) -> list[Resources]:
        rows = self._rows("SELECT data FROM resources ORDER BY version")
        return from_json_many(Resources, (row[0] for row in rows))

    # ---- workers and metrics
    def save_worker(self, worker: Worker) -> None:
        self._exec(
            "INSERT INTO workers (worker_id, data) VALUES (?, ?)"
            " ON CONFLICT (worker_id) DO UPDATE SET data = excluded.data",
            (worker.worker_id, _text(worker)),
        )

    def all_workers(self) -> list[Worker]:
        return _readable(Worker, "worker", self._rows("SELECT worker_id, data FROM workers ORDER BY worker_id"))

    def insert_metrics(self, records: Sequence[MetricRecord]) -> None:
        self.cur.executemany(
            self.dialect.sql("INSERT INTO metrics (run_id, step, data) VALUES (?, ?, ?)"),
            [(r.run_id, r.step, _text(r)) for r in records],
        )

    def query_metrics(self, run_id: str | None) -> list[MetricRecord]:
        if run_id is None:
            rows = self._rows("SELECT id, data FROM metrics ORDER BY id")
        else:
            rows = self._rows("SELECT id, data FROM metrics WHERE run_id = ? ORDER BY id", (run_id,))
        return _readable(MetricRecord, "metric record", rows)

    # ---- idempotency records
    def find_replay(self, scope: str, key: str) -> tuple[str, str] | None:
        rows = self._rows("SELECT fingerprint, answer FROM replays WHERE scope = ? AND idem_key = ?", (scope, key))
        return (rows[0][0], rows[0][1]) if rows else None

    def save_replay(self, scope: str, key: str, fingerprint: str, answer: str, stamp: float) -> None:
        self._exec(
            "INSERT INTO replays (scope, idem_key, fingerprint, answer, created) VALUES (?, ?, ?, ?, ?)",
            (scope, key, fingerprint, answer, stamp),
        )

    def prune_replays(self, expired_before: float, keep: int) -> None:
        """Writers are serialized, so ids grow with ``created``: the expired records are those
        below the first fresh id, found walking the primary key from the oldest (no index on
        ``created`` for every insert to update)."""
        ((top,),) = self._rows("SELECT MAX(id) FROM replays")
        if top is None:
            return
        fresh = self._rows("SELECT id FROM replays WHERE created >= ? ORDER BY id LIMIT 1", (expired_before,))
        first_kept = max(fresh[0][0] if fresh else top + 1, top - keep + 1)
        self._exec("DELETE FROM replays WHERE id < ?", (first_kept,))


_Record = TypeVar("_Record")
#: Unreadable rows already reported, by table and key: a dashboard refreshing every few seconds
#: must not repeat the warning each time.
_REPORTED: set[tuple[str, Any]] = set()


def _readable(model: type[_Record], what: str, rows: Iterable[tuple[Any, str]]) -> list[_Record]:
    """The records of ``(key, data)`` rows that still read as ``model``.

    Stores written before every number was checked at the edge may hold a record that no longer
    reads (a ``NaN`` heartbeat time stored as JSON ``null``). Such a record is skipped with a
    warning naming it, once, so that it cannot fail every later read of its table.
    """
    validate = model.__pydantic_validator__.validate_json  # type: ignore[attr-defined]
    records = []
    for key, text in rows:
        try:
            records.append(validate(text))
        except ValidationError as exc:
            if (what, key) not in _REPORTED and len(_REPORTED) < 10_000:
                _REPORTED.add((what, key))
                problem = exc.errors(include_url=False)[0]
                log.warning(
                    "skipping stored %s %r: it no longer reads (%s: %s); it was written before the "
                    "store refused such values",
                    what,
                    key,
                    ".".join(map(str, problem["loc"])),
                    problem["msg"],
                )
    return records


#: The core's calls that only read. A SQL backend runs them apart from its writers (PostgreSQL
#: without its advisory lock, SQLite on connections of its own beside its writer), so a long read
#: never holds up a write, and a write never waits for one.
READ_ONLY_CALLS = (
    "get_rollout",
    "query_rollouts",
    "count_rollouts",
    "wait_for_rollouts",
    "get_attempts",
    "query_spans",
    "get_resources",
    "get_latest_resources",
    "query_resources",
    "query_workers",
    "query_metrics",
)
#: The core's looks that only read inside a call that may write, run apart the same way: a
#: claim's look at whether anything is queued (``TransactionalStore._claimable``).
READ_ONLY_LOOKS = ("_claimable",)
_Store = TypeVar("_Store", bound=TransactionalStore)


def reads_apart(cls: type[_Store]) -> type[_Store]:
    """Class decorator: while one of :data:`READ_ONLY_CALLS` or :data:`READ_ONLY_LOOKS` runs,
    ``self._local.read_only`` is true in its thread (``_local``: a ``threading.local`` of the
    store), which the backend's ``_transaction`` reads."""
    for name in (*READ_ONLY_CALLS, *READ_ONLY_LOOKS):
        setattr(cls, name, _read_only(getattr(TransactionalStore, name)))
    return cls


def _read_only(base: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(base)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        outer = getattr(self._local, "read_only", False)
        self._local.read_only = True
        try:
            return base(self, *args, **kwargs)
        finally:
            self._local.read_only = outer

    return method
