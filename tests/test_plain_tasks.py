"""The leading beat's write before it sends a plain periodic task: compared and set, so that a beat
holding an older copy of the task sends nothing (see cron_celery/beat/plain_tasks.py)."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from cron_celery.beat import plain_tasks

pytestmark = pytest.mark.django_db


def test_a_copy_read_before_another_beats_send_writes_nothing_and_is_refused():
    every_minute, _ = IntervalSchedule.objects.get_or_create(every=60, period=IntervalSchedule.SECONDS)
    PeriodicTask.objects.create(name="plain", task="tests.jobsapp.tasks.plain_ping", interval=every_minute)
    leader, stale = PeriodicTask.objects.get(name="plain"), PeriodicTask.objects.get(name="plain")
    sent_at = timezone.now()
    leader.last_run_at, leader.total_run_count = sent_at, 1
    plain_tasks.record_reserved(leader, 0)
    stale.last_run_at, stale.total_run_count = sent_at + dt.timedelta(seconds=3), 1
    with pytest.raises(plain_tasks.SentElsewhere, match="'plain' was sent by another beat"):
        plain_tasks.record_reserved(stale, 0)
    row = PeriodicTask.objects.get(name="plain")
    assert (row.last_run_at, row.total_run_count) == (sent_at, 1)  # the leader's write stands
    leader.total_run_count = 2
    plain_tasks.record_reserved(leader, 1)  # the next send of the copy that is current
    assert PeriodicTask.objects.get(name="plain").total_run_count == 2
