"""A revoked run (``celery control revoke``, Flower) is recorded at once, REVOKED, and never run
again: real prefork workers on a Redis broker of the test's own, revoked through Celery's
own remote control."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from cron_celery import reconciler
from cron_celery.decisions import dispatch
from cron_celery.decisions import jobs as job_rows
from cron_celery.models import Alert, CronExecution, CronJob, Status, Trigger
from cron_celery.run import tasks
from tests.celery_app import app
from tests.conftest import ROOT, marked, subprocess_env, wait_for
from tests.faults import test_retries
from tests.faults.test_retries import QUEUE, SLOT
from tests.jobsapp import jobs_results as jobs
from tests.redis_servers import RedisServer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
broker, started = test_retries.broker, test_retries.started  # the fixtures

#: A short lease, so that a pass of the reconciler after it would see an unrecorded run.
LEASE = {"CRON_TEST_LEASE_SECONDS": "3", "CRON_TEST_LOCK_TTL": "1.5"}


def send(task: Any, broker: RedisServer, *, countdown: float | None = None) -> tuple[int, str]:
    """A PENDING execution and its message, with a Celery task id known up front."""
    job = task.job
    execution_id, _ = dispatch.enqueue(job=job, job_id=job_rows.job_id(job), slot=SLOT, execution_date=SLOT.date(),
                                     trigger=Trigger.ENQUEUE)
    task_id = str(uuid.uuid4())
    dispatch.set_celery_task_id(execution_id, task_id)
    with app.connection_for_write(broker.url) as conn:
        app.send_task(job.task_name, task_id=task_id, countdown=countdown, connection=conn,
                      headers=tasks.headers(execution_id, SLOT, Trigger.ENQUEUE))
    return execution_id, task_id


def control(broker: RedisServer, *command: str) -> None:
    """``celery control ...`` from the shell, against the test's broker."""
    done = subprocess.run([sys.executable, "-m", "celery", "-A", "tests.celery_app", "control", *command],
                          cwd=ROOT, env=subprocess_env(REDIS_URL=broker.url), capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0 and "OK" in done.stdout, (done.stdout, done.stderr)


def runs_of(marker: Path) -> int:
    return sum(1 for line in marked(marker) if line.startswith("runaway "))


def snapshot(execution_id: int) -> tuple[Any, ...]:
    row = CronExecution.objects.get(id=execution_id)
    return (row.status, row.error_code, row.message, row.retry_count, row.ended, row.fence, row.republished,
            row.attempts)


def ended(execution_id: int, timeout: float = 30) -> CronExecution:
    try:
        wait_for(lambda: CronExecution.objects.get(id=execution_id).completed, timeout=timeout,
                 what=f"execution {execution_id} to end")
    except AssertionError:
        row = CronExecution.objects.get(id=execution_id)
        raise AssertionError(f"execution {execution_id} is still {row.status} ({row.error_code}: {row.message})"
                             f" after {timeout} s") from None
    return CronExecution.objects.get(id=execution_id)


def nothing_changes_after_the_lease(execution_id: int, broker: RedisServer, marker: Path) -> None:
    """A pass of the reconciler after the lease ran out changes nothing; no message is left."""
    before = snapshot(execution_id)
    time.sleep(float(LEASE["CRON_TEST_LEASE_SECONDS"]) + 1)  # let a lease that was never ended run out
    report = reconciler.run_pass()
    assert (report.lost, report.retried, report.resent, report.abandoned) == (0, 0, 0, 0), str(report)
    assert snapshot(execution_id) == before
    client = broker.client()
    assert client.llen(QUEUE) == 0 and client.hlen("unacked") == 0, "a message of the revoked run is left"
    assert client.zcard("unacked_index") == 0
    assert runs_of(marker) == 1, "the revoked body ran again"


@pytest.mark.parametrize("signal", ["SIGTERM", "SIGKILL"])
def test_a_run_revoked_with_terminate_is_recorded_revoked_at_once_and_not_run_again(started, broker, marker,
                                                                                    signal):
    worker = started(**LEASE)
    execution_id, task_id = send(jobs.results_runaway, broker)
    wait_for(lambda: runs_of(marker) == 1, what="the body to start")
    child = CronExecution.objects.get(id=execution_id).pid
    control(broker, "terminate", signal, task_id)
    row = ended(execution_id, timeout=15)
    assert (row.status, row.error_code) == (Status.REVOKED, "REVOKED"), (row.status, row.error_code, row.message)
    assert signal in row.message and row.success is False and row.retry_count == 0
    assert row.lease_until is None and row.ended is not None
    wait_for(lambda: not _alive(child), timeout=15, what="the revoked child to exit")
    nothing_changes_after_the_lease(execution_id, broker, marker)
    job = CronJob.objects.get(code="R020")
    assert job.last_status == Status.REVOKED and job.consecutive_failures == 0 and job.fenced_count == 0
    assert not Alert.objects.filter(execution_id=execution_id).exists()
    assert "Discarding" not in worker.output()


def test_a_pending_execution_whose_task_is_revoked_ends_revoked_and_never_runs(started, broker, marker,
                                                                               admin_client):
    worker = started(**LEASE)
    execution_id, task_id = send(jobs.results_runaway, broker, countdown=10)  # still waiting when the revoke comes
    wait_for(lambda: task_id in worker.output(), what="the worker to receive the waiting message")
    assert CronExecution.objects.get(id=execution_id).status == Status.PENDING
    control(broker, "revoke", task_id)
    row = ended(execution_id, timeout=30)
    assert (row.status, row.error_code) == (Status.REVOKED, "REVOKED"), (row.status, row.error_code, row.message)
    assert row.started is None and row.success is False
    before = snapshot(execution_id)
    report = reconciler.run_pass()
    assert (report.resent, report.missed, report.abandoned) == (0, 0, 0), str(report)
    assert snapshot(execution_id) == before
    assert runs_of(marker) == 0
    client = broker.client()
    wait_for(lambda: client.llen(QUEUE) == 0 and client.hlen("unacked") == 0, timeout=15,
             what="the discarded message to be acknowledged")
    # The admin's history lists it under its own status filter, with its badge.
    page = admin_client.get("/admin/cron_celery/cronexecution/", {"status__exact": "REVOKED"}).content.decode()
    assert f"/admin/cron_celery/cronexecution/{execution_id}/change/" in page and ">revoked</span>" in page
    assert "?status__exact=REVOKED" in admin_client.get("/admin/cron_celery/cronexecution/").content.decode()


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # The state follows the command name, which is in parentheses and may hold spaces (a process title).
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"

