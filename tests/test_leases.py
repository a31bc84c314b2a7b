"""The lease thread: long runs keep their lease; a run that is taken over is told to stop."""

from __future__ import annotations

import datetime as dt
import time

import pytest
from django.db import connection
from django.test import override_settings

from cron_celery.decisions import claims
from cron_celery.models import CronExecution, CronJob, Status, Trigger
from cron_celery.run import leases, runs
from tests.conftest import make_job

pytestmark = pytest.mark.django_db(transaction=True)

SLOT = dt.datetime(2026, 11, 29, 1, 0, tzinfo=dt.UTC)


def db_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


@override_settings(CRON_CELERY={"LEASE_SECONDS": 3})
def test_a_run_longer_than_its_lease_keeps_it_and_cannot_be_taken_over():
    job, job_id = make_job()
    observed = {}

    def body(run):
        time.sleep(4.5)  # one and a half leases: only renewals keep it alive
        row = CronExecution.objects.get(id=run.execution_id)
        observed["lease_left"] = (row.lease_until - db_now()).total_seconds()
        observed["takeover"] = claims.begin(
            job=job, job_id=job_id, slot=SLOT, execution_date=SLOT.date(), trigger=Trigger.BEAT,
            execution_id=run.execution_id, lease_seconds=3)
        observed["cancelled"] = run.cancelled.is_set()
        return "long run done"

    outcome = runs.execute(job, SLOT, body, trigger=Trigger.MANUAL)
    assert outcome.status == Status.SUCCEEDED
    assert observed["lease_left"] > 0
    assert observed["takeover"].outcome == claims.DUPLICATE
    assert observed["cancelled"] is False


@override_settings(CRON_CELERY={"LEASE_SECONDS": 3})
def test_a_run_whose_execution_was_taken_over_is_cancelled_and_records_nothing():
    job, job_id = make_job(max_retries=1)
    fenced_before = leases.counters["fenced"]
    observed = {}

    def body(run):
        # Simulate a pause longer than the lease: another worker claims the execution.
        CronExecution.objects.filter(id=run.execution_id).update(
            lease_until=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
        takeover = claims.begin(job=job, job_id=job_id, slot=SLOT, execution_date=SLOT.date(),
                                trigger=Trigger.BEAT, execution_id=run.execution_id, lease_seconds=60)
        observed["new_fence"] = takeover.fence
        observed["cancelled_in_time"] = run.cancelled.wait(timeout=5)
        return "stale"

    outcome = runs.execute(job, SLOT, body, trigger=Trigger.MANUAL)
    assert observed["cancelled_in_time"] is True
    assert outcome.status == runs.FENCED and outcome.execution_id is not None
    row = CronExecution.objects.get(id=outcome.execution_id)
    assert (row.status, row.fence, row.message) == (Status.RUNNING, observed["new_fence"], "")
    assert leases.counters["fenced"] >= fenced_before + 1  # the heartbeat noticed it in this process
    assert CronJob.objects.get(id=job_id).fenced_count == 1  # the outcome that was not written
