"""Redlock locks over Redis (pottery): one per job, and ``lock()`` for users' own code.

Redis makes exclusion cheap; the database claim keeps it correct. A job lock is taken
non-blocking before the claim and renewed every third of its TTL by the lease thread;
when no quorum of masters can be reached the run proceeds on the database path alone
and a ``lock degraded`` warning is logged (once per job per minute).
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

import redis
from pottery import Redlock
from pottery.exceptions import ExtendUnlockedLock, QuorumIsImpossible, ReleaseUnlockedLock, TooManyExtensions

from cron_celery import conf, exceptions

logger = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])

#: Outcomes of ``JobLock.acquire``.
HELD, BUSY, DEGRADED = "held", "busy", "degraded"

_clients: dict[str, redis.Redis] = {}
_clients_lock = threading.Lock()
_degraded_logged: dict[str, float] = {}


def masters() -> frozenset[redis.Redis]:
    """One client per configured master URL, shared by the process."""
    urls = conf.lock_masters()
    with _clients_lock:
        for url in urls:
            if url not in _clients:
                _clients[url] = redis.Redis.from_url(
                    url, socket_connect_timeout=0.5, socket_timeout=0.5, health_check_interval=0
                )
        return frozenset(_clients[url] for url in urls)


def _redlock(key: str, ttl: float) -> Redlock:
    return Redlock(
        key=key, masters=masters(), auto_release_time=ttl, raise_on_redis_errors=True,
        # Renewed for as long as the run lasts: hours-long runs must never run out.
        num_extensions=sys.maxsize,
    )


def warn_degraded(name: str, error: BaseException, extra: dict[str, object] | None = None) -> None:
    """Log ``lock degraded`` at most once per lock name per minute."""
    now = time.monotonic()
    if now - _degraded_logged.get(name, -1e9) >= 60:
        _degraded_logged[name] = now
        logger.warning(
            "lock degraded: no quorum of Redis masters for %s (%s); continuing on the database "
            "claim alone", name, type(error).__name__, extra=extra or {},
        )


class JobLock:
    """The Redlock ``job:{code}`` held around one run of a job."""

    def __init__(self, code: str, ttl: float | None = None) -> None:
        self.name = f"job:{code}"
        self.ttl = float(ttl if ttl is not None else conf.settings.LOCK["TTL"])
        self._lock = _redlock(f"{conf.lock_prefix()}:{self.name}", self.ttl)
        self.state = ""

    def acquire(self, extra: dict[str, object] | None = None) -> str:
        """HELD, BUSY (someone else holds it) or DEGRADED (no quorum: go on without it)."""
        try:
            self.state = HELD if self._lock.acquire(blocking=False) else BUSY
        except QuorumIsImpossible as error:
            warn_degraded(self.name, error, extra)
            self.state = DEGRADED
        return self.state

    def extend(self) -> bool:
        """Renew the TTL; False when the lock was lost (expired, flushed or taken)."""
        if self.state != HELD:
            return True
        try:
            self._lock.extend()
        except ExtendUnlockedLock:
            self.state = "lost"
            return False
        except (QuorumIsImpossible, TooManyExtensions) as error:
            warn_degraded(self.name, error)
            self.state = DEGRADED
        return True

    def release(self) -> None:
        """Give the lock back; one that already expired is logged, not raised."""
        if self.state != HELD:
            return
        self.state = "released"
        try:
            self._lock.release()
        except ReleaseUnlockedLock:
            logger.info("lock %s had already expired when released", self.name)
        except (QuorumIsImpossible, redis.RedisError) as error:
            logger.warning("could not release lock %s: %s", self.name, error)


def for_job(job: Any) -> JobLock | None:
    """The job's lock, or None when the job needs none (overlap ``allow``: the database
    decides the slot alone) or no Redis master is configured."""
    from cron_celery import models

    exclusive = job.overlap == models.Overlap.SKIP or job.pattern == models.ExecutionPattern.RATE_LIMITED
    if not exclusive or not conf.lock_masters():
        return None
    return JobLock(job.code)


class lock:  # lower-case: used like a function, ``with cron_celery.lock("name"):``
    """Cross-server exclusion for your own code, as a context manager or a decorator::

        with cron_celery.lock("rebuild-search-index", ttl=120):
            ...

        @cron_celery.lock("nightly-export")
        def export(): ...

    Non-blocking by default (``blocking=True`` waits up to ``timeout`` seconds). Raises
    ``LockUnavailable`` when another holder has it, and ``LockDegraded`` when no quorum of
    Redis masters answers. The lock is renewed every third of ``ttl`` while held.
    """

    def __init__(self, name: str, *, ttl: float = 60, blocking: bool = False, timeout: float = -1) -> None:
        if not name:
            raise ValueError("a lock needs a name")
        self.name = name
        self.ttl = float(ttl)
        self.blocking = blocking
        self.timeout = timeout
        self._held: Redlock | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def __enter__(self) -> lock:
        redlock = _redlock(f"{conf.lock_prefix()}:lock:{self.name}", self.ttl)
        try:
            acquired = redlock.acquire(blocking=self.blocking, timeout=self.timeout)
        except QuorumIsImpossible as error:
            raise exceptions.LockDegraded(name=self.name) from error
        if not acquired:
            raise exceptions.LockUnavailable(name=self.name)
        self._held = redlock
        self._stop.clear()
        self._renewer = threading.Thread(target=self._renew, name=f"lock:{self.name}", daemon=True)
        self._renewer.start()
        return self

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            held = self._held
            if held is None:
                return
            try:
                held.extend()
            except (ExtendUnlockedLock, QuorumIsImpossible, redis.RedisError) as error:
                logger.warning("lock %s could not be renewed: %s", self.name, error)
                return

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        held, self._held = self._held, None
        if held is None:
            return
        try:
            held.release()
        except ReleaseUnlockedLock:
            logger.info("lock %s had already expired when released", self.name)
        except (QuorumIsImpossible, redis.RedisError) as error:
            logger.warning("could not release lock %s: %s", self.name, error)

    def __call__(self, func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with lock(self.name, ttl=self.ttl, blocking=self.blocking, timeout=self.timeout):
                return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]
