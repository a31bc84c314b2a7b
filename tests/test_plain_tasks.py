"""The leading beat's write before it sends a plain periodic task: compared and set, so that a beat
holding an older copy of the task sends nothing (see cron_celery/beat/plain_tasks.py). Real
schedulers over the test database, not started: each reads the periodic tasks and reserves entries
the way its tick does before a send."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.utils import timezone
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from cron_celery.beat import Scheduler, plain_tasks
from tests.celery_app import app

pytestmark = pytest.mark.django_db(transaction=True)  # a beat reading again closes old connections


@pytest.fixture
def overdue() -> PeriodicTask:
    every_hour, _ = IntervalSchedule.objects.get_or_create(every=3600, period=IntervalSchedule.SECONDS)
    return PeriodicTask.objects.create(name="plain", task="tests.jobsapp.tasks.plain_ping", interval=every_hour,
                                       last_run_at=timezone.now() - dt.timedelta(hours=2))


def a_beat() -> Any:
    """A scheduler that has read django-celery-beat's entries, as a beat that takes the lead does."""
    beat = Scheduler(app=app, lazy=True)
    plain_tasks.read_again(beat)
    return beat


def test_a_copy_read_before_another_beats_send_writes_nothing_and_is_refused(overdue):
    leader, stale = a_beat(), a_beat()
    sent = leader.reserve(leader._schedule["plain"])
    with pytest.raises(plain_tasks.SentElsewhere, match="'plain' was sent by another beat"):
        stale.reserve(stale._schedule["plain"])
    row = PeriodicTask.objects.get(name="plain")
    assert (row.last_run_at, row.total_run_count) == (sent.last_run_at, 1)  # the leader's write stands
    assert leader.reserve(sent).total_run_count == 2  # the next send of the copy that is current
    assert PeriodicTask.objects.get(name="plain").total_run_count == 2


def test_the_entry_a_send_replaced_is_refused_though_its_model_moved_on(overdue):
    """django-celery-beat's entries share their model object and the send advances it; the entry the
    beat held keeps its old last run. A heap rebuilt from the held entries (django-celery-beat does so
    on the tick after a schedule change) found it due again and its count passed: the primer of
    tests/faults/test_beat.py's killed-leader test was sent twice (failed on d24794a)."""
    beat = a_beat()
    held = beat._schedule["plain"]
    sent = beat.reserve(held)
    assert held.model is sent.model and held.is_due().is_due  # what the rebuilt heap would send
    assert beat._schedule["plain"] is sent and not sent.is_due().is_due  # the entries held are the new one
    with pytest.raises(plain_tasks.SentElsewhere):
        beat.reserve(held)
    assert PeriodicTask.objects.get(name="plain").total_run_count == 1
