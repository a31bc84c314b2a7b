"""A worker frozen past its lease while it runs an exclusive job: the job's next run starts (the
frozen one no longer owns it), and when the frozen worker wakes up its run is fenced: its
outcome is not recorded beside the next run's, and the reconciler ends it ``LEASE_EXPIRED``.

Real prefork workers (SIGSTOP / SIGCONT on the whole worker), real PostgreSQL, a lock Redis of
the test's own; the bodies write a marker line when they end.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection

from cron_celery import reconciler
from cron_celery.declaring import registry
from cron_celery.models import CronExecution, CronJob, Status, Trigger
from cron_celery.run import tasks
from tests.conftest import marked, wait_for
from tests.redis_servers import RedisServer
from tests.workers import Worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

FIRST = dt.datetime(2026, 11, 21, 1, 0, tzinfo=dt.UTC)
SECOND = FIRST + dt.timedelta(hours=1)


@pytest.fixture
def lock_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path).start()
    yield server
    server.stop()


def _lease_expired(execution_id: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT lease_until < now() FROM cron_celery_cronexecution WHERE id = %s", [execution_id])
        row = cursor.fetchone()
    return bool(row and row[0])


@contextlib.contextmanager
def superseded(tmp_path: Path, env: dict[str, str], code: str) -> Iterator[tuple[Worker, int, int]]:
    """Job ``code``'s 01:00 slot starts on a prefork worker, which is then SIGSTOPped (its body, heartbeat,
    time limit and all) past its lease; another worker runs the 02:00 slot, superseding it. Yields the
    frozen worker (still stopped) and the two execution ids; both workers are stopped afterwards."""
    job = registry.get(code)
    frozen = Worker(tmp_path, env, pool="prefork", concurrency=1).start()
    other: Worker | None = None
    try:
        first = tasks.send_run(job, FIRST, Trigger.ENQUEUE)
        wait_for(lambda: CronExecution.objects.get(id=first.execution_id).status == Status.RUNNING,
                 what="the first slot to start")
        frozen.signal(signal.SIGSTOP)
        wait_for(lambda: _lease_expired(first.execution_id), what="the frozen run's lease to run out")
        other = Worker(tmp_path, env, pool="prefork", concurrency=1).start()
        second = tasks.send_run(job, SECOND, Trigger.ENQUEUE)
        wait_for(lambda: CronExecution.objects.get(id=second.execution_id).status == Status.SUCCEEDED,
                 what="the next slot to run while the first one's worker is frozen")
        assert first.execution_id is not None and second.execution_id is not None
        yield frozen, first.execution_id, second.execution_id
    finally:
        frozen.stop()
        if other is not None:
            other.stop()


def test_a_run_frozen_past_its_lease_is_fenced_once_the_next_run_of_its_exclusive_job_started(
        tmp_path, marker, lock_redis):
    env = {"CRON_TEST_MARKER": str(marker), "CRON_TEST_LOCK_MASTERS": lock_redis.url, "CRON_TEST_LOCK_TTL": "3",
           "CRON_TEST_LEASE_SECONDS": "3", "CRON_TEST_SLEEP": "6", "CRON_TEST_LOG_LEVEL": "INFO"}
    with superseded(tmp_path, env, "W001") as (frozen, first_id, second_id):  # overlap "skip", no retries
        frozen.signal(signal.SIGCONT)  # wakes up, finishes its body and tries to record it
        wait_for(lambda: len([line for line in marked(marker) if FIRST.isoformat() in line]) == 1,
                 what="the frozen body to end")
        wait_for(lambda: CronJob.objects.get(code="W001").fenced_count == 1, what="the late outcome to be fenced")
    row = CronExecution.objects.get(id=first_id)
    assert row.status == Status.RUNNING, "the frozen run's outcome was recorded beside the next run's"
    report = reconciler.run_pass()  # ends it as a run whose worker stopped renewing its lease
    row.refresh_from_db()
    assert (row.status, row.error_code) == (Status.LOST, "LEASE_EXPIRED"), report
    assert CronExecution.objects.get(id=second_id).status == Status.SUCCEEDED
    statuses = list(CronExecution.objects.filter(task_code="W001").values_list("status", flat=True))
    assert statuses.count(Status.SUCCEEDED) == 1, statuses


def test_a_superseded_run_killed_by_its_hard_time_limit_is_not_recorded_beside_the_next_run(
        tmp_path, marker, lock_redis):
    """The soak's OVERLAP_ROWS: the frozen run's worker wakes up past its hard time limit and its
    parent kills the child. That death is the superseded run's: the parent records nothing (it is
    fenced as the run's own outcome is), and the reconciler ends the run ``LEASE_EXPIRED`` as above.
    Before: ``TIMED_OUT``, ended seconds after the next run had started."""
    env = {"CRON_TEST_MARKER": str(marker), "CRON_TEST_LOCK_MASTERS": lock_redis.url, "CRON_TEST_LOCK_TTL": "3",
           "CRON_TEST_LEASE_SECONDS": "3", "CRON_TEST_LOG_LEVEL": "INFO"}
    # W011: hourly, overlap "skip", a hard time limit of 8 s; 01:00 sleeps 30 s
    with superseded(tmp_path, env, "W011") as (frozen, first_id, second_id):
        started = CronExecution.objects.get(id=first_id).started
        # Past its 8 s: the worker's parent kills the body as soon as it runs again.
        wait_for(lambda: dt.datetime.now(dt.UTC) - started > dt.timedelta(seconds=9), what="the hard limit to pass")
        frozen.signal(signal.SIGCONT)
        # Celery logs the kill once the request's on_timeout (the attempt to record it) has returned.
        wait_for(lambda: "Hard time limit (8s) exceeded" in frozen.output()
                 or "Hard time limit (8.0s) exceeded" in frozen.output(),
                 what="the worker's parent to kill the body and try to record it")
    row = CronExecution.objects.get(id=first_id)
    second_row = CronExecution.objects.get(id=second_id)
    assert row.status == Status.RUNNING, (
        f"the superseded run was recorded {row.status} {row.error_code} (ended {row.ended:%H:%M:%S.%f}) beside "
        f"the next run (started {second_row.started:%H:%M:%S.%f})")
    assert not [line for line in marked(marker) if FIRST.isoformat() in line], "the killed body ended"
    report = reconciler.run_pass()
    row.refresh_from_db()
    assert (row.status, row.error_code) == (Status.LOST, "LEASE_EXPIRED"), report
    statuses = list(CronExecution.objects.filter(task_code="W011").values_list("status", flat=True))
    assert sorted(statuses) == [Status.LOST, Status.SUCCEEDED], statuses
