"""Opener of the conformance suite's "redis" backend (registered in ``tests/store/conftest.py``).

Every test gets its own key prefix (named from the test's data dir) in the Redis at
``AGENTGRAD_TEST_REDIS`` (default ``redis://127.0.0.1:6379/0``); the keys of every prefix a test
used are deleted when the test session ends. Tests skip when no Redis answers there (and fail in
CI, where ``.ci/run`` starts one).
"""

from __future__ import annotations

import atexit
import hashlib
import os
from pathlib import Path
from typing import Any

from service_backends import skip_unless_ci

REDIS_URL = os.environ.get("AGENTGRAD_TEST_REDIS", "redis://127.0.0.1:6379/0")
_PREFIX = f"agtest-{os.getpid()}-"
_prefixes: set[str] = set()


def redis_prefix(data_dir: Path) -> str:
    return _PREFIX + hashlib.sha1(str(data_dir).encode()).hexdigest()[:12]


def redis_available() -> bool:
    import redis

    try:
        with redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2, socket_timeout=2) as client:
            return bool(client.ping())
    except redis.RedisError:
        return False


def open_redis(data_dir: Path, options: dict[str, Any]) -> Any:
    from agentgrad.store.redis import RedisStore

    if not redis_available():
        skip_unless_ci(f"no Redis at {REDIS_URL}")
    prefix = redis_prefix(data_dir)
    if not _prefixes:
        atexit.register(drop_prefixes)
    _prefixes.add(prefix)
    return RedisStore(REDIS_URL, prefix=prefix, **options)


def redis_child(data_dir: Path) -> str:
    return (
        "from agentgrad.store.redis import RedisStore\n"
        f"store = RedisStore({REDIS_URL!r}, prefix={redis_prefix(data_dir)!r}, watchdog_interval=None)\n"
    )


def drop_prefixes() -> None:
    """Delete the keys of every prefix this process used (they all start with ``_PREFIX``)."""
    import redis

    with redis.Redis.from_url(REDIS_URL) as client:
        batch = []
        for key in client.scan_iter(f"{_PREFIX}*", count=1000):
            batch.append(key)
            if len(batch) == 1000:
                client.unlink(*batch)
                batch.clear()
        if batch:
            client.unlink(*batch)
    _prefixes.clear()
