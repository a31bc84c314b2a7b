"""Edits that cannot drive a job, every kind of them, and every path that reads a stored
schedule: one bad row stops one job, never the others, never the beat or a page.

The real ``celery beat`` versions are in ``tests/faults/test_bad_edits.py``."""

from __future__ import annotations

import datetime as dt
import io

import pytest
from django.core.management import call_command
from django.db import connection
from django_celery_beat.models import (
    ClockedSchedule,
    CrontabSchedule,
    IntervalSchedule,
    PeriodicTask,
    SolarSchedule,
)

from cron_celery import beat, exceptions, reconciler, schedules
from cron_celery.alerts import schedule_alerts
from cron_celery.beat import schedule_problems, schedule_sync
from cron_celery.decisions import dispatch, in_effect
from cron_celery.declaring import registry
from cron_celery.models import CronJob
from cron_celery.web import dashboard
from tests.servers import HttpServer

pytestmark = pytest.mark.django_db(transaction=True)

NOW = dt.datetime(2026, 11, 29, 12, 0, 30, tzinfo=dt.UTC)
DASHBOARD = "/admin/cron_celery/cronjob/"
CRONTAB = CrontabSchedule._meta.db_table


def job_row(name: str) -> CronJob:
    return CronJob.objects.get(name=name)


def task_of(name: str) -> PeriodicTask:
    return PeriodicTask.objects.get(cron_job__name=name)


def break_nightly_crontab(**fields: str) -> None:
    """An edit of nightly-report's own crontab row (no other job uses it)."""
    CrontabSchedule.objects.filter(id=task_of("nightly-report").crontab_id).update(**fields)  # whatever it holds


def tick_on_new_interval(every: int, period: str) -> None:
    """tick-2s moved to an interval row of its own (its every-2-seconds row is shared)."""
    row = IntervalSchedule.objects.create(every=1, period=IntervalSchedule.SECONDS)
    IntervalSchedule.objects.filter(id=row.id).update(every=every, period=period)  # past the form's checks
    PeriodicTask.objects.filter(id=task_of("tick-2s").id).update(interval=row)


def nightly_on_solar() -> None:
    solar = SolarSchedule.objects.create(event="sunrise", latitude=52.37, longitude=4.9)
    PeriodicTask.objects.filter(id=task_of("nightly-report").id).update(crontab=None, solar=solar)


def nightly_on_clocked() -> None:
    clocked = ClockedSchedule.objects.create(clocked_time=NOW + dt.timedelta(days=1))
    PeriodicTask.objects.filter(id=task_of("nightly-report").id).update(crontab=None, clocked=clocked)


def nightly_in_no_timezone() -> None:
    with connection.cursor() as cursor:  # the form offers only real zones; SQL can write anything
        cursor.execute(f"UPDATE {CRONTAB} SET timezone = 'Mars/Olympus_Mons' WHERE id = %s",
                       [task_of("nightly-report").crontab_id])


BAD_EDITS = {
    "never fires": ("nightly-report", lambda: break_nightly_crontab(day_of_month="30", month_of_year="2"),
                    "it never fires"),
    "unparsable field": ("nightly-report", lambda: break_nightly_crontab(minute="sixty"), "minute 'sixty'"),
    "field out of range": ("nightly-report", lambda: break_nightly_crontab(hour="25"), "hour '25'"),
    "unknown timezone": ("nightly-report", nightly_in_no_timezone, "unknown timezone"),
    "solar": ("nightly-report", nightly_on_solar, "solar or clocked"),
    "clocked": ("nightly-report", nightly_on_clocked, "solar or clocked"),
    "interval of 0": ("tick-2s", lambda: tick_on_new_interval(0, IntervalSchedule.SECONDS),
                      "whole number of seconds"),
    "interval in microseconds": ("tick-2s", lambda: tick_on_new_interval(5, IntervalSchedule.MICROSECONDS),
                                 "days, hours, minutes or seconds only"),
}


@pytest.mark.parametrize("kind", list(BAD_EDITS))
def test_an_edit_that_cannot_drive_a_job_keeps_it_on_its_previous_schedule_and_says_why(kind, caplog):
    name, edit, reason = BAD_EDITS[kind]
    schedule_sync.sync(NOW)
    before = {row.name: (row.schedule, row.schedule_timezone, row.next_run_at) for row in CronJob.objects.all()}
    edit()
    assert schedule_sync.apply_edits(NOW) >= 1  # no exception: the other jobs' edits go on
    row = job_row(name)
    assert (row.schedule, row.schedule_timezone, row.next_run_at) == before[name]
    assert reason in row.schedule_problem and not row.paused
    assert "cannot drive it" in caplog.text and name in caplog.text and reason in caplog.text
    # Every other job is untouched, and a beat starting now (its sync) starts.
    others = {r.name: (r.schedule, r.schedule_timezone, r.next_run_at) for r in CronJob.objects.exclude(name=name)}
    assert others == {key: value for key, value in before.items() if key != name}
    assert not CronJob.objects.exclude(name=name).exclude(schedule_problem="").exists()
    schedule_sync.sync(NOW)
    assert job_row(name).schedule_problem == row.schedule_problem


def test_fixing_the_edit_clears_the_problem_and_the_new_schedule_takes_over():
    schedule_sync.sync(NOW)
    break_nightly_crontab(day_of_month="30", month_of_year="2")
    schedule_sync.apply_edits(NOW)
    assert "never fires" in job_row("nightly-report").schedule_problem
    break_nightly_crontab(day_of_month="*", month_of_year="*", hour="4")
    schedule_sync.apply_edits(NOW)
    row = job_row("nightly-report")
    assert row.schedule_problem == "" and row.schedule == "0 4 * * *"
    assert row.next_run_at == dt.datetime(2026, 11, 30, 3, 0, tzinfo=dt.UTC)  # 04:00 in Amsterdam


def test_a_job_without_a_previous_schedule_is_paused_until_the_edit_is_fixed():
    schedule_sync.sync(NOW)
    CronJob.objects.filter(name="nightly-report").update(schedule="", schedule_timezone="", next_run_at=None)
    break_nightly_crontab(day_of_month="31", month_of_year="4")  # April has 30 days
    schedule_sync.apply_edits(NOW)
    row = job_row("nightly-report")
    assert row.paused and row.next_run_at is None and "never fires" in row.schedule_problem
    assert dispatch.next_due()[0] is not None  # the other jobs are still due
    break_nightly_crontab(day_of_month="30")
    schedule_sync.apply_edits(NOW)
    row = job_row("nightly-report")
    assert not row.paused and row.schedule == "0 2 30 4 *" and row.schedule_problem == ""
    assert row.next_run_at == dt.datetime(2027, 4, 30, 0, 0, tzinfo=dt.UTC)  # 02:00 CEST


def test_resuming_a_job_whose_edit_was_refused_resumes_its_previous_schedule():
    schedule_sync.sync(NOW)
    task = task_of("nightly-report")
    PeriodicTask.objects.filter(id=task.id).update(enabled=False)
    break_nightly_crontab(day_of_month="30", month_of_year="2")
    schedule_sync.apply_edits(NOW)
    row = job_row("nightly-report")
    assert row.paused and row.next_run_at is None and "never fires" in row.schedule_problem
    PeriodicTask.objects.filter(id=task.id).update(enabled=True)
    schedule_sync.apply_edits(NOW)
    row = job_row("nightly-report")
    assert not row.paused and row.schedule == "0 2 * * *"
    assert row.next_run_at == dt.datetime(2026, 11, 30, 1, 0, tzinfo=dt.UTC)


def test_each_new_reason_is_alerted_once_on_the_jobs_failure_channels(monkeypatch):
    sent: list[tuple[str, str, str]] = []
    monkeypatch.setattr(schedule_alerts, "schedule_problem",
                        lambda job, **kw: sent.append((kw["code"], kw["problem"], kw["state"])) or 1)
    schedule_sync.sync(NOW)
    break_nightly_crontab(day_of_month="30", month_of_year="2")
    schedule_sync.apply_edits(NOW)
    break_nightly_crontab(minute="5")  # another edit, still never fires: a new reason
    schedule_sync.apply_edits(NOW)
    CronJob.objects.filter(name="nightly-report").update(schedule_version=999)  # read again: the same reason
    schedule_sync.apply_edits(NOW)
    kept = "keeping '0 2 * * *' until the schedule is fixed"
    assert [(code, state) for code, _, state in sent] == [("T107", kept)] * 2
    assert "0 2 30 2 *" in sent[0][1] and "5 2 30 2 *" in sent[1][1]


def test_the_schedule_alert_reaches_a_channel_with_the_reason_and_no_execution(settings):
    hook = HttpServer().start()
    try:
        settings.CRON_CELERY = {**settings.CRON_CELERY, "NOTIFICATIONS": {
            "on_failure": ["webhook"], "webhook": {"url": hook.url}}}
        found = dt.datetime(2026, 11, 29, 12, 0, 30, tzinfo=dt.UTC)
        assert schedule_alerts.deliver_schedule_problem.run(
            "T107", "nightly-report", "webhook", "crontab 0 2 30 2 *: never", "keeping '0 2 * * *'",
            found.isoformat()) == "SENT"
    finally:
        hook.stop()
    body = hook.received()[0].json()
    assert body["event"] == schedule_alerts.SCHEDULE_EVENT and body["code"] == "T107" and body["execution_id"] is None
    assert body["error_code"] == "SCHEDULE_NOT_APPLIED" and "never" in body["error"]
    assert body["status"] == "keeping '0 2 * * *'" and body["found_at"] == found.isoformat()
    text = schedule_alerts.schedule_message(code="T107", name="nightly-report", problem="never", state="paused",
                                   found=found).text()
    assert text.startswith("[cron] nightly-report (T107): schedule edit not applied") and "Meanwhile: paused" in text


def test_a_failed_schedule_alert_is_retried_then_given_up(settings):
    hook = HttpServer().start()
    hook.answer(500, "down", times=2)
    args = ("T107", "nightly-report", "webhook", "never", "paused", NOW.isoformat())
    try:
        settings.CRON_CELERY = {**settings.CRON_CELERY, "NOTIFICATIONS": {
            "on_failure": ["webhook"], "webhook": {"url": hook.url}, "max_attempts": 2}}
        with pytest.raises(exceptions.DeliveryFailed, match="HTTP 500"):  # called directly: no retry message
            schedule_alerts.deliver_schedule_problem.run(*args)
        settings.CRON_CELERY = {**settings.CRON_CELERY, "NOTIFICATIONS": {
            "on_failure": ["webhook"], "webhook": {"url": hook.url}, "max_attempts": 1}}
        assert schedule_alerts.deliver_schedule_problem.run(*args) == "FAILED"
    finally:
        hook.stop()
    assert len(hook.received()) == 2


def test_the_dashboard_shows_the_reason_and_what_the_job_does_meanwhile(admin_client):
    schedule_sync.sync()
    crontab = CrontabSchedule.objects.get(id=task_of("nightly-report").crontab_id)
    crontab.day_of_month, crontab.month_of_year = "30", "2"
    crontab.save()  # as the crontab's admin form saves it
    schedule_sync.apply_edits()
    page = admin_client.get(DASHBOARD)
    assert page.status_code == 200
    html = page.content.decode()
    assert html.count('class="cron-schedule-problem"') == 1
    assert "Edit not applied:" in html and "it never fires" in html and "crontab 0 2 30 2 * (Europe/Amsterdam)" in html
    assert "runs on its previous schedule until the schedule is fixed" in html
    assert "every day at 02:00" in html  # the schedule in effect is still the previous one
    detail = admin_client.get(f"{DASHBOARD}{job_row('nightly-report').id}/change/").content.decode()
    assert "it never fires" in detail


def bad_stored_row(name: str, schedule: str, timezone: str = "UTC") -> CronJob:
    """A stored schedule nothing can plan, written around the sync (an old row, raw SQL)."""
    CronJob.objects.filter(name=name).update(schedule=schedule, schedule_timezone=timezone,
                                             next_run_at=NOW - dt.timedelta(hours=1))
    return CronJob.objects.get(name=name)


def test_a_stored_schedule_that_cannot_be_planned_is_set_aside_not_dispatched_forever(caplog):
    schedule_sync.sync(NOW)
    bad = bad_stored_row("nightly-report", "0 2 30 2 *")
    zoneless = bad_stored_row("tick-1s", "every 1s")
    CronJob.objects.filter(id=zoneless.id).update(timezone="Mars/Olympus_Mons")  # the job's own timezone
    CronJob.objects.filter(name="tick-2s").update(next_run_at=NOW - dt.timedelta(seconds=2))
    due = dispatch.due_jobs(NOW)
    assert {bad.id, zoneless.id} <= {row.job_id for row in due}
    problems: dict[int, str] = {}
    decisions = [beat.plan(row, NOW, {}, {}, problems) for row in due]
    planned = {decision.job_id for decision in decisions if decision is not None}
    assert bad.id not in planned and zoneless.id not in planned
    assert job_row("tick-2s").id in planned  # the rest of the batch is dispatched
    assert "never fires" in problems[bad.id] and "Mars/Olympus_Mons" in problems[zoneless.id]
    assert schedule_problems.set_aside(problems) == 2
    assert {row.job_id for row in dispatch.due_jobs(NOW)}.isdisjoint({bad.id, zoneless.id})
    row = job_row("nightly-report")
    assert row.paused and row.next_run_at is None and "never fires" in row.schedule_problem
    # A usable edit of its periodic task brings it back.
    break_nightly_crontab(hour="3")
    schedule_sync.apply_edits(NOW)
    row = job_row("nightly-report")
    assert not row.paused and row.schedule == "0 3 * * *" and row.next_run_at is not None
    assert row.schedule_problem == ""


def test_every_other_reader_of_a_stored_schedule_survives_a_bad_row():
    schedule_sync.sync(NOW)
    bad_stored_row("nightly-report", "0 2 30 2 *")
    bad_stored_row("tick-2s", "every 0s")
    # The reconciler's undispatched step plans through beat.plan.
    assert reconciler.run_pass(NOW + dt.timedelta(hours=2)).ran
    # The schedule in effect falls back to the code's.
    declared = registry.get("tick-2s")
    assert in_effect.in_effect(declared).schedule == declared.schedule
    assert in_effect.in_effect(registry.get("nightly-report")).schedule == registry.get("nightly-report").schedule
    # list_cron_tasks and the dashboard read them as text.
    out = io.StringIO()
    call_command("list_cron_tasks", stdout=out)
    assert "every 0s" in out.getvalue() and "0 2 30 2 *" in out.getvalue()
    assert dashboard.describe("every 0s") == "cron every 0s"
    assert schedules.parse_expression("0 2 30 2 *").expression == "0 2 30 2 *"  # parses, never fires


def test_beat_rows_take_the_execution_date_in_the_jobs_timezone():
    """Item 13, without a beat: the decision's timezone is the job's, not the schedule's."""
    schedule_sync.sync(NOW)
    CronJob.objects.filter(name="nightly-report").update(timezone="Pacific/Kiritimati",
                                                         schedule_timezone="Pacific/Pago_Pago",
                                                         next_run_at=NOW - dt.timedelta(minutes=1))
    row = next(row for row in dispatch.due_jobs(NOW) if row.name == "nightly-report")
    assert (row.timezone, row.job_timezone) == ("Pacific/Pago_Pago", "Pacific/Kiritimati")
    decision = beat.plan(row, NOW, {}, {})
    assert decision is not None and str(decision.tz) == "Pacific/Kiritimati"
