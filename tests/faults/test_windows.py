"""Active windows, django-celery-beat's one_off, and one-off runs, with two real beats that
both dispatch (a stale leader) and a real worker: each slot inside a window once and none
outside it (not even MISSED), a one_off periodic task sent once and then disabled, and a
one-off run sent once at its time while a cancelled one is never sent."""

from __future__ import annotations

import datetime as dt
import math
import time
from collections import Counter

import pytest
from django_celery_beat.models import PeriodicTask

from cron_celery.declaring import registry
from cron_celery.models import CronExecution, CronJob, SkipReason, Status, Trigger
from cron_celery.run import outcomes, tasks
from tests.conftest import marked, wait_for
from tests.faults.test_beat import cluster, start_beat, stop

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_two_beats_keep_to_a_window_send_a_one_off_task_once_and_a_one_off_run_once(tmp_path, marker):
    start = math.ceil(time.time())
    # Six one-second slots, 20 .. 25: the window is fixed as the processes start, and a worker and two
    # beats may take more than ten seconds to start on a loaded machine (CI's did once: the window's
    # first slot passed before any beat had synced the job).
    opens, closes = start + 20, start + 26
    moment = dt.datetime.fromtimestamp
    with cluster(tmp_path, marker, workers=1, CRON_TEST_WINDOW=f"{opens},{closes}",
                 CRON_CELERY_BEAT_ALWAYS_LEAD="1") as env:
        beats = [start_beat(tmp_path, env, i) for i in range(2)]
        try:
            # One-off runs of a job with no schedule: one to run at start + 12, one cancelled at once.
            job = registry.get("fast-always")
            kept = tasks.schedule_one_off(job, moment(start + 12, dt.UTC))
            dropped = tasks.schedule_one_off(job, moment(start + 13, dt.UTC))
            assert [item.execution_id for item in outcomes.cancelled([dropped.execution_id], "the test")] == [
                dropped.execution_id]
            # django-celery-beat's one_off, set in the admin's way on a job the beats synced.
            wait_for(lambda: PeriodicTask.objects.filter(name="once-only (W02)").exists(), timeout=60,
                     what="the beats to sync the once-only job")
            task = PeriodicTask.objects.get(name="once-only (W02)")
            task.one_off = True
            task.save()
            late = time.time() - opens
            assert late < 0, f"the beats synced {late:.1f} s after the window opened: the margin is too short"
            time.sleep(max(0.0, closes + 4 - time.time()))
        finally:
            for proc in beats:
                stop(proc)
    bodies = Counter(line.split()[0] for line in marked(marker))

    windowed = list(CronExecution.objects.filter(task_name="windowed").order_by("slot"))
    assert [row.slot for row in windowed] == [moment(opens + i, dt.UTC) for i in range(6)], windowed
    assert {row.status for row in windowed} == {Status.SUCCEEDED} and bodies["windowed"] == 6
    row = CronJob.objects.get(name="windowed")
    assert row.next_run_at >= moment(closes, dt.UTC) and row.due_at is None  # due no more
    assert (row.active_from, row.active_until) == (moment(opens, dt.UTC), moment(closes, dt.UTC))

    once = list(CronExecution.objects.filter(task_name="once-only").order_by("slot"))
    # Its next slot (two seconds apart; one more if a round was under way as the edit landed), then none.
    after = [e for e in once if e.created_at >= task.date_changed]
    assert 1 <= len(after) <= 2 and {e.status for e in once} == {Status.SUCCEEDED}, once
    assert max(e.created_at for e in after) < task.date_changed + dt.timedelta(seconds=3.5), once
    assert not PeriodicTask.objects.get(id=task.id).enabled
    assert CronJob.objects.get(name="once-only").paused
    assert bodies["once-only"] == len(once)

    ran = CronExecution.objects.get(id=kept.execution_id)
    assert (ran.trigger, ran.status, ran.slot, ran.due_at) == (
        Trigger.ONE_OFF, Status.SUCCEEDED, moment(start + 12, dt.UTC), moment(start + 12, dt.UTC))
    assert ran.started >= ran.due_at and ran.celery_task_id
    assert CronExecution.objects.filter(task_name="fast-always").count() == 2
    cancelled = CronExecution.objects.get(id=dropped.execution_id)
    assert (cancelled.status, cancelled.skip_reason, cancelled.started, cancelled.celery_task_id) == (
        Status.SKIPPED, SkipReason.CANCELLED, None, "")
    assert bodies["fast-always"] == 1
