"""The lock variants ``bench/locks.py`` times, each one acquire + release of a key of its own.

From the floor up: the raw Redis commands (one master, and three in turn), redis-py's ``Lock``,
pottery's ``Redlock`` and cron_celery's ``JobLock``, the last two with one and with three masters.
Each variant makes its clients once, so that no connection is opened inside a timed chunk.
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import redis

from bench.common import BenchError
from bench.redis_server import nothing

TTL = 60  # seconds, cron_celery's default LOCK["TTL"]
TAG = uuid.uuid4().hex[:8]

#: redis-py's own release script, and pottery's: compare the token, then delete.
COMPARE_AND_DELETE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('del', KEYS[1])
else
    return 0
end
"""


@dataclasses.dataclass
class Variant:
    """``one(i)`` is one acquire + release of the ``i``-th key. Clients are made once per
    variant (no connects inside the timed chunks); ``active()`` is entered around each
    chunk and ``close()`` is called at the end."""

    key: str
    label: str
    masters: int
    one: Callable[[int], None]
    close: Callable[[], None]
    active: Callable[[], contextlib.AbstractContextManager[None]] = nothing
    floor: bool = False
    reference_only: bool = False  # shown, but no target depends on it


def plain_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url)


def close_all(clients: Iterable[redis.Redis]) -> Callable[[], None]:
    def close() -> None:
        for client in clients:
            client.close()

    return close


def raw_variant(key: str, label: str, urls: list[str], **options: Any) -> Variant:
    clients = [plain_client(url) for url in urls]
    release_script = clients[0].register_script(COMPARE_AND_DELETE)
    ttl_ms = TTL * 1000
    prefix = f"bench-locks:{TAG}:{key}"

    def one(i: int) -> None:
        name = f"{prefix}:{i}"
        token = uuid.uuid4().hex
        for client in clients:
            if not client.set(name, token, nx=True, px=ttl_ms):
                raise BenchError(f"raw SET NX on {name} did not acquire")
        for client in clients:
            if release_script(keys=[name], args=[token], client=client) != 1:
                raise BenchError(f"raw release of {name} deleted nothing")

    return Variant(key, label, len(urls), one, close_all(clients), **options)


def redis_py_variant(key: str, label: str, url: str) -> Variant:
    client = plain_client(url)
    prefix = f"bench-locks:{TAG}:{key}"

    def one(i: int) -> None:
        lock = client.lock(f"{prefix}:{i}", timeout=TTL)
        if not lock.acquire(blocking=False):
            raise BenchError(f"redis-py lock {prefix}:{i} did not acquire")
        lock.release()

    return Variant(key, label, 1, one, client.close)


def pottery_variant(key: str, label: str, urls: list[str]) -> Variant:
    from pottery import Redlock

    clients = frozenset(plain_client(url) for url in urls)
    prefix = f"bench-locks:{TAG}:{key}"

    def one(i: int) -> None:
        lock = Redlock(key=f"{prefix}:{i}", masters=clients, auto_release_time=TTL,
                       raise_on_redis_errors=True)
        if not lock.acquire(blocking=False):
            raise BenchError(f"pottery Redlock {prefix}:{i} did not acquire")
        lock.release()

    return Variant(key, label, len(urls), one, close_all(clients))


def cron_celery_variant(key: str, label: str, urls: list[str]) -> Variant:
    """``JobLock`` as a worker uses it: masters from ``CRON_CELERY["LOCK"]`` (switched with
    ``override_settings`` around each chunk), clients shared by the process."""
    from django.test import override_settings

    from cron_celery import conf
    from cron_celery.run import locks

    @contextlib.contextmanager
    def active() -> Iterator[None]:
        with override_settings(CRON_CELERY={"LOCK": {"MASTERS": urls, "TTL": TTL}}):
            if conf.lock_masters() != urls:  # setting_changed must have reset conf's cache
                raise BenchError(f"conf.lock_masters() returned {conf.lock_masters()}, not {urls}")
            yield

    prefix = f"bench-{TAG}-{key}"

    def one(i: int) -> None:
        lock = locks.JobLock(f"{prefix}-{i}")
        state = lock.acquire()
        if state != locks.HELD:
            raise BenchError(f"JobLock {lock.name} acquire returned {state!r}")
        lock.release()

    return Variant(key, label, len(urls), one, lambda: None, active=active)


def build_variants(urls: list[str]) -> list[Variant]:
    one, three = urls[:1], urls[:3]
    return [
        raw_variant("raw", "raw SET NX PX + Lua compare-and-delete", one, floor=True),
        raw_variant("raw3", "raw SET NX PX + Lua, 3 masters in turn", three, reference_only=True),
        redis_py_variant("redis-py", "redis-py Lock (client.lock)", one[0]),
        pottery_variant("pottery1", "pottery Redlock", one),
        cron_celery_variant("cron1", "cron_celery JobLock", one),
        pottery_variant("pottery3", "pottery Redlock", three),
        cron_celery_variant("cron3", "cron_celery JobLock", three),
    ]


def close_variants(variants: list[Variant]) -> None:
    """Close the benchmark's own clients, and cron_celery's (made for these masters)."""
    for variant in variants:
        variant.close()
    from cron_celery.run import locks

    with locks._clients_lock:
        for client in locks._clients.values():
            client.close()
        locks._clients.clear()

