"""Defects the nemesis soak (``scripts/soak``, ``tests/soak``) found, each reproduced on real
processes against the real PostgreSQL."""

from __future__ import annotations

import datetime as dt
import time

import pytest

from cron_celery.models import Alert, CronExecution, CronJob, Status
from tests.conftest import Queue, db_now, manage, subprocess_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def reconcile_pass() -> None:
    """One reconciler pass in a real ``manage.py reconcile_cron`` process: slots more than a second
    overdue are late, and failures alert a webhook (whose delivery task only goes to the queue)."""
    result = manage("reconcile_cron", env=subprocess_env(CRON_TEST_MISSED_GRACE="1",
                                                         CRON_TEST_WEBHOOK_URL="http://127.0.0.1:9/hook"))
    assert result.returncode == 0, result.stdout + result.stderr


def missed_alerts(job: CronJob) -> list[int]:
    return list(Alert.objects.filter(job=job, event="MISSED").order_by("id").values_list("execution_id", flat=True))


def test_a_beat_outage_alerts_missed_once_however_many_reconciler_passes_record_its_slots(queue: Queue) -> None:
    """While no beat runs, every reconciler pass records the slots that became overdue since the
    last one MISSED; the outage alerts once (docs/notifications.md: one alert per job and outage),
    not once per pass. Once the job has run again, the next outage alerts again.
    (Before: the soak saw a one-second job alert MISSED at every pass of a one-second reconciler.)"""
    job = CronJob.objects.create(name="outage", code="OUTAGE1", task="tests.soak.nothing", pattern="standard",
                                 overlap="skip", catch_up="none", schedule="every 1s",
                                 next_run_at=db_now().replace(microsecond=0) - dt.timedelta(seconds=5))
    reconcile_pass()
    first = CronExecution.objects.filter(job=job, status=Status.MISSED).count()
    assert first >= 3
    assert len(missed_alerts(job)) == 1
    time.sleep(2.5)  # two more slots become overdue
    reconcile_pass()
    assert CronExecution.objects.filter(job=job, status=Status.MISSED).count() > first
    assert len(missed_alerts(job)) == 1, "a second MISSED alert for the same outage"

    # The job ran (a slot after the missed ones started): that outage is over.
    ran = CronExecution.objects.filter(job=job).order_by("-slot").values_list("slot", flat=True)[0]
    CronExecution.objects.create(job=job, task_code=job.code, task_name=job.name, slot=ran + dt.timedelta(seconds=1),
                                 execution_date=ran.date(), run_number=1, status=Status.SUCCEEDED, trigger="BEAT",
                                 started=db_now(), ended=db_now(), completed=True, success=True)
    CronJob.objects.filter(id=job.id).update(last_run_at=db_now(), next_run_at=ran + dt.timedelta(seconds=2))
    time.sleep(2.5)
    reconcile_pass()
    alerted = missed_alerts(job)
    assert len(alerted) == 2, "a new outage after a run alerts again"
    newest = CronExecution.objects.filter(job=job, status=Status.MISSED).order_by("-slot").first()
    assert newest is not None and alerted[-1] == newest.id
