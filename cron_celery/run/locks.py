"""Redlock locks over Redis (pottery): one per job, and ``lock()`` for users' own code.

Redis makes exclusion cheap; the database claim keeps it correct. A job lock is taken
non-blocking before the claim and renewed every third of its TTL by the lease thread;
when no quorum of masters can be reached the run proceeds on the database path alone
and a ``lock degraded`` warning is logged (once per job per minute).
"""

from __future__ import annotations

import functools
import logging
import random
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
#: How soon ``lock`` tries a failed renewal again (never later than a third of its TTL).
_RETRY_SECONDS = 1.0


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
    if not job.exclusive or not conf.lock_masters():
        return None
    return JobLock(job.code)


class lock:  # lower-case: used like a function, ``with cron_celery.lock("name"):``
    """Cross-server exclusion for your own code, as a context manager or a decorator::

        with cron_celery.lock("rebuild-search-index", ttl=120) as held:
            for batch in batches:
                held.check()  # raises LockLost if the lock was lost meanwhile
                ...

        @cron_celery.lock("nightly-export")
        def export(): ...

    Non-blocking by default (``blocking=True`` waits up to ``timeout`` seconds). Raises
    ``LockUnavailable`` when another holder has it, and ``LockDegraded`` when no quorum of
    Redis masters answers. The lock is renewed every third of ``ttl`` while held; a renewal
    that fails (a Redis restart, a network blip) is tried again every second or so until the
    lock would have expired. Only then, or when Redis says the lock is no longer this holder's
    (its key was deleted or taken), is it lost: ``lost`` is set, a warning is logged, and
    ``check()`` raises ``LockLost``.
    """

    def __init__(self, name: str, *, ttl: float = 60, blocking: bool = False, timeout: float = -1) -> None:
        if not name:
            raise ValueError("a lock needs a name")
        if not blocking and timeout != -1:
            raise ValueError("a timeout needs blocking=True")
        self.name = name
        self.ttl = float(ttl)
        self.blocking = blocking
        self.timeout = timeout
        #: Set when the lock was lost while held; another process may hold it now.
        self.lost = threading.Event()
        self._held: Redlock | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def __enter__(self) -> lock:
        redlock = _redlock(f"{conf.lock_prefix()}:lock:{self.name}", self.ttl)
        try:
            asked = self._take(redlock)
        except QuorumIsImpossible as error:
            raise exceptions.LockDegraded(name=self.name) from error
        if asked is None:
            raise exceptions.LockUnavailable(name=self.name)
        self._held = redlock
        self._stop = threading.Event()  # one per hold: a previous hold's renewer never sees this one
        self.lost.clear()
        self._renewer = threading.Thread(target=self._renew, args=(redlock, self._stop, asked),
                                         name=f"lock:{self.name}", daemon=True)
        self._renewer.start()
        return self

    def _take(self, redlock: Redlock) -> float | None:
        """Try (again and again if blocking, until ``timeout``); the time just before the attempt
        that took the lock, from which its TTL runs at the earliest, or None."""
        deadline = None if self.timeout < 0 else time.monotonic() + self.timeout
        while True:
            asked = time.monotonic()
            if redlock.acquire(blocking=False):
                return asked
            if not self.blocking or (deadline is not None and time.monotonic() >= deadline):
                return None
            time.sleep(random.uniform(0.05, 0.2))

    def check(self) -> None:
        """Call it between units of work: raises ``LockLost`` once the lock was lost."""
        if self.lost.is_set():
            raise exceptions.LockLost(name=self.name)

    def _renew(self, redlock: Redlock, stop: threading.Event, confirmed: float) -> None:
        """Extend every third of the TTL. ``confirmed``: a time no later than the last
        extension that reached a quorum, so the lock lasts at least until ``confirmed + ttl``."""
        period = self.ttl / 3
        wait, failures = period, 0
        while not stop.wait(wait):
            asked = time.monotonic()
            try:
                redlock.extend()
            except ExtendUnlockedLock:
                if not stop.is_set():  # not released meanwhile by its holder
                    self._lose("Redis no longer holds it for this holder")
                return
            except (QuorumIsImpossible, TooManyExtensions, redis.RedisError) as error:
                if stop.is_set():
                    return
                left = confirmed + self.ttl - time.monotonic()
                if left <= 0:
                    self._lose(f"it expired while it could not be renewed ({type(error).__name__})")
                    return
                if not failures:
                    logger.warning("lock %s could not be renewed (%s); trying again until it would expire in "
                                   "%.1f s", self.name, type(error).__name__, left)
                failures += 1
                wait = min(period, _RETRY_SECONDS, left)
                continue
            if failures:
                logger.warning("lock %s renewed again after %d failed attempts", self.name, failures)
            confirmed, wait, failures = asked, period, 0

    def _lose(self, why: str) -> None:
        logger.warning("lock %s was lost while held: %s; its holder is told (lock.lost, check())", self.name, why)
        self.lost.set()

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
