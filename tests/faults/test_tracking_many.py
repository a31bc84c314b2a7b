"""Thirty periodic tasks of a team adopting cron_celery, tracked with one setting, on two real beats and
two real workers, the leading beat SIGKILLed half way: every schedule type django-celery-beat has
(intervals, crontabs in three timezones, clocked one-offs, a solar event), ``start_time``, ``expires``,
``enabled``, routing options and headers, ``beat_schedule`` entries, tasks of an app of someone else's
(a custom base class, ``bind=True``, a class-based task, ``async_to_sync``), tasks that fail, retry
themselves or autoretry, one left out in the admin, and the webhook told of every failure."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
from collections import Counter
from typing import Any

import pytest
from django.utils import timezone
from django_celery_beat.models import ClockedSchedule, CrontabSchedule, IntervalSchedule, PeriodicTask, SolarSchedule

from cron_celery.models import Alert, AlertStatus, CronExecution, CronJob, Status, TrackedPeriodicTask
from tests.conftest import marked, wait_for
from tests.faults.test_beat import run_two_beats
from tests.faults.test_tracking import noon_longitude
from tests.servers import HttpServer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
MINE, OTHER = "tests.jobsapp.tasks", "tests.otherapp.tasks"
RAN = (Status.SUCCEEDED, Status.FAILED)
#: The beat_schedule entries (app.conf.beat_schedule): name: [task, seconds, args].
BEAT_SCHEDULE = {"bs mark": [f"{MINE}.plain_mark", 3, ["bs-mark"]],
                 "bs audited": [f"{OTHER}.audited", 5, ["bs-audited"]]}


def every(seconds: int) -> IntervalSchedule:
    return IntervalSchedule.objects.get_or_create(every=seconds, period=IntervalSchedule.SECONDS)[0]


def make_tasks(now: dt.datetime) -> dict[str, int]:
    """The periodic tasks made in the admin (28; the two beat_schedule entries come from the beats):
    their names, and the interval in seconds of those on one."""
    intervals: dict[str, int] = {}

    def interval(name: str, seconds: int, task: str, args: list[Any], **fields: Any) -> None:
        PeriodicTask.objects.create(name=name, task=task, args=json.dumps(args), interval=every(seconds), **fields)
        intervals[name] = seconds

    for name, seconds in (("i2a", 2), ("i2b", 2), ("i3", 3), ("i4", 4), ("i5", 5), ("i6", 6), ("i10", 10)):
        interval(name, seconds, f"{MINE}.plain_mark", [name])
    for name, zone, minute in (("c-utc", "UTC", "*"), ("c-ams", "Europe/Amsterdam", "*"),
                               ("c-ny", "America/New_York", "*"), ("c-2min", "UTC", "*/2")):
        PeriodicTask.objects.create(name=name, task=f"{MINE}.plain_mark", args=json.dumps([name]),
                                    crontab=CrontabSchedule.objects.create(minute=minute, hour="*", timezone=zone))
    for name, seconds in (("k1", 25), ("k2", 45), ("k3", 65)):
        at = now + dt.timedelta(seconds=seconds)
        PeriodicTask.objects.create(name=name, task=f"{MINE}.plain_mark", args=json.dumps([name]), one_off=True,
                                    clocked=ClockedSchedule.objects.create(clocked_time=at))
    noon = now + dt.timedelta(seconds=50)
    PeriodicTask.objects.create(name="s1", task=f"{MINE}.plain_mark", args='["s1"]', solar=SolarSchedule.objects.create(
        event="solar_noon", latitude=0, longitude=noon_longitude(noon)))
    interval("f3", 3, f"{MINE}.plain_fail", ["f3"])
    interval("f5", 5, f"{MINE}.plain_fail", ["f5"])
    interval("r6", 6, f"{MINE}.plain_retry", ["r6"], kwargs='{"fail_times": 1}')
    interval("r10", 10, f"{MINE}.plain_retry", ["r10"], kwargs='{"fail_times": 2}')
    interval("a10", 10, f"{MINE}.plain_autoretry", ["a10"])
    interval("o-audited", 3, f"{OTHER}.audited", ["o-audited"])
    interval("o-rollup", 4, f"{OTHER}.rollup", ["o-rollup"], kwargs='{"size": 3}')
    interval("o-fetch", 5, f"{OTHER}.fetch", ["o-fetch"])
    interval("routed", 4, f"{MINE}.plain_mark", ["routed"], queue=os.environ["CRON_CELERY_TEST_QUEUE"], priority=5,
             headers='{"x-origin": "tests"}')
    interval("later", 2, f"{MINE}.plain_mark", ["later"], start_time=now + dt.timedelta(seconds=40))
    interval("ending", 2, f"{MINE}.plain_mark", ["ending"], expires=now + dt.timedelta(seconds=35))
    interval("off", 2, f"{MINE}.plain_mark", ["off"], enabled=False)
    interval("left out", 2, f"{MINE}.plain_mark", ["left-out"])
    TrackedPeriodicTask.objects.create(periodic_task=PeriodicTask.objects.get(name="left out"), track=False)
    assert PeriodicTask.objects.count() + len(BEAT_SCHEDULE) == 30
    return intervals


def test_thirty_periodic_tasks_tracked_across_a_killed_leader_run_each_slot_once(tmp_path, marker):
    hook = HttpServer().start()
    now = timezone.now()
    intervals = make_tasks(now)
    intervals |= {"bs mark": 3, "bs audited": 5}

    def led_a_while() -> None:  # the first leader runs every kind of task for a while before it is killed
        wait_for(lambda: CronExecution.objects.filter(task_name="k1").exists(), timeout=120,
                 what="the first clocked one-off")

    try:
        logs, leaders, _stopped = run_two_beats(
            tmp_path, marker, seconds=40, workers=2, kill_leader_after=3, at_lead=led_a_while,
            CRON_TEST_BEAT_LEASE_SECONDS="3", CRON_TEST_TRACK="true", CRON_TEST_WEBHOOK_URL=hook.url,
            CRON_TEST_BEAT_SCHEDULE=json.dumps(BEAT_SCHEDULE))
        wait_for(lambda: not Alert.objects.filter(status=AlertStatus.PENDING).exists(), timeout=60,
                 what="every alert to be delivered")
    finally:
        hook.stop()
    assert leaders == 2, logs
    jobs = {job.periodic_task.name if job.periodic_task else job.name: job
            for job in CronJob.objects.filter(task__startswith="cron_celery.tracked:").select_related("periodic_task")}
    # Every one is tracked but the one left out in the admin; a disabled one too (its job paused), and
    # Celery's own celery.backend_cleanup, which django-celery-beat adds to the periodic tasks.
    expected = (set(intervals) - {"left out"}) | {"c-utc", "c-ams", "c-ny", "c-2min", "k1", "k2", "k3", "s1"}
    assert set(jobs) - {"celery.backend_cleanup"} == expected, sorted(jobs)
    lines = Counter(line.split()[1] for line in marked(marker) if line.split()[0] in (
        "plain-mark", "plain-fail", "plain-retry", "plain-autoretry", "other-audited", "other-rollup", "other-fetch"))

    def rows(name: str) -> list[CronExecution]:
        return list(CronExecution.objects.filter(job=jobs[name]).order_by("slot"))

    problems = []
    for name, seconds in intervals.items():
        if name in ("off", "left out"):
            continue
        found = rows(name)
        slots = [row.slot for row in found]
        gaps = {(b - a).total_seconds() for a, b in itertools.pairwise(slots)}
        if len(found) < 3 or len(set(slots)) != len(slots) or gaps != {float(seconds)}:
            problems.append(f"{name}: {len(found)} slots, gaps {sorted(gaps)}")
        ran = [row for row in found if row.status in RAN]
        label = name.replace(" ", "-")
        attempts = sum(max(1, len(row.attempts)) for row in ran)
        if lines[label] != attempts:  # each attempt's body once, never a slot's twice
            problems.append(f"{name}: {lines[label]} bodies for {attempts} attempts of {len(ran)} slots")
    assert not problems, problems
    for name in ("k1", "k2", "k3", "s1"):  # recorded as they fired, each once
        found = rows(name)
        assert [row.status for row in found] == [Status.SUCCEEDED] and lines[name] == 1, (name, found)
    for name in ("c-utc", "c-ams", "c-ny"):
        assert {row.slot.second for row in rows(name)} == {0} and len(rows(name)) >= 1
    assert {row.status for row in rows("f3")} <= {Status.FAILED, Status.MISSED}
    assert all(row.retry_count == 1 for row in rows("r6") if row.status == Status.SUCCEEDED)
    assert {(row.status, row.retry_count) for row in rows("a10") if row.completed and row.status != Status.MISSED} == {
        (Status.FAILED, 1)}
    assert all(row.slot >= now + dt.timedelta(seconds=40) for row in rows("later"))
    assert all(row.slot <= now + dt.timedelta(seconds=35) for row in rows("ending"))
    assert not CronExecution.objects.filter(job=jobs["off"]).exists() and lines["off"] == 0
    assert lines["left-out"] >= 10  # untracked, as before: no row
    assert next(row.result for row in rows("o-rollup") if row.status == Status.SUCCEEDED) == {
        "label": "o-rollup", "rows": 3}  # a class-based task's result, JSON-safe, its kwargs passed through
    # Nothing alerted twice: one alert per failed execution and event at most, each delivered once.
    alerts = list(Alert.objects.all())
    assert alerts and Counter((alert.execution_id, alert.event, alert.channel) for alert in alerts).most_common(1)[0][
        1] == 1
    assert len(hook.received()) == sum(1 for alert in alerts if alert.status == AlertStatus.SENT)
