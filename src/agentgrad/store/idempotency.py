"""Idempotency keys: what makes a retried write return its first answer instead of running again.

A caller whose write got no answer (the connection dropped, the service was killed and restarted)
cannot know whether the write ran. It sends it again with the same key, and the store answers
what it answered the first time. The record of that answer is written by the write's own
transaction, in the store's own database: the effect and the record are committed together or
not at all, so a crash between the commit and the reply leaves a record that the retry finds,
after any restart. (The memory backend keeps records in memory, as it keeps its data.)

The rules, once for every backend and for the service:

* a key is 1 to :data:`MAX_KEY_CHARS` printable ASCII characters; any other key is refused with
  :class:`~agentgrad.errors.InvalidInputError` (HTTP 400) before anything is kept;
* keys belong to one operation (the store method's name, the record's ``scope``), so the same
  key may name one enqueue and one dequeue;
* a record holds a fingerprint of the request: the same key with a different request is refused
  with :class:`~agentgrad.errors.IdempotencyKeyReusedError` (HTTP 422), as Stripe does;
* only writes that took effect are recorded. A refused write changed nothing, so its retry simply
  runs again; a dequeue that claimed nothing is not recorded either;
* records are removed :data:`TTL_SECONDS` after they were written, and at most
  :data:`MAX_RECORDS` are kept (the oldest go first). Pruning runs in the transaction of every
  :data:`PRUNE_EVERY`-th recorded write of a store object (and its first), so it costs a write
  next to nothing; the bounds are kept within that many records.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any, NamedTuple

import pydantic_core
from pydantic import TypeAdapter

from agentgrad.errors import IdempotencyKeyReusedError, InvalidInputError
from agentgrad.types import AttemptedRollout, Resources, Rollout

#: The longest key accepted, in characters (ASCII: bytes). A UUID is 32 or 36.
MAX_KEY_CHARS = 200
#: How long a record is kept, in seconds (of the store's clock): a day, as Stripe keeps keys.
TTL_SECONDS = 24 * 3600.0
#: The most records kept.
MAX_RECORDS = 100_000
#: Prune at the first recorded write of a store object and then every this many.
PRUNE_EVERY = 256

#: What each replayable operation answers: the type its record's answer is read back as.
ANSWER_TYPES: dict[str, Any] = {
    "enqueue_rollouts": list[Rollout],
    "dequeue_rollouts": list[AttemptedRollout],
    "cancel_rollout": Rollout,
    "add_resources": Resources,
    "add_metrics": None,
}


class Replay(NamedTuple):
    """One keyed call: the operation, the caller's key and the request's fingerprint."""

    scope: str
    key: str
    fingerprint: str


def check_key(key: str) -> str:
    """``key`` if it is an acceptable idempotency key; InvalidInputError naming the rule otherwise."""
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_CHARS or not (key.isascii() and key.isprintable()):
        shown = repr(key[:40]) + ("…" if len(key) > 40 else "") if isinstance(key, str) else type(key).__name__
        raise InvalidInputError(
            f"invalid idempotency key {shown} ({len(key) if isinstance(key, str) else '?'} characters): "
            f"use 1 to {MAX_KEY_CHARS} printable ASCII characters, e.g. a UUID"
        )
    return key


def replay(scope: str, key: str | None, *request: Any) -> Replay | None:
    """The :class:`Replay` of a call to ``scope`` with ``key`` (None without a key).

    ``request``: the call's arguments that decide its effect (models or JSON values), as the
    store validated them; their JSON is hashed into the fingerprint.
    """
    if key is None:
        return None
    check_key(key)
    digest = hashlib.sha256(scope.encode())
    for part in request:
        digest.update(b"\0")
        digest.update(pydantic_core.to_json(part))
    return Replay(scope, key, digest.hexdigest())


def refused(found: Replay) -> IdempotencyKeyReusedError:
    """The error for a key whose record was made for another request."""
    return IdempotencyKeyReusedError(
        f"idempotency key {found.key!r} was already used for a different {found.scope} request; "
        "send a new key with each new request (and the same key only with an exact retry)",
        key=found.key,
        operation=found.scope,
    )


def dump_answer(scope: str, answer: Any) -> str:
    """The JSON text a record keeps of ``answer``."""
    return _adapter(scope).serializer.to_json(answer).decode()  # not dump_json: its wrapper costs as much


def load_answer(scope: str, text: str | bytes) -> Any:
    """The answer a record kept, as the operation returns it."""
    return _adapter(scope).validator.validate_json(text)


@functools.cache
def _adapter(scope: str) -> TypeAdapter[Any]:
    return TypeAdapter(ANSWER_TYPES[scope])
