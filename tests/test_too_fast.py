"""TOO_FAST alerts grouped into incidents like failures (issue 35, item 13), on real PostgreSQL through
the run path a worker takes (``runs.execute``, each run its own transactions): an every-minute job
whose body returns at once alerts at its ``alert_after``-th too-fast success in a row, then only every
``alert_repeat`` seconds, and the first success that took long enough again sends one
``TOO_FAST_RECOVERED``. And a dead worker's row whose lease ran out is not alerted LONG_RUNNING
before the reconciler ends it."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from cron_celery import reconciler
from cron_celery.alerts import delivery
from cron_celery.decisions import dispatch, timing
from cron_celery.decisions import jobs as job_rows
from cron_celery.declaring import registry
from cron_celery.models import Alert, AlertStatus, CronExecution, CronJob, Status, Trigger
from cron_celery.run import runs
from cron_celery.schedules import every
from cron_celery.web import dashboard
from tests.conftest import db_now, expire_lease
from tests.servers import HttpServer

pytestmark = pytest.mark.django_db(transaction=True)

SLOT = dt.datetime(2031, 5, 1, 0, 0, tzinfo=dt.UTC)


def with_webhook(url: str = "http://127.0.0.1:9/hook") -> override_settings:
    """Failure and recovery alerts to one webhook."""
    return override_settings(CRON_CELERY={**settings.CRON_CELERY, "NOTIFICATIONS": {
        "on_failure": ["webhook"], "on_recovery": ["webhook"], "webhook": {"url": url}}})


class Minutes:
    """The job's runs, one slot a minute, each through the worker's run path."""

    def __init__(self, job: registry.Job) -> None:
        self.job, self.minute, self.ids = job, 0, []

    def run(self, seconds: float = 0.0) -> int:
        slot = SLOT + dt.timedelta(minutes=self.minute)
        self.minute += 1
        outcome = runs.execute(self.job, slot, lambda run: time.sleep(seconds) or "done", trigger=Trigger.BEAT)
        assert outcome.status == Status.SUCCEEDED and outcome.execution_id is not None
        self.ids.append(outcome.execution_id)
        return outcome.execution_id


def alerted(job: registry.Job) -> list[tuple[int, str]]:
    """(execution id, event) of the job's timing alert rows, in the order of its runs."""
    return list(Alert.objects.filter(job__code=job.code, event__in=["TOO_FAST", "TOO_FAST_RECOVERED"])
                .order_by("execution_id", "event").values_list("execution_id", "event"))


def test_too_fast_successes_alert_once_per_incident_and_a_normal_run_recovers_once(declare):
    job = declare("fast-minute", "TF1", schedule=every(minutes=1), min_runtime=0.3, alert_after=3)
    job_rows.ensure_job(job)
    minutes = Minutes(job)
    with with_webhook():
        fast = [minutes.run() for _ in range(6)]
        normal = minutes.run(0.4)
        again_normal = minutes.run(0.4)
        second = [minutes.run() for _ in range(4)]
    # One alert per incident, at the alert_after-th too-fast success in a row; one recovery.
    assert alerted(job) == [(fast[2], "TOO_FAST"), (normal, "TOO_FAST_RECOVERED"), (second[2], "TOO_FAST")]
    assert again_normal not in [execution for execution, _ in alerted(job)]


def test_alert_repeat_reminds_of_an_open_too_fast_incident_and_a_failure_does_not_end_it(declare):
    job = declare("fast-repeat", "TF2", schedule=every(minutes=1), min_runtime=0.3, alert_repeat=1,
                  pattern="always")
    job_rows.ensure_job(job)
    minutes = Minutes(job)
    with with_webhook():
        first = minutes.run()
        quiet = minutes.run()
        time.sleep(1.2)  # alert_repeat (1 s, on the database's clock) has passed since the alert
        reminded = minutes.run()
        failed = runs.execute(job, SLOT + dt.timedelta(hours=1), lambda run: {"error": True}, trigger=Trigger.BEAT)
        still = minutes.run()
        recovered = minutes.run(0.4)
    assert failed.status == Status.FAILED
    assert alerted(job) == [(first, "TOO_FAST"), (reminded, "TOO_FAST"), (recovered, "TOO_FAST_RECOVERED")]
    assert quiet not in dict(alerted(job)) and still not in dict(alerted(job))


def test_the_recovery_reaches_a_real_webhook_saying_the_runs_take_long_enough_again(declare):
    hook = HttpServer().start()
    try:
        job = declare("fast-said", "TF3", schedule=every(minutes=1), min_runtime=0.3)
        job_rows.ensure_job(job)
        minutes = Minutes(job)
        with with_webhook(hook.url):
            minutes.run()
            minutes.run(0.4)
            for alert in Alert.objects.filter(job__code="TF3"):
                assert delivery.deliver(alert.id) == AlertStatus.SENT
        bodies: dict[str, Any] = {body["event"]: body for body in (request.json() for request in hook.received())}
    finally:
        hook.stop()
    assert set(bodies) == {"TOO_FAST", "TOO_FAST_RECOVERED"}
    said = bodies["TOO_FAST_RECOVERED"]
    assert (said["execution_id"], said["status"]) == (minutes.ids[1], "SUCCEEDED")
    assert said["error"].startswith("Took at least its min_runtime of 0.3 s again (its body took 0.")


def test_a_running_row_whose_lease_ran_out_is_not_alerted_long_running(declare):
    """Its worker died: the reconciler ends it (LOST), nobody is told it runs long."""
    job = declare("dead-long", "TF4", schedule=every(minutes=1), max_runtime=60)
    job_id = job_rows.ensure_job(job)
    execution_id, _ = dispatch.enqueue(job=job, job_id=job_id, slot=SLOT, execution_date=SLOT.date(),
                                       trigger=Trigger.BEAT)
    CronExecution.objects.filter(id=execution_id).update(
        status=Status.RUNNING, started=db_now() - dt.timedelta(seconds=600), worker="gone@host", pid=4242,
        fence=1, lease_until=db_now() + dt.timedelta(seconds=60))
    expire_lease(execution_id)
    assert timing.mark_long_running(100) == []
    assert not CronExecution.objects.get(id=execution_id).long_alerted
    assert dashboard.with_figures(CronJob.objects.filter(code="TF4")).get().timing == [None, None]  # no badge
    with with_webhook():
        reconciler.run_pass()
    row = CronExecution.objects.get(id=execution_id)
    assert not Alert.objects.filter(execution_id=execution_id, event="LONG_RUNNING").exists()
    assert row.status != Status.RUNNING and not row.long_alerted
