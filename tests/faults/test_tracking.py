"""Tracked periodic tasks on a real beat and a real prefork worker: plain Celery tasks, unchanged,
each slot recorded and its body run once, failures and retries (the task's own ``self.retry()`` and
``autoretry_for``) recorded as attempts of the slot's execution; a periodic task left out runs
untracked, as before."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections import Counter

import ephem
import pytest
from django.utils import timezone
from django_celery_beat.models import IntervalSchedule, PeriodicTask, SolarSchedule

from cron_celery.models import CronExecution, CronJob, Status, Trigger
from cron_celery.run import tasks
from tests.celery_app import app
from tests.conftest import marked, wait_for
from tests.faults.test_beat import cluster, start_beat, stop
from tests.jobsapp.tasks import plain_mark
from tests.servers import HttpServer, envelope_items

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
TASKS = "tests.jobsapp.tasks"


def every(seconds: int) -> IntervalSchedule:
    return IntervalSchedule.objects.get_or_create(every=seconds, period=IntervalSchedule.SECONDS)[0]


def test_tracked_plain_tasks_run_once_per_slot_with_failures_and_their_own_retries_recorded(tmp_path, marker):
    made = {
        "tracked mark": dict(task=f"{TASKS}.plain_mark", args='["tracked"]', interval=every(2)),
        "tracked fail": dict(task=f"{TASKS}.plain_fail", args='["boom"]', interval=every(3)),
        "tracked retry": dict(task=f"{TASKS}.plain_retry", args='["again"]', kwargs='{"fail_times": 2}',
                              interval=every(6)),
        "tracked autoretry": dict(task=f"{TASKS}.plain_autoretry", args='["auto"]', interval=every(6)),
        "tracked slow": dict(task=f"{TASKS}.plain_sleep", args='["slow", 5]', interval=every(6)),
        "left alone": dict(task=f"{TASKS}.plain_mark", args='["untracked"]', interval=every(2)),
    }
    for name, fields in made.items():
        PeriodicTask.objects.create(name=name, **fields)
    chosen = [name for name in made if name != "left alone"] + ["made later"]
    with cluster(tmp_path, marker, CRON_CELERY_BEAT_ALWAYS_LEAD="1", CRON_TEST_TRACK=json.dumps(chosen)) as env:
        beat = start_beat(tmp_path, env, 0)
        try:
            wait_for(CronExecution.objects.exists, timeout=90, what="the beat's first dispatch")
            # Made in the admin while the beat runs: tracked from its next slot, with no restart.
            PeriodicTask.objects.create(name="made later", task=f"{TASKS}.plain_mark", args='["later"]',
                                        interval=every(2))
            wait_for(lambda: CronExecution.objects.filter(task_name="made-later", status=Status.SUCCEEDED).count() >= 2,
                     timeout=90, what="two slots of a periodic task made while the beat runs")
            wait_for(lambda: CronExecution.objects.filter(task_name="tracked-retry", status=Status.SUCCEEDED).exists()
                     and CronExecution.objects.filter(task_name="tracked-autoretry", completed=True).exists()
                     and CronExecution.objects.filter(task_name="tracked-slow", completed=True).exists(),
                     timeout=120, what="a tracked retrying slot to succeed and an autoretry one to fail")
            # The beat runs on until the periodic task left out has run three times too (the tracked
            # waits above can end sooner than three of its 2 s intervals).
            wait_for(lambda: sum(line.startswith("plain-mark untracked ") for line in marked(marker)) >= 3,
                     timeout=60, what="three runs of the periodic task left out")
        finally:
            stop(beat)
        # The application's own call of the same task: untracked, as before. A finished slot's message
        # delivered again (a redelivery, a second send): the claim refuses it, the body does not run.
        plain_mark.delay("direct")
        again = CronExecution.objects.filter(task_name="tracked-mark", status=Status.SUCCEEDED).order_by("slot")[0]
        tasks.send(app, CronJob.objects.get(name="tracked-mark").task, execution_id=again.id, slot=again.slot,
                   trigger=again.trigger, celery_task_id=again.celery_task_id)
        wait_for(lambda: any(line.startswith("plain-mark direct ") for line in marked(marker)), timeout=60,
                 what="the direct call's body")
        wait_for(lambda: f"plain_mark[{again.celery_task_id}] ignored" in "".join(
            path.read_text(errors="replace") for path in tmp_path.glob("fault-*.log")), timeout=60,
                 what="the worker to refuse the second delivery")
    jobs = {job.name: job for job in CronJob.objects.filter(task__startswith="cron_celery.tracked:")}
    assert set(jobs) == {"tracked-mark", "tracked-fail", "tracked-retry", "tracked-autoretry", "tracked-slow",
                         "made-later"}
    lines = marked(marker)

    def rows(name: str) -> list[CronExecution]:
        return list(CronExecution.objects.filter(task_name=name).order_by("slot"))

    mark_rows = rows("tracked-mark")
    assert len(mark_rows) >= 3 and {row.status for row in mark_rows} == {Status.SUCCEEDED}
    assert len({row.slot for row in mark_rows}) == len(mark_rows)  # a row per slot
    assert all(
        row.params == {"args": ["tracked"], "kwargs": {}} for row in mark_rows)
    assert {row.trigger for row in mark_rows} == {Trigger.BEAT}
    bodies = Counter(line.split()[1] for line in lines if line.startswith("plain-mark "))
    assert bodies["tracked"] == len(mark_rows), (bodies, len(mark_rows))  # each slot's body once, no more
    assert bodies["untracked"] >= 3  # the periodic task left out runs as before, with no row
    assert not CronExecution.objects.filter(task_name="left-alone").exists()
    later = rows("made-later")
    assert bodies["later"] == len(later) == len({row.slot for row in later}) >= 2  # tracked at once, never also plain
    assert bodies["direct"] == 1 and CronExecution.objects.filter(task_name="tracked-mark").count() == len(mark_rows)

    fail_rows = rows("tracked-fail")
    assert fail_rows and {row.status for row in fail_rows} == {Status.FAILED}
    assert all(row.error_code == "ValueError" and "boom went wrong" in row.traceback for row in fail_rows)
    assert sum(1 for line in lines if line.startswith("plain-fail ")) == len(fail_rows)

    done = [row for row in rows("tracked-retry") if row.completed]
    assert done and {row.status for row in done} == {Status.SUCCEEDED}
    assert all(row.retry_count == 2 and len(row.attempts) == 3 for row in done), [
        (row.retry_count, row.attempts) for row in done]
    assert all(row.message == "again done after 2 retries" for row in done)
    attempts = Counter(line.split()[2] for line in lines if line.startswith("plain-retry "))
    assert attempts["0"] >= len(done) and attempts["2"] >= len(done)

    auto = [row for row in rows("tracked-autoretry") if row.completed]
    assert auto and {row.status for row in auto} == {Status.FAILED}
    assert all(row.retry_count == 1 and row.error_code == "KeyError" for row in auto), [
        (row.retry_count, row.error_code, row.message) for row in auto]

    # Its hard time limit (1 s) kills the process: the worker's parent records it at once, final.
    slow = [row for row in rows("tracked-slow") if row.completed]
    assert slow and {(row.status, row.error_code) for row in slow} == {(Status.TIMED_OUT, "TIME_LIMIT")}, [
        (row.status, row.error_code, row.message) for row in slow]



def noon_longitude(at: dt.datetime) -> float:
    """The longitude on the equator whose solar noon (the sun's transit, as Celery's solar schedule reads
    it with ephem) falls at ``at``."""
    def transit(longitude: float) -> dt.datetime:
        observer = ephem.Observer()
        observer.lat, observer.lon = "0", str(longitude)
        observer.date = (at - dt.timedelta(hours=1)).replace(tzinfo=None)
        found: dt.datetime = observer.next_transit(ephem.Sun()).datetime()
        return found.replace(tzinfo=dt.UTC)

    hours = at.hour + at.minute / 60 + at.second / 3600
    longitude = (12 - hours) * 15
    for _ in range(6):
        longitude = (longitude + (transit(longitude) - at).total_seconds() * 15 / 3600 + 180) % 360 - 180
    assert abs((transit(longitude) - at).total_seconds()) < 1
    return round(longitude, 6)


def test_a_tracked_solar_periodic_task_is_recorded_as_it_fires(tmp_path, marker):
    """A solar schedule's slots cannot be computed ahead: django-celery-beat's scheduler says when it is
    due, and the beat sends it as a run of its tracked job (``tracking.fires``). A solar noon 40 s away,
    found on the equator: one execution, recorded and run once, its slot the second it fired."""
    noon = timezone.now().replace(microsecond=0) + dt.timedelta(seconds=40)
    sun = SolarSchedule.objects.create(event="solar_noon", latitude=0, longitude=noon_longitude(noon))
    PeriodicTask.objects.create(name="at noon", task=f"{TASKS}.plain_mark", args='["noon"]', solar=sun)
    with cluster(tmp_path, marker, CRON_CELERY_BEAT_ALWAYS_LEAD="1", CRON_TEST_TRACK='["at noon"]') as env:
        beat = start_beat(tmp_path, env, 0)
        try:
            wait_for(lambda: CronExecution.objects.filter(task_name="at-noon", completed=True).exists(), timeout=120,
                     what="the solar noon's run")
            time.sleep(3)  # a second send would be here by now
        finally:
            stop(beat)
    fired = list(CronExecution.objects.filter(task_name="at-noon"))
    assert [(row.status, row.trigger, row.params) for row in fired] == [
        (Status.SUCCEEDED, Trigger.BEAT, {"args": ["noon"], "kwargs": {}})]
    assert noon - dt.timedelta(seconds=1) <= fired[0].slot <= noon + dt.timedelta(seconds=3), (fired[0].slot, noon)
    assert [line.split()[1] for line in marked(marker) if line.startswith("plain-mark ")] == ["noon"]
    job = CronJob.objects.get(name="at-noon")
    assert (job.schedule, job.next_run_at, job.schedule_problem) == ("", None, "")


def test_sentrys_own_beat_monitors_never_watch_a_tracked_periodic_task(tmp_path, marker):
    """Sentry's ``CeleryIntegration(monitor_beat_tasks=True)`` on in the beat and the worker, and the
    "sentry" channel on for cron_celery: a tracked periodic task has one monitor, cron_celery's (the
    job's name, its check-ins sent by the worker), never also the integration's (the periodic task's
    name, opened by the beat); the periodic task left untracked is still the integration's."""
    sentry = HttpServer().start()
    every_minute = every(60)
    PeriodicTask.objects.create(name="sentry tracked", task=f"{TASKS}.plain_mark", args='["tracked"]',
                                interval=every_minute)
    PeriodicTask.objects.create(name="sentry plain", task=f"{TASKS}.plain_mark", args='["plain"]',
                                interval=every_minute, last_run_at=timezone.now() - dt.timedelta(minutes=2))

    def check_ins() -> list[tuple[str, str]]:
        found = []
        for request in sentry.received("/api/1/envelope/"):
            found += [(payload["monitor_slug"], payload["status"]) for header, payload in envelope_items(request)
                      if header.get("type") == "check_in"]
        return found

    try:
        with cluster(tmp_path, marker, CRON_CELERY_BEAT_ALWAYS_LEAD="1", CRON_TEST_TRACK='["sentry tracked"]',
                     CRON_TEST_SENTRY_DSN=f"http://public@127.0.0.1:{sentry.port}/1") as env:
            beat = start_beat(tmp_path, env, 0)
            try:
                wait_for(lambda: {("sentry-tracked", "ok"), ("sentry plain", "ok")} <= set(check_ins()),
                         timeout=150, what="both periodic tasks' closing check-ins")
            finally:
                stop(beat)
    finally:
        sentry.stop()
    seen = Counter(check_ins())
    # The test app's cron jobs check in too (tick-1s...): only these two periodic tasks' monitors are looked at.
    assert {slug for slug, _ in seen if slug.startswith("sentry")} == {"sentry-tracked", "sentry plain"}, seen
    ran = CronExecution.objects.filter(task_name="sentry-tracked", status=Status.SUCCEEDED).count()
    assert seen[("sentry-tracked", "in_progress")] == seen[("sentry-tracked", "ok")] == ran >= 1, (seen, ran)
    assert not CronExecution.objects.filter(task_name="sentry-plain").exists()
