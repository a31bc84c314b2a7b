"""Schedules declared in code, synced to django-celery-beat, edited in the admin."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest
from django_celery_beat.models import CrontabSchedule, IntervalSchedule, PeriodicTask

from cron_celery.alerts import sentry
from cron_celery.beat import schedule_sync
from cron_celery.decisions import in_effect
from cron_celery.declaring import registry
from cron_celery.models import CronJob
from cron_celery.schedules import cron
from tests.admin_forms import submit
from tests.conftest import manage

pytestmark = pytest.mark.django_db

NOW = dt.datetime(2026, 11, 29, 12, 0, 30, tzinfo=dt.UTC)


def job_row(name: str) -> CronJob:
    return CronJob.objects.select_related("periodic_task__crontab", "periodic_task__interval").get(name=name)


def change_url(task: PeriodicTask) -> str:
    return f"/admin/django_celery_beat/periodictask/{task.id}/change/"


def test_sync_gives_every_scheduled_job_a_periodic_task_and_a_next_slot():
    report = schedule_sync.sync(NOW)
    assert {"nightly-report", "tick-1s", "tick-2s"} <= set(report.created)
    nightly = job_row("nightly-report")
    crontab = nightly.periodic_task.crontab
    assert (crontab.minute, crontab.hour, str(crontab.timezone)) == ("0", "2", "Europe/Amsterdam")
    assert nightly.periodic_task.task == "tests.jobsapp.tasks.nightly_report" and nightly.periodic_task.enabled
    assert (nightly.schedule, nightly.schedule_timezone) == ("0 2 * * *", "Europe/Amsterdam")
    assert nightly.next_run_at == dt.datetime(2026, 11, 30, 1, 0, tzinfo=dt.UTC)  # 02:00 in Amsterdam
    tick = job_row("tick-2s")
    assert (tick.periodic_task.interval.every, tick.periodic_task.interval.period) == (2, IntervalSchedule.SECONDS)
    assert tick.schedule == "every 2s" and tick.next_run_at == dt.datetime(2026, 11, 29, 12, 0, 32, tzinfo=dt.UTC)
    # Jobs without a schedule get no periodic task.
    assert not PeriodicTask.objects.filter(task="tests.jobsapp.tasks.calc_commission").exists()

    stamps = dict(PeriodicTask.objects.values_list("id", "date_changed"))
    again = schedule_sync.sync(NOW)
    assert again.created == again.updated == again.disabled == [] and "nightly-report" in again.kept
    assert dict(PeriodicTask.objects.values_list("id", "date_changed")) == stamps  # nothing rewritten


def test_an_admin_edit_of_the_crontab_moves_the_next_slot_and_survives_the_next_sync(admin_client):
    schedule_sync.sync(NOW)
    task = job_row("nightly-report").periodic_task
    other = CrontabSchedule.objects.create(minute="30", hour="4", timezone="Europe/Amsterdam")
    response = submit(admin_client, change_url(task), {"crontab": str(other.id)})
    assert response.status_code == 302, response.content[:2000]
    row = job_row("nightly-report")
    assert row.schedule_version != row.schedule_seen  # the trigger saw the edit
    assert schedule_sync.apply_edits(NOW) == 1
    row = job_row("nightly-report")
    assert row.schedule == "30 4 * * *" and row.next_run_at == dt.datetime(2026, 11, 30, 3, 30, tzinfo=dt.UTC)
    assert schedule_sync.apply_edits(NOW) == 0  # taken in once

    report = schedule_sync.sync(NOW)  # the code did not change: the admin's schedule stays
    assert "nightly-report" in report.kept
    assert job_row("nightly-report").periodic_task.crontab_id == other.id
    # run_cron_task DATE runs the day's slot of the schedule in effect.
    edited = in_effect.in_effect(registry.get("nightly-report"))
    assert edited.first_slot_on(dt.date(2026, 11, 29)) == dt.datetime(2026, 11, 29, 3, 30, tzinfo=dt.UTC)


def test_sentry_monitors_are_told_the_schedule_in_effect_after_an_admin_edit(admin_client):
    schedule_sync.sync(NOW)
    declared = registry.get("nightly-report")
    assert sentry.monitor_config(sentry.in_effect(declared))["schedule"] == {"type": "crontab", "value": "0 2 * * *"}
    task = job_row("nightly-report").periodic_task
    other = CrontabSchedule.objects.create(minute="30", hour="4", timezone="Europe/Amsterdam")
    submit(admin_client, change_url(task), {"crontab": str(other.id)})
    schedule_sync.apply_edits(NOW)
    config = sentry.monitor_config(sentry.in_effect(declared))
    assert (config["schedule"], config["timezone"]) == ({"type": "crontab", "value": "30 4 * * *"}, "Europe/Amsterdam")


def test_a_monitor_reads_the_schedule_in_its_own_timezone():
    job = dataclasses.replace(registry.get("nightly-report"), timezone="UTC",
                              schedule=cron("0 15 * * *", timezone="America/New_York"))
    assert sentry.monitor_config(job)["timezone"] == "America/New_York"
    assert sentry.monitor_config(dataclasses.replace(job, schedule=cron("0 15 * * *")))["timezone"] == "UTC"


def test_a_fixed_retry_delay_is_not_doubled_in_the_monitors_runtime():
    job = dataclasses.replace(registry.get("nightly-report"), max_retries=3, retry_backoff=False, time_limit=60)
    # 4 attempts of 60 s and 3 waits of 180 s: 780 s = 13 minutes.
    assert sentry.monitor_config(job)["max_runtime"] == 13
    doubling = dataclasses.replace(job, retry_backoff=100, retry_backoff_max=10_000)
    # 4 attempts of 60 s plus 100 + 200 + 400 s = 940 s, so 16 minutes.
    assert sentry.monitor_config(doubling)["max_runtime"] == 16


def test_editing_the_crontab_row_itself_reaches_every_job_that_uses_it(admin_client):
    schedule_sync.sync(NOW)
    crontab = job_row("nightly-report").periodic_task.crontab
    url = f"/admin/django_celery_beat/crontabschedule/{crontab.id}/change/"
    assert submit(admin_client, url, {"hour": "5"}).status_code == 302
    schedule_sync.apply_edits(NOW)
    assert job_row("nightly-report").schedule == "0 5 * * *"


def test_a_change_in_code_wins_over_the_admin_edit(admin_client, monkeypatch):
    schedule_sync.sync(NOW)
    task = job_row("nightly-report").periodic_task
    other = CrontabSchedule.objects.create(minute="30", hour="4", timezone="Europe/Amsterdam")
    submit(admin_client, change_url(task), {"crontab": str(other.id)})
    declared = registry.get("nightly-report")
    changed = dataclasses.replace(declared, schedule=cron("15 3 * * *", timezone="Europe/Amsterdam"))
    monkeypatch.setitem(registry._by_name, "nightly-report", changed)
    monkeypatch.setitem(registry._by_code, changed.code, changed)
    report = schedule_sync.sync(NOW)
    assert report.updated == ["nightly-report"]
    row = job_row("nightly-report")
    assert (row.periodic_task.crontab.minute, row.periodic_task.crontab.hour) == ("15", "3")
    assert row.schedule == "15 3 * * *" and row.next_run_at == dt.datetime(2026, 11, 30, 2, 15, tzinfo=dt.UTC)
    assert row.periodic_task_id == task.id  # the same periodic task, rewritten


def test_disabling_in_the_admin_pauses_at_once_and_enabling_starts_at_the_next_slot(admin_client):
    schedule_sync.sync(NOW)
    task = job_row("tick-2s").periodic_task
    changelist = "/admin/django_celery_beat/periodictask/"
    # The admin's bulk action (a queryset update, no save signals) is seen too.
    response = admin_client.post(changelist, {"action": "disable_tasks", "_selected_action": [task.id]})
    assert response.status_code == 302
    row = job_row("tick-2s")
    assert row.paused and row.next_run_at is None
    later = NOW + dt.timedelta(hours=5)
    assert submit(admin_client, change_url(task), {"enabled": "on"}).status_code == 302
    schedule_sync.apply_edits(later)
    row = job_row("tick-2s")
    assert not row.paused and row.next_run_at == later.replace(microsecond=0) + dt.timedelta(seconds=2)


def test_a_job_removed_from_the_code_is_disabled_not_deleted(monkeypatch):
    schedule_sync.sync(NOW)
    task_id = job_row("tick-1s").periodic_task_id
    monkeypatch.delitem(registry._by_name, "tick-1s")
    report = schedule_sync.sync(NOW)
    assert report.disabled == ["T108"]
    task = PeriodicTask.objects.get(id=task_id)
    assert not task.enabled
    row = CronJob.objects.get(name="tick-1s")
    assert row.periodic_task_id is None and row.next_run_at is None
    monkeypatch.undo()
    back = schedule_sync.sync(NOW)  # declared again: the old periodic task is taken back, enabled
    assert "tick-1s" in back.created and job_row("tick-1s").periodic_task_id == task_id
    assert PeriodicTask.objects.get(id=task_id).enabled


def test_a_schedule_that_cannot_drive_a_job_is_refused_and_the_old_one_kept(admin_client, caplog):
    schedule_sync.sync(NOW)
    task = job_row("tick-2s").periodic_task
    micro = IntervalSchedule.objects.create(every=5, period=IntervalSchedule.MICROSECONDS)
    PeriodicTask.objects.filter(id=task.id).update(interval=micro)
    schedule_sync.apply_edits(NOW)
    assert job_row("tick-2s").schedule == "every 2s"
    assert "cannot drive it" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_sync_cron_schedules_command_reports_what_it_did():
    first = manage("sync_cron_schedules")
    assert first.returncode == 0, first.stderr
    assert "created: nightly-report" in first.stdout and "Schedules synced:" in first.stdout
    second = manage("sync_cron_schedules")
    assert "0 created, 0 updated from code" in second.stdout
    assert PeriodicTask.objects.filter(name__startswith="nightly-report").count() == 1
