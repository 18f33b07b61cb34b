"""RedisStore: the store in a Redis server, shared by every process and machine that reaches it.

The semantics are the core's (:mod:`agentgrad.store.core`); this module only keeps records in
Redis keys under one prefix (``redis://host:6379/0?prefix=run7``: keys ``run7:…``; default
``agentgrad``), so several stores share one server or database without seeing each other.

Concurrency model, the one PostgreSQL's advisory lock gives :class:`PostgresStore`: every
*writing* call holds one lock key per prefix (``SET NX PX``, sent with its first read: no round
trip of its own) for its whole transaction, so the core's read-modify-write sequences (claims,
retries, the watchdog, span sequence ids, resource versions, idempotency records) never
interleave across processes, and a claim is exclusive. Its writes are buffered and sent at the
end as one ``MULTI``/``EXEC`` that also deletes the lock, under ``WATCH`` of the lock key: they
are applied all together or not at all (a process killed mid-call leaves nothing half written),
and a holder whose lock expired under it (paused longer than ``lock_seconds``) writes nothing
and gets :class:`RedisStoreError` instead of racing the new holder. A call that reads nothing
(``update_worker``, ``add_metrics`` without a key) depends on nothing stored and takes no lock.
A lock whose holder died is taken over at once: each store names its connections
(``CLIENT SETNAME``), and a waiter that finds none of the holder's connections alive deletes the
lock; an unreachable holder's lock expires after ``lock_seconds``. Calls that only read
(:data:`agentgrad.store.sql.READ_ONLY_CALLS`) take no lock and see every write whole.

Durability is the server's: an acknowledged write is in the server's memory, so it survives
the death of any client process, and survives a Redis restart only as far as its persistence
settings go (``appendonly yes`` with ``appendfsync everysec`` loses at most about a second of
writes on a crash of the host; ``always`` loses none). See ``docs/store-service.md#redis``.

Waiters in this process wake on local changes at once; changes made by other processes are seen
within ``external_poll_interval`` seconds, by one waiter at a time reading the store's version
key (a number every commit that writes increments) and waking the others when it moved. A single
Redis server (or a replicated primary) is supported, not Redis Cluster: the keys of one store live
in many hash slots.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from redis.connection import URL_QUERY_ARGUMENT_PARSERS

from agentgrad.errors import StoreFileError
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
from agentgrad.store.query import filter_and_page
from agentgrad.store.sql import SCHEMA_VERSION, RowViews, reads_apart
from agentgrad.types import Attempt, MetricRecord, Resources, Rollout, Span, Worker, now

log = logging.getLogger(__name__)

#: The query parameter of a store URL that names the key prefix (``redis://…/0?prefix=run7``). It
#: is AgentGrad's, not redis-py's: :func:`parse_url` takes it out before connecting.
PREFIX_PARAMETER = "prefix"
DEFAULT_PREFIX = "agentgrad"
_PREFIX_SHAPE = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
_SCHEMES = ("redis://", "rediss://")
#: redis-py's URL parameters, less those that change the shape of replies (the backend reads
#: RESP2 replies as they come).
_URL_PARAMETERS = [name for name in URL_QUERY_ARGUMENT_PARSERS if name not in ("protocol", "legacy_responses")]
#: Span list entries are ``attempt_id NUL name NUL json``: queries filter without parsing JSON
#: (ids and names hold no NUL, see ``types.Key`` and ``types.Name``).
_NUL = b"\0"
_SCAN_CHUNK = 1000

#: Deletes the lock only if it is still the caller's (a holder never deletes another's lock).
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


class RedisStoreError(StoreFileError, ConnectionError):
    """Redis could not be reached, or a call lost its lock; nothing of the call was written.

    A ``ConnectionError``, so :class:`~agentgrad.store.outage.PatientStore` waits it out."""


def parse_url(url: str) -> tuple[str, str | None]:
    """``redis://host:port/db?prefix=p&…`` → (the URL redis-py reads, ``"p"`` or None).

    Refuses, naming the problem, a URL that is not ``redis://`` or ``rediss://``, a port that is
    not a number, a database that is not a non-negative integer, or a prefix of other characters
    than letters, digits and ``_.-``.
    """
    if not url.startswith(_SCHEMES):
        raise ValueError(f"not a Redis URL: {_redact(url)!r} (use redis://host:6379/0 or rediss://…)")
    parts = urllib.parse.urlsplit(url)
    try:
        if parts.port == 0:
            raise ValueError
    except ValueError:
        raise ValueError(f"Redis URL {_redact(url)!r}: the port is not a number from 1 to 65535") from None
    if not parts.hostname:
        raise ValueError(f"Redis URL {_redact(url)!r} names no host (use redis://host:6379/0)")
    db = parts.path.lstrip("/")
    if db and not db.isdigit():
        raise ValueError(f"Redis URL {_redact(url)!r}: the database {db!r} is not a number (redis://host:6379/0)")
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    unknown = sorted({key for key, _ in query} - {PREFIX_PARAMETER, *_URL_PARAMETERS})
    if unknown:
        known = ", ".join([PREFIX_PARAMETER, *_URL_PARAMETERS])
        raise ValueError(f"Redis URL {_redact(url)!r}: unknown parameter(s) {', '.join(unknown)} (known: {known})")
    prefixes = [value for key, value in query if key == PREFIX_PARAMETER]
    for prefix in prefixes:
        _check_prefix(prefix)
    rest = urllib.parse.urlencode([(key, value) for key, value in query if key != PREFIX_PARAMETER])
    return urllib.parse.urlunsplit(parts._replace(query=rest)), (prefixes[-1] if prefixes else None)


def _check_prefix(prefix: str) -> str:
    if not _PREFIX_SHAPE.fullmatch(prefix):
        raise ValueError(f"Redis key prefix {prefix!r}: use 1 to 64 letters, digits, '_', '.' or '-'")
    return prefix


def _redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


class _Keys:
    """The names of one store's keys (every one under ``prefix:``)."""

    def __init__(self, prefix: str) -> None:
        p = prefix
        self.meta, self.lock = f"{p}:meta", f"{p}:lock"
        self.rollouts, self.queue = f"{p}:rollouts", f"{p}:queue"
        #: rollout ids scored by enqueue time: pages of the unfiltered list without reading it all.
        self.by_enqueue = f"{p}:by_enqueue"
        #: rollout id → [timeout_seconds, unresponsive_seconds] of rollouts that set a limit
        #: (a rollout's config never changes after it is enqueued).
        self.limits = f"{p}:limits"
        #: rollout id → its attempt in ``preparing`` or ``running`` (only the latest can be).
        self.active = f"{p}:active"
        self.resources, self.versions = f"{p}:resources", f"{p}:versions"
        self.workers, self.metrics = f"{p}:workers", f"{p}:metrics"
        #: a number every commit that writes increments: the waiters of other processes watch it
        #: (``RedisStore._outside_version``).
        self.version = f"{p}:version"
        self.replays, self.replay_times = f"{p}:replays", f"{p}:replay_times"
        self._attempts, self._spans, self._span_ids = f"{p}:attempts:", f"{p}:spans:", f"{p}:span_ids:"
        self.pattern = f"{p}:*"

    def attempts(self, rollout_id: str) -> str:
        return self._attempts + rollout_id

    def spans(self, rollout_id: str) -> str:
        return self._spans + rollout_id

    def span_ids(self, rollout_id: str) -> str:
        return self._span_ids + rollout_id


class _Conn:
    """One connection of the pool, with the two ways the backend talks: one command, or several
    sent together (one round trip) whose replies are all read before any error is raised."""

    def __init__(self, connection: Any) -> None:
        self.c = connection

    def call(self, *args: Any) -> Any:
        return self.calls([args])[0]

    def calls(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        replies, error = self._exchange(commands)
        if error is not None:
            raise error
        return replies

    def _exchange(self, commands: Sequence[tuple[Any, ...]]) -> tuple[list[Any], redis.ResponseError | None]:
        self.c.send_packed_command(self.c.pack_commands(commands))
        replies: list[Any] = []
        error = None
        for _ in commands:
            try:
                replies.append(self.c.read_response())
            except redis.ResponseError as exc:
                replies.append(exc)
                error = error or exc
        return replies, error


@dataclass(frozen=True)
class _Lock:
    """The lock of one store's prefix: its key, lease and the name of its holder's connections."""

    key: str
    lease_ms: int
    holder: str  # the client name of every connection of the store object that takes it


class _WriterConn(_Conn):
    """The connection of a writing call. Its first round trip also takes the store's lock and
    watches it (``WATCH``), so the lock costs no round trip of its own; a call that reads nothing never
    takes it (its writes depend on nothing stored) and commits its writes alone."""

    def __init__(self, connection: Any, lock: _Lock) -> None:
        super().__init__(connection)
        self.lock = lock
        self.token: str | None = None

    def calls(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        if self.token is not None:
            return super().calls(commands)
        lock, token = self.lock, f"{self.lock.holder}/{uuid.uuid4().hex}"
        delay, next_check = 0.0005, time.monotonic() + 0.05
        while True:
            # UNWATCH first: our own SET would otherwise spoil a WATCH left by a failed try.
            replies, error = self._exchange(
                [("UNWATCH",), ("SET", lock.key, token, "NX", "PX", lock.lease_ms), ("WATCH", lock.key), *commands]
            )
            if replies[1] is not None:
                self.token = token
                if error is not None:
                    raise error
                return replies[3:]
            if time.monotonic() >= next_check:
                self._break_if_orphaned()
                next_check = time.monotonic() + 0.5
            time.sleep(delay)
            delay = min(delay * 2, 0.01)

    def _break_if_orphaned(self) -> None:
        """Delete the lock if no connection of its holder is open: the holder died mid-call (its
        writes, buffered for ``EXEC``, never reached the server). A user not allowed ``CLIENT
        LIST`` waits for the lock's lease to end instead."""
        try:
            holder, clients = super().calls([("GET", self.lock.key), ("CLIENT", "LIST")])
        except redis.ResponseError:
            return
        if holder is not None and f" name={holder.decode().partition('/')[0]} " not in clients.decode():
            super().calls([("EVAL", _RELEASE, 1, self.lock.key, holder)])

    def commit(self, writes: list[tuple[Any, ...]]) -> None:
        """Apply ``writes`` in one ``MULTI``/``EXEC`` that also releases the lock, if taken; it
        fails whole if the lock expired and another writer took it meanwhile."""
        if self.token is None:
            if writes:
                super().calls([("MULTI",), *writes, ("EXEC",)])
            return
        replies = super().calls([("MULTI",), *writes, ("DEL", self.lock.key), ("EXEC",)])
        if replies[-1] is None:
            raise RedisStoreError(
                f"the store lock {self.lock.key!r} expired during a call that held it longer than "
                f"lock_seconds={self.lock.lease_ms / 1000}; nothing of the call was written"
            )
        failed = [reply for reply in replies[-1] if isinstance(reply, redis.ResponseError)]
        if failed:
            raise failed[0]

    def abandon(self) -> None:
        """Give the lock back, if taken, writing nothing (the call raised)."""
        if self.token is not None:
            super().calls([("UNWATCH",), ("EVAL", _RELEASE, 1, self.lock.key, self.token)])


def _text(record: Any) -> str:
    return to_json(record).decode()


_ABSENT: Any = object()
#: Servers already warned about (see ``RedisStore._warn_if_volatile``).
_WARNED: set[str] = set()


class RedisTx(StoreTx):
    """Store primitives over one connection: reads go to the server at once (and see this
    transaction's own writes), writes are buffered for the ``MULTI``/``EXEC`` that commits them."""

    def __init__(self, conn: _Conn, keys: _Keys, views: RowViews, writable: bool) -> None:
        self.conn, self.k, self.views = conn, keys, views
        self.writable = writable
        self.writes: list[tuple[Any, ...]] = []
        #: (hash key, field) → the value this transaction wrote (None: deleted).
        self._written: dict[tuple[str, str], str | None] = {}
        #: rollout id → its attempts (id → JSON) as read with the rollout (see ``_rollout_text``).
        self._attempt_texts: dict[str, dict[str, str]] = {}
        self._new_spans: dict[str, int] = {}  # rollout id → spans appended by this transaction
        self._new_replays = 0

    def _write(self, *command: Any) -> None:
        assert self.writable, "a read-only store call wrote"
        self.writes.append(command)

    def _hset(self, key: str, mapping: dict[str, str]) -> None:
        if mapping:
            self._write("HSET", key, *[part for item in mapping.items() for part in item])
            for field, value in mapping.items():
                self._written[(key, field)] = value

    def _hdel(self, key: str, field: str) -> None:
        self._write("HDEL", key, field)
        self._written[(key, field)] = None

    def _hget(self, key: str, field: str) -> str | None:
        written = self._written.get((key, field), _ABSENT)
        if written is not _ABSENT:
            return written
        value = self.conn.call("HGET", key, field)
        return None if value is None else value.decode()

    def _hgetall(self, key: str, stored: dict[str, str] | None = None) -> dict[str, str]:
        """The hash at ``key`` (``stored``: as already read) with this transaction's writes."""
        found = _pairs(self.conn.call("HGETALL", key)) if stored is None else dict(stored)
        for (hash_key, field), value in self._written.items():
            if hash_key == key:
                if value is None:
                    found.pop(field, None)
                else:
                    found[field] = value
        return found

    def _rollout_text(self, rollout_id: str) -> str | None:
        """The rollout's JSON; its attempts come in the same round trip (kept for this
        transaction), since the core reads the attempt it acts on right after the rollout."""
        written = self._written.get((self.k.rollouts, rollout_id), _ABSENT)
        if written is not _ABSENT or rollout_id in self._attempt_texts:
            return self._hget(self.k.rollouts, rollout_id)
        text, attempts = self.conn.calls(
            [("HGET", self.k.rollouts, rollout_id), ("HGETALL", self.k.attempts(rollout_id))]
        )
        self._attempt_texts[rollout_id] = _pairs(attempts)
        return None if text is None else text.decode()

    def _attempt_text(self, rollout_id: str, attempt_id: str) -> str | None:
        key = self.k.attempts(rollout_id)
        written = self._written.get((key, attempt_id), _ABSENT)
        if written is not _ABSENT:
            return written
        stored = self._attempt_texts.get(rollout_id)
        return stored.get(attempt_id) if stored is not None else self._hget(key, attempt_id)

    # ---- rollouts
    def get_rollout(self, rollout_id: str) -> Rollout | None:
        text = self._rollout_text(rollout_id)
        return from_json(Rollout, text) if text is not None else None

    def peek_rollout(self, rollout_id: str) -> Rollout | None:
        text = self._rollout_text(rollout_id)
        return self.views.view(Rollout, (rollout_id,), text) if text is not None else None

    def insert_rollouts(self, rollouts: Sequence[Rollout]) -> None:
        self._hset(self.k.rollouts, {r.rollout_id: _text(r) for r in rollouts})
        if rollouts:
            self._write("ZADD", self.k.by_enqueue, *[part for r in rollouts for part in (r.enqueue_time, r.rollout_id)])
        limits = {
            r.rollout_id: f"[{_number(r.config.timeout_seconds)},{_number(r.config.unresponsive_seconds)}]"
            for r in rollouts
            if r.config.timeout_seconds is not None or r.config.unresponsive_seconds is not None
        }
        self._hset(self.k.limits, limits)

    def save_rollout(self, rollout: Rollout, *, private: bool = False) -> None:
        text = _text(rollout)
        self._hset(self.k.rollouts, {rollout.rollout_id: text})
        if private:
            self.views.keep((rollout.rollout_id,), text, rollout)
        else:
            self.views.forget((rollout.rollout_id,))

    def push_queue(self, rollout_ids: Sequence[str]) -> None:
        if rollout_ids:
            self._write("RPUSH", self.k.queue, *rollout_ids)

    def has_queued(self) -> bool:
        return bool(self.conn.call("LLEN", self.k.queue))

    def pop_queue(self, limit: int) -> list[str]:
        # The only read of the queue, and the core's first queue operation in its transaction.
        ids = [value.decode() for value in self.conn.call("LRANGE", self.k.queue, 0, limit - 1)]
        if ids:
            self._write("LTRIM", self.k.queue, len(ids), -1)
        return ids

    def remove_from_queue(self, rollout_id: str) -> None:
        self._write("LREM", self.k.queue, 1, rollout_id)

    def _rollouts_for(self, filter: RolloutFilter) -> list[Rollout]:
        if filter.rollout_ids is not None:
            if not filter.rollout_ids:
                return []
            texts = self.conn.call("HMGET", self.k.rollouts, *filter.rollout_ids)
        else:
            texts = self.conn.call("HVALS", self.k.rollouts)
        return from_json_many(Rollout, (text for text in texts if text is not None))

    def query_rollouts(self, filter: RolloutFilter) -> list[Rollout]:
        if _unfiltered(filter) and filter.sort_by == "enqueue_time":
            # Ties in a sorted set go by member, as filter_and_page breaks them by rollout id.
            if filter.limit == 0:
                return []
            stop = -1 if filter.limit is None else filter.offset + filter.limit - 1
            ids = self.conn.call("ZREVRANGE" if filter.descending else "ZRANGE", self.k.by_enqueue, filter.offset, stop)
            if not ids:
                return []
            texts = self.conn.call("HMGET", self.k.rollouts, *ids)
            return from_json_many(Rollout, (text for text in texts if text is not None))
        return filter_and_page(self._rollouts_for(filter), filter)

    def count_rollouts(self, filter: RolloutFilter) -> int:
        if _unfiltered(filter):
            return int(self.conn.call("HLEN", self.k.rollouts))
        return len(filter_and_page(self._rollouts_for(filter), filter.model_copy(update={"limit": None, "offset": 0})))

    # ---- attempts
    def get_attempt(self, rollout_id: str, attempt_id: str) -> Attempt | None:
        text = self._attempt_text(rollout_id, attempt_id)
        return from_json(Attempt, text) if text is not None else None

    def peek_attempt(self, rollout_id: str, attempt_id: str) -> Attempt | None:
        text = self._attempt_text(rollout_id, attempt_id)
        return self.views.view(Attempt, (rollout_id, attempt_id), text) if text is not None else None

    def get_attempts(self, rollout_id: str) -> list[Attempt]:
        stored = self._attempt_texts.get(rollout_id)
        attempts = from_json_many(Attempt, self._hgetall(self.k.attempts(rollout_id), stored).values())
        return sorted(attempts, key=lambda attempt: attempt.sequence_id)

    def insert_attempt(self, attempt: Attempt) -> None:
        self._hset(self.k.attempts(attempt.rollout_id), {attempt.attempt_id: _text(attempt)})
        self._hset(self.k.active, {attempt.rollout_id: attempt.attempt_id})

    def save_attempt(self, attempt: Attempt, *, private: bool = False) -> None:
        text = _text(attempt)
        key = (attempt.rollout_id, attempt.attempt_id)
        self._hset(self.k.attempts(attempt.rollout_id), {attempt.attempt_id: text})
        if attempt.status.is_terminal:  # only the latest attempt can be active, and this one was
            self._hdel(self.k.active, attempt.rollout_id)
        if private:
            self.views.keep(key, text, attempt)
        else:
            self.views.forget(key)

    def attempt_clocks(self) -> list[AttemptClock]:
        active = self._hgetall(self.k.active)
        if not active:
            return []
        rollout_ids = list(active)
        limits = self.conn.call("HMGET", self.k.limits, *rollout_ids)
        timed = [(rid, limit) for rid, limit in zip(rollout_ids, limits, strict=True) if limit is not None]
        if not timed:
            return []
        texts = self.conn.calls([("HGET", self.k.attempts(rid), active[rid]) for rid, _ in timed])
        clocks = []
        for (rollout_id, limit), text in zip(timed, texts, strict=True):
            if text is None:
                continue
            attempt = from_json(Attempt, text)
            timeout, unresponsive = _numbers(limit)
            clocks.append(
                AttemptClock(
                    rollout_id,
                    attempt.attempt_id,
                    attempt.start_time,
                    attempt.last_heartbeat_time,
                    timeout,
                    unresponsive,
                )
            )
        return clocks

    # ---- spans
    def insert_spans(self, rollout_id: str, spans: Sequence[Span]) -> list[tuple[Span, bool]]:
        spans_key, ids_key = self.k.spans(rollout_id), self.k.span_ids(rollout_id)
        names = list(dict.fromkeys(f"{span.attempt_id}\0{span.span_id}" for span in spans))
        found, length = self.conn.calls([("HMGET", ids_key, *names), ("LLEN", spans_key)])
        stored = {name: int(seq) for name, seq in zip(names, found, strict=True) if seq is not None}
        existing: dict[str, Span] = {}
        if stored:
            entries = self.conn.calls([("LINDEX", spans_key, seq - 1) for seq in stored.values()])
            existing = {
                name: from_json(Span, entry.split(_NUL, 2)[2]) for name, entry in zip(stored, entries, strict=True)
            }
        top = length + self._new_spans.get(rollout_id, 0)
        fresh: dict[str, Span] = {}
        results: list[tuple[Span, bool]] = []
        for span in spans:
            name = f"{span.attempt_id}\0{span.span_id}"
            if name in existing:
                results.append((existing[name], False))
            elif name in fresh:  # a repeat within this batch
                results.append((fresh[name], False))
            else:
                top += 1
                fresh[name] = evolved(span, sequence_id=top)
                results.append((fresh[name], True))
        if fresh:
            self._new_spans[rollout_id] = top - length
            self._write(
                "RPUSH", spans_key, *[f"{s.attempt_id}\0{s.name}\0".encode() + to_json(s) for s in fresh.values()]
            )
            self._write("HSET", ids_key, *[part for name, s in fresh.items() for part in (name, s.sequence_id)])
        return results

    def query_spans(
        self, rollout_id: str, attempt_id: str | None, name: str | None, after_sequence_id: int, limit: int | None
    ) -> list[Span]:
        key = self.k.spans(rollout_id)
        start = max(0, after_sequence_id)
        if limit == 0:
            return []
        if attempt_id is None and name is None:
            stop = -1 if limit is None else start + limit - 1
            return from_json_many(Span, (e.split(_NUL, 2)[2] for e in self.conn.call("LRANGE", key, start, stop)))
        want_attempt = None if attempt_id is None else attempt_id.encode()
        want_name = None if name is None else name.encode()
        texts: list[bytes] = []
        while limit is None or len(texts) < limit:
            chunk = self.conn.call("LRANGE", key, start, start + _SCAN_CHUNK - 1)
            for entry in chunk:
                span_attempt, span_name, text = entry.split(_NUL, 2)
                if want_attempt not in (None, span_attempt) or want_name not in (None, span_name):
                    continue
                texts.append(text)
            if len(chunk) < _SCAN_CHUNK:
                break
            start += _SCAN_CHUNK
        return from_json_many(Span, texts if limit is None else texts[:limit])

    # ---- resources
    def get_resources(self, resources_id: str) -> Resources | None:
        text = self._hget(self.k.resources, resources_id)
        return from_json(Resources, text) if text is not None else None

    def latest_resources(self) -> Resources | None:
        top = self.conn.call("ZRANGE", self.k.versions, -1, -1)
        return self.get_resources(top[0].decode()) if top else None

    def insert_resources(self, resources: Resources) -> None:
        self._hset(self.k.resources, {resources.resources_id: _text(resources)})
        self._write("ZADD", self.k.versions, resources.version, resources.resources_id)

    def all_resources(self) -> list[Resources]:
        ids = self.conn.call("ZRANGE", self.k.versions, 0, -1)
        if not ids:
            return []
        return from_json_many(Resources, self.conn.call("HMGET", self.k.resources, *ids))

    # ---- workers and metrics
    def save_worker(self, worker: Worker) -> None:
        self._hset(self.k.workers, {worker.worker_id: _text(worker)})

    def all_workers(self) -> list[Worker]:
        workers = self._hgetall(self.k.workers)
        return from_json_many(Worker, (workers[worker_id] for worker_id in sorted(workers)))

    def insert_metrics(self, records: Sequence[MetricRecord]) -> None:
        if records:
            self._write("RPUSH", self.k.metrics, *[r.run_id.encode() + _NUL + to_json(r) for r in records])

    def query_metrics(self, run_id: str | None) -> list[MetricRecord]:
        entries = (entry.split(_NUL, 1) for entry in self.conn.call("LRANGE", self.k.metrics, 0, -1))
        wanted = None if run_id is None else run_id.encode()
        return from_json_many(MetricRecord, (text for run, text in entries if wanted is None or run == wanted))

    # ---- idempotency records
    def find_replay(self, scope: str, key: str) -> tuple[str, str] | None:
        found = self._hget(self.k.replays, f"{scope}\0{key}")
        if found is None:
            return None
        fingerprint, _, answer = found.partition("\0")
        return fingerprint, answer

    def save_replay(self, scope: str, key: str, fingerprint: str, answer: str, stamp: float) -> None:
        member = f"{scope}\0{key}"
        self._hset(self.k.replays, {member: f"{fingerprint}\0{answer}"})
        self._write("ZADD", self.k.replay_times, stamp, member)
        self._new_replays += 1

    def prune_replays(self, expired_before: float, keep: int) -> None:
        """Records of this transaction are the newest: the oldest on the server go first."""
        expired, count = self.conn.calls(
            [
                ("ZRANGEBYSCORE", self.k.replay_times, "-inf", f"({expired_before!r}"),
                ("ZCARD", self.k.replay_times),
            ]
        )
        surplus = min(count, count + self._new_replays - keep)
        oldest = self.conn.call("ZRANGE", self.k.replay_times, 0, surplus - 1) if surplus > 0 else []
        doomed = list(dict.fromkeys([*expired, *oldest]))
        if doomed:
            self._write("HDEL", self.k.replays, *doomed)
            self._write("ZREM", self.k.replay_times, *doomed)


_ORDER_AND_PAGE = frozenset({"sort_by", "descending", "limit", "offset"})


def _pairs(flat: list[bytes]) -> dict[str, str]:
    """A hash as ``HGETALL`` sends it (field, value, field, value…) as a dict of text."""
    return {flat[i].decode(): flat[i + 1].decode() for i in range(0, len(flat), 2)}


def _unfiltered(filter: RolloutFilter) -> bool:
    """Whether ``filter`` selects every rollout (it may still sort and page them)."""
    return all(getattr(filter, name) is None for name in type(filter).model_fields if name not in _ORDER_AND_PAGE)


def _number(value: float | None) -> str:
    return "null" if value is None else repr(float(value))


def _numbers(text: bytes) -> tuple[float | None, float | None]:
    timeout, unresponsive = (None if part == b"null" else float(part) for part in text.strip(b"[]").split(b","))
    return timeout, unresponsive


@reads_apart
class RedisStore(TransactionalStore):
    """A store in a Redis database, under its own key prefix.

    Args:
        url: ``redis://[:password@]host:6379/0`` (or ``rediss://`` for TLS), optionally with
            ``?prefix=name``; other query parameters go to redis-py (``socket_timeout=…``).
        prefix: the key prefix (the same as the URL's ``prefix=``; naming two different ones is
            an error). Default ``agentgrad``.
        pool_size: most connections this object opens at once.
        lock_seconds: how long a writer may hold the store's lock; a holder slower than this
            (or cut off from Redis) has its lock expire and its call fails, writing nothing.
        clock: the wall clock of every stamp and watchdog check (see :class:`TransactionalStore`).
    """

    def __init__(
        self,
        url: str,
        *,
        watchdog_interval: float | None = 0.5,
        external_poll_interval: float = 0.05,
        prefix: str | None = None,
        pool_size: int = 16,
        connect_timeout: float = 5.0,
        socket_timeout: float = 30.0,
        lock_seconds: float = 10.0,
        clock: Callable[[], float] = now,
    ) -> None:
        url, named = parse_url(url)
        if named is not None and prefix is not None and named != prefix:
            raise ValueError(f"the URL names prefix {named!r} and the prefix argument {prefix!r}: name one")
        self.url = url
        self.prefix = _check_prefix(prefix if prefix is not None else named or DEFAULT_PREFIX)
        self._keys = _Keys(self.prefix)
        # Every connection of this object carries the lock's holder name: a waiter that finds no
        # connection so named knows the lock holder is dead (see the module docstring).
        self._lock = _Lock(
            self._keys.lock, max(1, int(lock_seconds * 1000)), f"agentgrad-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        )
        try:
            self._pool = redis.BlockingConnectionPool.from_url(
                url,
                max_connections=pool_size,
                timeout=socket_timeout,
                client_name=self._lock.holder,
                socket_connect_timeout=connect_timeout,
                socket_timeout=socket_timeout,
                protocol=2,  # the replies this module reads (redis-py 8 would speak RESP3)
            )
        except (ValueError, TypeError) as exc:
            raise ValueError(f"Redis URL {_redact(url)!r}: {exc}") from None
        self._writer = threading.Lock()
        self._local = threading.local()
        self._views = RowViews()
        try:
            self._setup()
        except BaseException:
            self._pool.disconnect()
            raise
        super().__init__(
            watchdog_interval=watchdog_interval, external_poll_interval=external_poll_interval, clock=clock
        )

    # ---- connections
    @contextlib.contextmanager
    def _connection(self) -> Iterator[Any]:
        """A connection of the pool (a redis-py ``Connection``); Redis errors become RedisStoreError."""
        try:
            connection = self._pool.get_connection()
        except redis.RedisError as exc:
            raise RedisStoreError(f"cannot reach Redis at {_redact(self.url)}: {exc}") from None
        try:
            yield connection
        except (redis.RedisError, OSError) as exc:
            connection.disconnect()  # its replies may be half read; a dead connection drops its WATCH
            what = "refused a command" if isinstance(exc, redis.ResponseError) else "could not be reached"
            raise RedisStoreError(f"Redis at {_redact(self.url)} {what}: {exc}") from None
        finally:
            self._pool.release(connection)

    def _setup(self) -> None:
        with self._connection() as connection:
            conn = _Conn(connection)
            conn.call("HSETNX", self._keys.meta, "schema_version", SCHEMA_VERSION)
            found = conn.call("HGET", self._keys.meta, "schema_version").decode()
            if found != SCHEMA_VERSION:
                raise StoreFileError(
                    f"Redis prefix {self.prefix!r} at {_redact(self.url)} has store schema version "
                    f"{found}, this AgentGrad needs {SCHEMA_VERSION}"
                )
            self._warn_if_volatile(conn)

    def _warn_if_volatile(self, conn: _Conn) -> None:
        """Warn (once per server) when the server persists nothing: a Redis restart would lose the
        whole store. Servers that refuse ``CONFIG GET`` (managed services) are not judged."""
        try:
            appendonly, save = (
                reply[1] for reply in conn.calls([("CONFIG", "GET", "appendonly"), ("CONFIG", "GET", "save")])
            )
        except redis.ResponseError:
            return
        server = _redact(self.url).partition("?")[0]
        if appendonly == b"no" and not save.strip() and server not in _WARNED:
            _WARNED.add(server)
            log.warning(
                "Redis at %s persists nothing (appendonly no, no save points): the store survives any "
                "client's crash but not a Redis restart; for that run Redis with appendonly yes "
                "(docs/store-service.md#redis)",
                server,
            )

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[StoreTx]:
        if getattr(self._local, "read_only", False):
            with self._connection() as connection:
                yield RedisTx(_Conn(connection), self._keys, self._views, writable=False)
            return
        with self._writer, self._connection() as connection:
            writer = _WriterConn(connection, self._lock)
            tx = RedisTx(writer, self._keys, self._views, writable=True)
            try:
                yield tx
            except BaseException:
                writer.abandon()
                raise
            writer.commit([*tx.writes, ("INCR", self._keys.version)] if tx.writes else [])

    def _outside_version(self) -> object | None:
        """The store's version key, which every commit that writes increments in its ``MULTI``
        (no round trip of its own): it moves with every change — another process's, and this
        store's own (those also notify the waiters at once) — and not for a call that found
        nothing to change. None when Redis cannot be reached: then every waiter looks itself, and
        meets the outage there."""
        if self._closed.is_set():
            return None
        try:
            with self._connection() as connection:
                return _Conn(connection).call("GET", self._keys.version) or b"0"
        except RedisStoreError:
            return None

    def _close_backend(self) -> None:
        self._pool.disconnect()

    def drop(self) -> int:
        """Delete every key of this store's prefix (its whole data); returns how many were deleted.

        For tests and scratch runs: the store must not be used afterwards by anyone."""
        deleted = 0
        with self._connection() as connection:
            conn, cursor = _Conn(connection), b"0"
            while True:
                cursor, keys = conn.call("SCAN", cursor, "MATCH", self._keys.pattern, "COUNT", 1000)
                if keys:
                    deleted += conn.call("UNLINK", *keys)
                if cursor in (b"0", 0):
                    return deleted

    @property
    def shared_url(self) -> str:
        """The URL with ``prefix=`` added (``open_store`` reads it back)."""
        query = urllib.parse.urlencode({PREFIX_PARAMETER: self.prefix})
        return f"{self.url}{'&' if '?' in self.url else '?'}{query}"

    def __repr__(self) -> str:
        return f"RedisStore({_redact(self.url)!r}, prefix={self.prefix!r})"
