"""Admin edits that cannot drive a job, and execution dates, on a real ``celery beat``.

An edit that passes django-celery-beat's field checks but can never fire must stop that
one job only: every other job keeps its slots, the edited job stays on its previous
schedule with the reason stored, logged and alerted, and a beat (re)starts with the bad
row present. And a beat row's ``execution_date`` follows the job's timezone, like every
other writer's, even when the schedule is read in another timezone.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import pytest
from django.db import transaction
from django.db.models import F
from django.utils import timezone
from django_celery_beat.models import PeriodicTask
from hypothesis import HealthCheck, Phase, given, settings

from cron_celery.models import CronExecution, CronJob, Status, Trigger
from tests.conftest import manage, subprocess_env, wait_for
from tests.faults.test_beat import beat_log, start_beat, stop
from tests.servers import HttpServer
from tests.test_bad_edits_fuzz import EDITS as HOSTILE_EDITS
from tests.test_bad_edits_fuzz import write_edit
from tests.workers import Worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

#: The jobs of tests/jobsapp/jobs_edits.py, and one beat that always leads.
EDITS = {"CRON_TEST_EDITS": "1", "CRON_CELERY_BEAT_ALWAYS_LEAD": "1"}


def slots_after(name: str, moment: float) -> int:
    after = dt.datetime.fromtimestamp(moment, tz=dt.UTC)
    return CronExecution.objects.filter(task_name=name, slot__gt=after).count()


def schedule_alerts(hook: HttpServer, code: str) -> list[dict[str, object]]:
    bodies = [request.json() for request in hook.received()]
    return [body for body in bodies if body.get("event") == "SCHEDULE" and body.get("code") == code]


def test_a_crontab_that_never_fires_stops_only_its_own_job_and_a_restarted_beat_starts(tmp_path: Path, marker):
    """Issue 13 item 4: the admin sets one job's crontab to day 30 of month 2."""
    hook = HttpServer().start()
    env = {**EDITS, "CRON_TEST_WEBHOOK_URL": hook.url, "CRON_TEST_MARKER": str(marker)}
    worker = Worker(tmp_path, env, pool="solo").start()
    beat = start_beat(tmp_path, env, 0)
    try:
        wait_for(lambda: CronExecution.objects.filter(task_name="edits-steady").count() >= 2, timeout=60,
                 what="the first slots of edits-steady")
        victim = CronJob.objects.select_related("periodic_task__crontab").get(name="edits-victim")
        assert victim.periodic_task is not None and victim.periodic_task.crontab is not None
        previous = (victim.schedule, victim.schedule_timezone)
        assert previous == ("* * * * *", "UTC") and victim.next_run_at is not None
        crontab = victim.periodic_task.crontab
        crontab.day_of_month, crontab.month_of_year = "30", "2"
        crontab.save()  # what the admin's crontab form does: django-celery-beat accepts it
        edited = time.time()

        # Every other job keeps its slots.
        wait_for(lambda: slots_after("edits-steady", edited + 1) >= 4, timeout=30,
                 what="edits-steady's slots after the bad edit")
        # The edited job stays on its previous schedule, with the reason stored and logged.
        wait_for(lambda: CronJob.objects.get(name="edits-victim").schedule_problem != "", timeout=30,
                 what="the problem to be stored on the job")
        victim = CronJob.objects.get(name="edits-victim")
        assert (victim.schedule, victim.schedule_timezone) == previous
        assert "never fires" in victim.schedule_problem and "30 2" in victim.schedule_problem
        assert victim.next_run_at is not None and victim.next_run_at.second == 0  # the every-minute grid
        assert not victim.paused
        log = beat_log(tmp_path, 0)
        assert "edits-victim" in log and "never fires" in log
        # An alert through the job's failure channels (here the webhook), delivered by the worker.
        wait_for(lambda: bool(schedule_alerts(hook, "E002")), timeout=30, what="the schedule alert")
        alert = schedule_alerts(hook, "E002")[0]
        assert "never fires" in str(alert["error"]) and alert["error_code"] == "SCHEDULE_NOT_APPLIED"

        # A beat started with the bad row present starts, dispatches, and keeps the job on its
        # previous schedule.
        stop(beat)
        restarted = time.time()
        beat = start_beat(tmp_path, env, 1)
        wait_for(lambda: slots_after("edits-steady", restarted + 1) >= 2, timeout=60,
                 what="a beat restarted with the bad row to dispatch")
        # Its slot of this minute (instead of waiting for the next one): the beat plans it by
        # the previous schedule and dispatches it.
        this_minute = timezone.now().replace(second=0, microsecond=0)
        CronJob.objects.filter(name="edits-victim", next_run_at__gt=this_minute).update(next_run_at=this_minute)
        wait_for(lambda: CronExecution.objects.filter(task_name="edits-victim", slot__gte=this_minute).exists(),
                 timeout=30, what="a slot of edits-victim's previous schedule")
        assert beat.poll() is None, beat_log(tmp_path, 1)[-3000:]
        victim = CronJob.objects.get(name="edits-victim")
        assert victim.schedule == "* * * * *" and "never fires" in victim.schedule_problem
        assert "edits-victim: its schedule edit is still not applied" in beat_log(tmp_path, 1)
    finally:
        stop(beat)
        worker.stop()
        hook.stop()
    # The fix clears the problem (a plain sync, as a release step runs it).
    crontab.day_of_month, crontab.month_of_year = "*", "*"
    crontab.save()
    synced = manage("sync_cron_schedules", env=subprocess_env(**EDITS))
    assert synced.returncode == 0, synced.stderr
    victim = CronJob.objects.get(name="edits-victim")
    assert victim.schedule_problem == "" and victim.next_run_at is not None


def test_a_stored_schedule_nothing_can_plan_is_set_aside_and_the_beat_goes_on(tmp_path: Path, marker):
    """The same, for a bad schedule written on the job's row itself (an old row, SQL): the beat
    sets that job aside (paused, no next slot, the reason stored) instead of failing every round."""
    beat = start_beat(tmp_path, EDITS, 0)
    try:
        wait_for(lambda: CronExecution.objects.filter(task_name="edits-steady").count() >= 2, timeout=60,
                 what="the first slots of edits-steady")
        # Not in the first seconds of a minute: the victim's own slot of that minute, sent as the row is
        # written, would count as a slot after the bad row.
        time.sleep(max(0.0, 5 - time.time() % 60))
        CronJob.objects.filter(name="edits-victim").update(schedule="* * 30 2 *", next_run_at=timezone.now())
        written = time.time()
        wait_for(lambda: slots_after("edits-steady", written + 1) >= 4, timeout=30,
                 what="edits-steady's slots after the bad row")
        wait_for(lambda: CronJob.objects.get(name="edits-victim").paused, timeout=30,
                 what="the bad row to be set aside")
        assert beat.poll() is None
    finally:
        stop(beat)
    victim = CronJob.objects.get(name="edits-victim")
    assert victim.next_run_at is None and "never fires" in victim.schedule_problem
    assert not CronExecution.objects.filter(task_name="edits-victim", slot__gt=dt.datetime.fromtimestamp(
        written - 1, tz=dt.UTC)).exists()
    assert "edits-victim" in beat_log(tmp_path, 0) and "never fires" in beat_log(tmp_path, 0)


def test_a_beat_row_has_the_execution_date_of_the_jobs_timezone_like_run_cron_task(tmp_path: Path):
    """Issue 13 item 13: schedule read in Pago Pago (UTC-11), job in Kiritimati (UTC+14)."""
    beat = start_beat(tmp_path, EDITS, 0)
    try:
        wait_for(lambda: CronJob.objects.filter(name="edits-new-year", next_run_at__isnull=False).exists(),
                 timeout=60, what="the beat to sync edits-new-year")
        job = CronJob.objects.get(name="edits-new-year")
        assert (job.schedule_timezone, job.timezone) == ("Pacific/Pago_Pago", "Pacific/Kiritimati")
        # As if the beat had been down since the 2025 slot: it records 2025 MISSED and runs 2026.
        CronJob.objects.filter(id=job.id).update(next_run_at=dt.datetime(2025, 1, 1, 11, tzinfo=dt.UTC))
        wait_for(lambda: CronExecution.objects.filter(task_name="edits-new-year").count() >= 2, timeout=30,
                 what="the beat to dispatch the overdue slots")
    finally:
        stop(beat)
    rows = {row.slot.year: row for row in CronExecution.objects.filter(task_name="edits-new-year")}
    missed, ran = rows[2025], rows[2026]
    assert (missed.status, ran.status, ran.trigger) == (Status.MISSED, Status.PENDING, Trigger.BEAT)
    # 2026-01-01T11:00Z is 00:00 on 1 January in Pago Pago and 01:00 on 2 January in Kiritimati.
    assert ran.slot == dt.datetime(2026, 1, 1, 11, tzinfo=dt.UTC)
    assert (missed.execution_date, ran.execution_date) == (dt.date(2025, 1, 2), dt.date(2026, 1, 2))
    # What run_cron_task writes for the same slot (a forced run #2 of the MISSED one).
    done = manage("run_cron_task", "edits-new-year", "--at", "2025-01-01T11:00Z", "--force",
                  env=subprocess_env(**EDITS))
    assert done.returncode == 0, done.stdout + done.stderr
    manual = CronExecution.objects.get(task_name="edits-new-year", slot=missed.slot, run_number=2)
    assert manual.trigger == Trigger.MANUAL and manual.execution_date == missed.execution_date


def hostile_edits(count: int) -> list[dict[str, object]]:
    """``count`` edits Hypothesis generates from the fuzz test's strategy (a fixed seed: the same every run)."""
    found: list[dict[str, object]] = []

    @settings(max_examples=count, phases=[Phase.generate], derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(HOSTILE_EDITS)
    def collect(edit: dict[str, object]) -> None:
        found.append(edit)

    collect()
    return found


def test_a_batch_of_hostile_edits_stops_no_other_job_and_a_restarted_beat_starts(tmp_path: Path):
    """Issue 35 item 2: kwargs jsonb cannot hold, a window opening at the calendar's last second and
    Hypothesis's own hostile values, written to three jobs' periodic tasks in one transaction (one
    batch for the beat); the steady job keeps its slots, each edited job carries its own problem,
    and a beat started with those rows present starts and dispatches."""
    generated = hostile_edits(40)
    beat = start_beat(tmp_path, EDITS, 0)
    try:
        wait_for(lambda: CronExecution.objects.filter(task_name="edits-steady").count() >= 2, timeout=60,
                 what="the first slots of edits-steady")
        tasks = {name: PeriodicTask.objects.get(cron_job__name=name).id
                 for name in ("edits-params", "edits-victim", "edits-new-year")}
        with transaction.atomic():
            PeriodicTask.objects.filter(id=tasks["edits-params"]).update(kwargs='{"note": "a\\u0000b", "limit": 2}')
            PeriodicTask.objects.filter(id=tasks["edits-victim"]).update(
                start_time=dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=dt.UTC))
            for edit in generated:  # as far as PostgreSQL lets each value land
                write_edit(tasks["edits-new-year"], edit)
        edited = time.time()
        wait_for(lambda: slots_after("edits-steady", edited + 1) >= 4, timeout=30,
                 what="edits-steady's slots after the hostile edits")
        wait_for(lambda: not CronJob.objects.exclude(schedule_version=F("schedule_seen")).exists(), timeout=30,
                 what="every edit to be taken in")
        problems = dict(CronJob.objects.values_list("name", "schedule_problem"))
        assert "cannot be stored" in problems["edits-params"] and "NUL" in problems["edits-params"]
        assert "no slot after that before the calendar ends" in problems["edits-victim"]
        assert problems["edits-steady"] == ""
        assert beat.poll() is None and "dispatch round failed" not in beat_log(tmp_path, 0)

        stop(beat)
        restarted = time.time()
        beat = start_beat(tmp_path, EDITS, 1)
        wait_for(lambda: slots_after("edits-steady", restarted + 1) >= 2, timeout=60,
                 what="a beat restarted with the hostile rows to dispatch")
        assert beat.poll() is None, beat_log(tmp_path, 1)[-3000:]
        assert "dispatch round failed" not in beat_log(tmp_path, 1)
    finally:
        stop(beat)
