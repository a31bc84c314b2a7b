"""``cron_celery.lock`` for users' own code, and the job lock's states, on real Redis servers."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.test import override_settings

import cron_celery
from cron_celery import exceptions
from cron_celery.run import locks
from tests.redis_servers import RedisServer


@pytest.fixture
def master(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path).start()
    with override_settings(CRON_CELERY={"LOCK": {"MASTERS": [server.url], "TTL": 60}}):
        yield server
    server.stop()


def name() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


def test_lock_is_exclusive_and_released_on_exit(master):
    key = name()
    with cron_celery.lock(key):
        with pytest.raises(cron_celery.LockUnavailable, match=key), cron_celery.lock(key):
            pass
        assert master.client().keys("*:lock:*")
    with cron_celery.lock(key):  # free again
        pass
    assert master.client().keys("*:lock:*") == []


def test_lock_as_a_decorator_and_released_when_the_body_raises(master):
    key = name()
    calls = []

    @cron_celery.lock(key, ttl=5)
    def export(n):
        calls.append(n)
        with pytest.raises(exceptions.LockUnavailable), cron_celery.lock(key):
            pass
        if n == 2:
            raise ValueError("boom")
        return n * 10

    assert export(1) == 10
    with pytest.raises(ValueError, match="boom"):
        export(2)
    assert export(3) == 30 and calls == [1, 2, 3]


def test_lock_is_renewed_while_held_past_its_ttl(master):
    key = name()
    with cron_celery.lock(key, ttl=0.6):
        time.sleep(2.0)  # more than three TTLs
        with pytest.raises(exceptions.LockUnavailable), cron_celery.lock(key):
            pass


def test_a_blocking_lock_waits_for_the_holder(master):
    key = name()
    got = threading.Event()

    def holder():
        with cron_celery.lock(key):
            got.set()
            time.sleep(0.5)

    thread = threading.Thread(target=holder)
    thread.start()
    got.wait(5)
    started = time.monotonic()
    with cron_celery.lock(key, blocking=True, timeout=5):
        waited = time.monotonic() - started
    thread.join()
    assert waited > 0.2


def test_no_quorum_raises_lock_degraded(tmp_path):
    servers = [RedisServer(tmp_path).start() for _ in range(3)]
    try:
        servers[0].stop()
        servers[1].stop()
        with override_settings(CRON_CELERY={"LOCK": {"MASTERS": [s.url for s in servers], "TTL": 60}}):
            with pytest.raises(exceptions.LockDegraded, match="quorum"), cron_celery.lock(name()):
                pass
            job_lock = locks.JobLock("T-degraded")
            assert job_lock.acquire() == locks.DEGRADED
            assert job_lock.extend() is True
            job_lock.release()  # nothing held: nothing to do, no error
    finally:
        for server in servers:
            server.stop()


def test_job_lock_states(master):
    first, second = locks.JobLock("T-states"), locks.JobLock("T-states")
    assert first.acquire() == locks.HELD
    assert second.acquire() == locks.BUSY
    assert first.extend() is True
    master.client().flushall()  # the lock vanished under its holder
    assert first.extend() is False
    first.release()  # already gone: logged, not raised
    assert second.acquire() == locks.HELD
    second.release()


def test_jobs_that_allow_overlap_take_no_lock(master):
    from cron_celery.declaring import registry

    allow = registry.declare(name="a", code="A-allow", task_name="x", overlap="allow")
    skip = registry.declare(name="b", code="B-skip", task_name="y", overlap="skip")
    limited = registry.declare(name="c", code="C-rl", task_name="z", overlap="allow", pattern="rate_limited")
    assert locks.for_job(allow) is None
    assert isinstance(locks.for_job(skip), locks.JobLock)
    assert isinstance(locks.for_job(limited), locks.JobLock)


def test_a_lock_works_in_a_process_whose_settings_name_no_database(master):
    """``cron_celery.lock`` in a script configured without DATABASES (Django's default: none).
    Before, naming its Redis key read DATABASES["default"] and raised KeyError (the lock benchmark
    configures Django so)."""
    import subprocess
    import sys

    code = f"""
import django
from django.conf import settings
settings.configure(INSTALLED_APPS=[], USE_TZ=True, SECRET_KEY="x",
                   CRON_CELERY={{"LOCK": {{"MASTERS": ["{master.url}"], "TTL": 5}}}})
django.setup()
import cron_celery
from cron_celery import conf
with cron_celery.lock("no-database-{uuid.uuid4().hex[:8]}"):
    print("held", conf.lock_prefix())
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["held", "cron_celery:"]
