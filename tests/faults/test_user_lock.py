"""``cron_celery.lock`` through Redis outages, on redis-server processes of the test's own.

A short outage of the lock's master (a restart, a freeze) must not let the lock expire
under its holder: renewal goes on once the master answers again. A lock that is really
lost (its key deleted, or expired during an outage longer than its ``ttl``) tells its
holder: ``lost`` is set and ``check()`` raises ``LockLost``.
"""

from __future__ import annotations

import logging
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.test import override_settings

import cron_celery
from cron_celery import exceptions
from tests.conftest import wait_for
from tests.redis_servers import RedisServer

pytestmark = pytest.mark.slow


@pytest.fixture
def master(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path).start()
    with override_settings(CRON_CELERY={"LOCK": {"MASTERS": [server.url], "TTL": 60}}):
        yield server
    if server.proc is not None and server.proc.poll() is None:
        server.proc.send_signal(signal.SIGCONT)
    server.stop()


def name() -> str:
    return f"user-lock-{uuid.uuid4().hex[:8]}"


def renewal_failed(caplog: pytest.LogCaptureFixture) -> bool:
    """pottery logs each master that failed an extension."""
    return any("extend() caught" in record.getMessage() for record in caplog.records)


def test_a_lock_held_across_a_restart_of_its_master_is_still_held_after_its_ttl(master, caplog):
    """The master is killed (its data saved) and started again on the same port while the lock
    is held; a renewal fails in between. Past the original TTL, nobody else can take the lock,
    and its holder has not been told it lost it."""
    caplog.set_level(logging.INFO)
    key, ttl = name(), 4.0
    took = time.monotonic()
    with cron_celery.lock(key, ttl=ttl) as held:
        master.client().save()  # the restarted server loads the key, with the expiry it had
        master.stop()
        wait_for(lambda: renewal_failed(caplog), timeout=ttl, what="a renewal to fail while the master is down")
        master.start()
        time.sleep(max(0.0, took + 2 * ttl - time.monotonic()))  # well past the TTL it was taken with
        with pytest.raises(exceptions.LockUnavailable), cron_celery.lock(key):
            pass
        assert not held.lost.is_set()
        held.check()  # does not raise
    with cron_celery.lock(key):  # released on exit: free again
        pass


def test_a_lock_whose_key_is_deleted_tells_its_holder(master):
    key = name()
    with cron_celery.lock(key, ttl=1.5) as held:
        assert not held.lost.is_set()
        held.check()
        master.client().flushall()  # the key is gone: anyone may take the lock now
        wait_for(held.lost.is_set, timeout=10, what="the holder to be told")
        with pytest.raises(cron_celery.LockLost, match=key):
            held.check()
        with cron_celery.lock(key):  # really free: another holder takes it
            pass
    assert issubclass(cron_celery.LockLost, exceptions.CronCeleryError)


def test_a_lock_that_expires_during_a_long_outage_tells_its_holder(master):
    """The master freezes (SIGSTOP: every call times out) for longer than the TTL: the holder
    is told while the outage lasts; once the master is back the lock is indeed free."""
    key, ttl = name(), 1.5
    with cron_celery.lock(key, ttl=ttl) as held:
        assert master.proc is not None
        master.proc.send_signal(signal.SIGSTOP)
        try:
            wait_for(held.lost.is_set, timeout=15, what="the holder to be told")
        finally:
            master.proc.send_signal(signal.SIGCONT)
        with pytest.raises(exceptions.LockLost):
            held.check()
        with cron_celery.lock(key):  # it had expired: another holder takes it
            pass
