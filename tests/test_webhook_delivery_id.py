"""The webhook's delivery id is stable per alert row (issue 35, item 15): a delivery tried again after
the execution changed says something new (a LATE run that has started meanwhile says when), but it is
the same alert, so a receiver that handled the first attempt drops the second. Delivered to a real
local HTTP server; the documented receiver (docs/notifications.md) reads the id from the signed body."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from cron_celery import exceptions, reconciler
from cron_celery.alerts import delivery
from cron_celery.decisions import jobs as job_rows
from cron_celery.models import Alert, AlertStatus, CronExecution, Status, Trigger
from cron_celery.run import runs
from cron_celery.schedules import every
from tests.servers import HttpServer
from tests.test_alert_delivery import documented_receiver
from tests.test_timing import SLOT, pending, with_webhook

pytestmark = pytest.mark.django_db


def test_a_delivery_tried_again_after_the_execution_changed_keeps_its_delivery_id(declare):
    hook = HttpServer().start()
    try:
        job = declare("late-id", "WD1", schedule=every(minutes=1), start_deadline=60)
        job_rows.ensure_job(job)
        late = pending(job, due_ago=90)
        other = pending(job, due_ago=120, slot=SLOT + dt.timedelta(minutes=1))
        hook.answer(503, "busy")  # the first attempt fails: the alert is delivered again later
        with with_webhook(hook.url):
            assert reconciler.run_pass().late == 2
            alert = Alert.objects.get(execution_id=late, event="LATE")
            with pytest.raises(exceptions.DeliveryFailed):
                delivery.deliver(alert.id)
            # Meanwhile a worker takes the late run: the alert's message now says when it started.
            ran = runs.execute(job, SLOT, lambda run: "done", trigger=Trigger.BEAT, execution_id=late)
            assert ran.status == Status.SUCCEEDED
            assert delivery.deliver(alert.id) == AlertStatus.SENT
            assert delivery.deliver(Alert.objects.get(execution_id=other, event="LATE").id) == AlertStatus.SENT
        first, again, neighbour = hook.received()
    finally:
        hook.stop()
    assert first.raw != again.raw  # the body changed: the run started between the two attempts
    assert json.loads(first.raw)["status"] == "PENDING" and json.loads(again.raw)["status"] == Status.SUCCEEDED
    identity = first.headers["x-cron-celery-delivery"]
    assert again.headers["x-cron-celery-delivery"] == identity  # one alert row, one delivery id
    assert json.loads(first.raw)["delivery_id"] == json.loads(again.raw)["delivery_id"] == identity
    assert neighbour.headers["x-cron-celery-delivery"] != identity  # another alert row, another id
    # The documented receiver acts on the first attempt and drops the second.
    verify = documented_receiver()["verify"]
    seen: set[str] = set()
    assert verify("timing", first.headers, first.raw, seen) is not None
    assert verify("timing", again.headers, again.raw, seen) is None
    assert CronExecution.objects.get(id=late).status == Status.SUCCEEDED
