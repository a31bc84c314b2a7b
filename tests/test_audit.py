"""The audit log of schedule changes: one row per job per change, with its author, whatever made
it — the admin's forms and actions, a deploy, the beat, the ORM, raw SQL from another connection —
its endpoint, its admin pages, its retention, and the code's schedule shown beside an admin edit.
Real PostgreSQL; every test commits (the author is transaction-local, as in production). The
browser's view of it is tests/browser/test_audit_browser.py."""

from __future__ import annotations

import csv
import datetime as dt
import io
import re
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.db import connection, transaction
from django.test import override_settings
from django_celery_beat.models import CrontabSchedule, IntervalSchedule, PeriodicTask

from cron_celery import checks
from cron_celery.beat import overrides, schedule_problems, schedule_sync
from cron_celery.decisions import audit, dispatch
from cron_celery.declaring import registry
from cron_celery.models import CronJob, ScheduleChange
from cron_celery.reconciler import retention
from cron_celery.schedules import every
from tests.admin_forms import submit

pytestmark = pytest.mark.django_db(transaction=True)

T0 = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)
MINUTE = dt.timedelta(minutes=1)
DASHBOARD = "/admin/cron_celery/cronjob/"
CHANGES = "/admin/cron_celery/schedulechange/"
AUDITOR = "auditor-token-0123456789-abcdefghijklm"
READER = "reader-token-0123456789-abcdefghijklmn"
TOKENS = {"auditors": {"token": AUDITOR, "scopes": ["audit"]}, "prometheus": {"token": READER, "scopes": ["read"]}}


def cron_settings(**values: Any) -> override_settings:
    return override_settings(CRON_CELERY={**settings.CRON_CELERY, **values})


def job_row(name: str) -> CronJob:
    return CronJob.objects.select_related("periodic_task__crontab").get(name=name)


def changes_of(job: CronJob, *, after: int = 0) -> list[ScheduleChange]:
    """The job's rows, oldest first, after the row id ``after``."""
    return list(ScheduleChange.objects.filter(job_id=job.id, id__gt=after).order_by("id"))


def last_id() -> int:
    return ScheduleChange.objects.order_by("-id").values_list("id", flat=True).first() or 0


def synced(declare: Any, name: str = "audited", code: str = "AU1", **options: Any) -> CronJob:
    """A job declared with a schedule (every day at 03:00 UTC unless told), synced."""
    declare(name, code, **{"schedule": "0 3 * * *", "timezone": "UTC", **options})
    schedule_sync.sync(T0)
    return job_row(name)


def other_connection(application_name: str) -> psycopg.Connection[Any]:
    """A connection of its own to the test database, as psql or another service would open."""
    options = connection.settings_dict
    return psycopg.connect(host=options["HOST"], port=options["PORT"], user=options["USER"],
                           password=options["PASSWORD"] or None, dbname=options["NAME"],
                           application_name=application_name, autocommit=True)


# --- one row per change, with its author ---------------------------------------------------------

def test_a_deploy_records_the_schedule_it_links_and_a_changed_declaration_from_the_command(declare):
    job = synced(declare, overlap="allow")
    (linked,) = changes_of(job)
    assert (linked.source, linked.actor) == (audit.DEPLOY_SYNC, "")
    assert linked.db_role == connection.settings_dict["USER"]
    assert linked.changes["schedule"] == [None, "0 3 * * *"] and linked.changes["enabled"] == [None, True]
    assert linked.changes["periodic_task"] == [None, "audited (AU1)"] and (linked.job_name, linked.job_code) == (
        "audited", "AU1")
    schedule_sync.sync(T0)  # nothing changed: nothing recorded
    assert changes_of(job, after=linked.id) == []

    registry.unregister("audited")
    declare("audited", "AU1", schedule="30 3 * * *", timezone="UTC", overlap="allow", max_concurrency=2)
    call_command("sync_cron_schedules", stdout=io.StringIO())
    declared, rewritten = changes_of(job, after=linked.id)
    assert (declared.source, declared.changes) == (audit.DECLARED, {"max_concurrency": [None, 2]})
    assert (rewritten.source, rewritten.changes) == (audit.DEPLOY_COMMAND, {"schedule": ["0 3 * * *", "30 3 * * *"]})
    schedule_sync.apply_edits(T0)  # the beat takes the new schedule in: a copy, not a change
    assert len(changes_of(job, after=linked.id)) == 2


def test_the_jobs_pause_action_is_one_row_by_the_admin_user_not_two(declare, admin_client):
    job = synced(declare)
    before = last_id()
    response = admin_client.post(DASHBOARD, {"action": "pause", "apply": "1", "_selected_action": [job.id]})
    assert response.status_code == 302
    assert job_row("audited").paused  # the periodic task's trigger paused the job...
    schedule_sync.apply_edits(T0)  # ...and the beat copies the task's state onto the job row
    (paused,) = changes_of(job, after=before)  # one row: at the task, not again at the job
    assert (paused.actor, paused.source, paused.changes) == ("admin", "admin: pause action", {"enabled": [True, False]})
    admin_client.post(DASHBOARD, {"action": "resume", "_selected_action": [job.id]})
    schedule_sync.apply_edits(T0)
    (resumed,) = changes_of(job, after=paused.id)
    assert (resumed.actor, resumed.source, resumed.changes) == ("admin", "admin: resume action",
                                                                {"enabled": [False, True]})


def test_pausing_a_job_without_a_periodic_task_is_recorded_at_the_job(admin_client):
    from cron_celery.decisions import jobs

    job_id = jobs.job_id(registry.get("calc-commission"))  # declared without a schedule of its own
    admin_client.post(DASHBOARD, {"action": "pause", "apply": "1", "_selected_action": [job_id]})
    (paused,) = ScheduleChange.objects.filter(job_id=job_id)
    assert (paused.actor, paused.source, paused.changes) == ("admin", "admin: pause action", {"paused": [False, True]})


def test_django_celery_beats_bulk_disable_is_a_row_per_job_with_the_admin_user(declare, admin_client):
    first = synced(declare)
    second = synced(declare, "audited-too", "AU2", schedule=every(seconds=30))
    before = last_id()
    response = admin_client.post("/admin/django_celery_beat/periodictask/", {
        "action": "disable_tasks", "_selected_action": [first.periodic_task_id, second.periodic_task_id]})
    assert response.status_code == 302
    schedule_sync.apply_edits(T0)
    rows = list(ScheduleChange.objects.filter(id__gt=before).order_by("job_name"))
    assert [(row.job_name, row.actor, row.source, row.changes) for row in rows] == [
        ("audited", "admin", "admin: disable_tasks action", {"enabled": [True, False]}),
        ("audited-too", "admin", "admin: disable_tasks action", {"enabled": [True, False]})]


def test_deleting_a_jobs_periodic_task_in_the_admin_records_the_unlinked_schedule(declare, admin_client):
    job = synced(declare)
    second = synced(declare, "audited-too", "AU2")
    before = last_id()
    page = f"/admin/django_celery_beat/periodictask/{job.periodic_task_id}/delete/"
    assert admin_client.post(page, {"post": "yes"}).status_code == 302
    assert admin_client.post("/admin/django_celery_beat/periodictask/", {
        "action": "delete_selected", "post": "yes", "_selected_action": [second.periodic_task_id]}).status_code == 302
    rows = list(ScheduleChange.objects.filter(id__gt=before).order_by("job_name"))
    assert [(row.job_name, row.actor, row.source) for row in rows] == [
        ("audited", "admin", audit.ADMIN_DELETE), ("audited-too", "admin", audit.ADMIN_DELETE)]
    assert rows[0].changes["schedule"] == ["0 3 * * *", None]
    assert rows[0].changes["periodic_task"] == ["audited (AU1)", None]


def test_raw_sql_from_another_connection_records_the_role_and_the_application_name(declare):
    job = synced(declare)
    before = last_id()
    with other_connection("ops-console") as other:
        other.execute("UPDATE django_celery_beat_periodictask SET enabled = false WHERE id = %s",
                      [job.periodic_task_id])
        other.execute("UPDATE cron_celery_cronjob SET max_concurrency = 3, concurrency_group = 'warehouse'"
                      " WHERE id = %s", [job.id])
    disabled, limited = changes_of(job, after=before)
    for row in (disabled, limited):
        assert (row.actor, row.db_role, row.application_name, row.source) == (
            "", connection.settings_dict["USER"], "ops-console", audit.DATABASE)
        assert audit.who(row) == f"{connection.settings_dict['USER']} (ops-console)"
    assert disabled.changes == {"enabled": [True, False]}  # the job's paused, copied by a trigger, is no row
    assert limited.changes == {"max_concurrency": [1, 3], "concurrency_group": ["", "warehouse"]}
    assert job_row("audited").paused


def test_an_orm_edit_records_each_attribute_as_people_read_it_in_one_row(declare):
    job = synced(declare)
    before = last_id()
    task = PeriodicTask.objects.get(id=job.periodic_task_id)
    task.crontab = None
    task.interval = IntervalSchedule.objects.create(every=5, period=IntervalSchedule.MINUTES)
    task.kwargs = '{"region": "eu", "dry_run": false}'
    task.start_time = dt.datetime(2026, 12, 1, 8, 30, tzinfo=dt.UTC)
    task.expires = dt.datetime(2026, 12, 24, 18, 0, 0, 500000, tzinfo=dt.UTC)
    task.one_off = True
    task.save()  # one statement: one row
    (edit,) = changes_of(job, after=before)
    assert edit.changes == {
        "schedule": ["0 3 * * *", "every 300s"], "kwargs": [{}, {"region": "eu", "dry_run": False}],
        "active_from": [None, "2026-12-01T08:30:00Z"], "active_until": [None, "2026-12-24T18:00:00.5Z"],
        "one_off": [False, True]}
    assert (edit.source, edit.actor) == (audit.DATABASE, "")
    assert audit.one_line(edit.changes).startswith("schedule: 0 3 * * * → every 300s; kwargs: {} → ")
    # Parameters written again with other spacing are the same parameters: no row.
    PeriodicTask.objects.filter(id=task.id).update(kwargs='{ "dry_run" : false, "region" : "eu" }')
    assert changes_of(job, after=edit.id) == []


def test_a_deploy_that_changes_a_timezone_records_it_once_where_it_lives(declare):
    cron = synced(declare)
    interval = synced(declare, "audited-too", "AU2", schedule=every(seconds=30))
    before = last_id()
    for name, code, schedule in (("audited", "AU1", "0 3 * * *"), ("audited-too", "AU2", every(seconds=30))):
        registry.unregister(name)
        declare(name, code, schedule=schedule, timezone="Europe/Amsterdam")
    call_command("sync_cron_schedules", stdout=io.StringIO())
    schedule_sync.apply_edits(T0)
    # The cron job's timezone is its crontab's: the deploy points its task at another crontab.
    (moved,) = changes_of(cron, after=before)
    assert (moved.source, moved.changes) == (audit.DEPLOY_COMMAND, {"timezone": ["UTC", "Europe/Amsterdam"]})
    # An interval carries none: the job row's declared timezone is where it changes.
    (declared,) = changes_of(interval, after=before)
    assert (declared.source, declared.changes) == (audit.DECLARED, {"timezone": ["UTC", "Europe/Amsterdam"]})


def test_solar_and_clocked_schedules_are_recorded_as_what_they_are(declare):
    from django_celery_beat.models import ClockedSchedule, SolarSchedule

    job = synced(declare)
    before = last_id()
    solar = SolarSchedule.objects.create(event="sunset", latitude="52.370000", longitude="4.890000")
    PeriodicTask.objects.filter(id=job.periodic_task_id).update(crontab=None, solar=solar)
    SolarSchedule.objects.filter(id=solar.id).update(event="sunrise")
    clocked = ClockedSchedule.objects.create(clocked_time=dt.datetime(2026, 12, 24, 18, tzinfo=dt.UTC))
    PeriodicTask.objects.filter(id=job.periodic_task_id).update(solar=None, clocked=clocked)
    ClockedSchedule.objects.filter(id=clocked.id).update(clocked_time=dt.datetime(2026, 12, 25, 9, tzinfo=dt.UTC))
    assert [row.changes["schedule"] for row in changes_of(job, after=before)] == [
        ["0 3 * * *", "solar sunset at 52.37, 4.89"], ["solar sunset at 52.37, 4.89", "solar sunrise at 52.37, 4.89"],
        ["solar sunrise at 52.37, 4.89", "clocked at 2026-12-24T18:00:00Z"],
        ["clocked at 2026-12-24T18:00:00Z", "clocked at 2026-12-25T09:00:00Z"]]


def test_a_crontab_shared_by_two_jobs_edited_in_place_is_one_row_per_job(declare, admin_client):
    first = synced(declare)
    second = synced(declare, "audited-too", "AU2")
    assert first.periodic_task.crontab_id == second.periodic_task.crontab_id  # one row, both jobs
    before = last_id()
    crontab = CrontabSchedule.objects.get(id=first.periodic_task.crontab_id)
    response = submit(admin_client, f"/admin/django_celery_beat/crontabschedule/{crontab.id}/change/",
                      {"hour": "4", "timezone": "Europe/Amsterdam"})
    assert response.status_code == 302, response.content[:2000]
    schedule_sync.apply_edits(T0)
    rows = list(ScheduleChange.objects.filter(id__gt=before).order_by("job_name"))
    expected = {"schedule": ["0 3 * * *", "0 4 * * *"], "timezone": ["UTC", "Europe/Amsterdam"]}
    assert [(row.job_name, row.actor, row.source, row.changes) for row in rows] == [
        ("audited", "admin", audit.ADMIN_FORM, expected), ("audited-too", "admin", audit.ADMIN_FORM, expected)]


def test_an_unchanged_save_of_the_admin_forms_records_nothing(declare, admin_client):
    job = synced(declare)
    before = last_id()
    task_page = f"/admin/django_celery_beat/periodictask/{job.periodic_task_id}/change/"
    assert submit(admin_client, task_page, {}).status_code == 302
    crontab_page = f"/admin/django_celery_beat/crontabschedule/{job.periodic_task.crontab_id}/change/"
    assert submit(admin_client, crontab_page, {}).status_code == 302
    assert ScheduleChange.objects.filter(id__gt=before).count() == 0
    # The same form with one change: one row, by the user, from the form.
    assert submit(admin_client, task_page, {"enabled": None}).status_code == 302
    (edit,) = changes_of(job, after=before)
    assert (edit.actor, edit.source, edit.changes) == ("admin", audit.ADMIN_FORM, {"enabled": [True, False]})


def test_the_beat_disabling_a_one_off_task_is_recorded_from_the_beat(declare):
    from cron_celery import beat

    job = synced(declare, schedule=every(minutes=1))
    PeriodicTask.objects.filter(id=job.periodic_task_id).update(one_off=True)
    schedule_sync.apply_edits(T0)
    before = last_id()
    (due,) = [item for item in dispatch.due_jobs(T0 + 2 * MINUTE) if item.job_id == job.id]
    decision = beat.plan(due, T0 + dt.timedelta(minutes=2, seconds=1), {}, {})
    assert decision is not None and decision.last
    dispatch.dispatch_many([decision])
    (disabled,) = changes_of(job, after=before)
    assert (disabled.source, disabled.changes) == (audit.BEAT_ONE_OFF, {"enabled": [True, False]})
    assert job_row("audited").paused


def test_a_pause_by_the_system_is_recorded_and_so_is_the_edit_that_lifts_it(declare):
    job = synced(declare)
    before = last_id()
    schedule_problems.set_aside({job.id: "Invalid schedule: it never fires"})
    (set_aside,) = changes_of(job, after=before)
    assert (set_aside.source, set_aside.changes) == (audit.SCHEDULE_PROBLEM, {"paused": [False, True]})
    # An edit of the task (still enabled) makes its trigger set paused = NOT enabled: the edit's row
    # says the job resumed, as the audit trigger fires before that one.
    other = CrontabSchedule.objects.create(minute="15", hour="3", timezone="UTC")
    PeriodicTask.objects.filter(id=job.periodic_task_id).update(crontab=other)
    (edit,) = changes_of(job, after=set_aside.id)
    assert edit.changes == {"schedule": ["0 3 * * *", "15 3 * * *"], "paused": [True, False]}
    assert not job_row("audited").paused


def test_the_author_is_transaction_local(declare):
    job = synced(declare)
    before = last_id()
    with transaction.atomic():
        audit.set_author(actor="alice", source="runbook 42")
        PeriodicTask.objects.filter(id=job.periodic_task_id).update(kwargs='{"a": 1}')
    PeriodicTask.objects.filter(id=job.periodic_task_id).update(kwargs='{"a": 2}')  # the next transaction
    by_alice, after = changes_of(job, after=before)
    assert (by_alice.actor, by_alice.source) == ("alice", "runbook 42")
    assert (after.actor, after.source) == ("", audit.DATABASE)
    with pytest.raises(RuntimeError, match=r"inside transaction\.atomic\(\)"):
        audit.set_author(actor="bob", source="nowhere")
    with pytest.raises(ZeroDivisionError), transaction.atomic():  # a change rolled back is no change
        audit.set_author(actor="carol", source="a mistake")
        PeriodicTask.objects.filter(id=job.periodic_task_id).update(kwargs='{"a": 3}')
        raise ZeroDivisionError
    assert changes_of(job, after=after.id) == []


def test_a_deleted_job_keeps_its_changes_with_its_name(declare):
    job = synced(declare)
    kept = changes_of(job)
    assert kept
    with connection.cursor() as cursor:  # raw SQL, past the ORM: the database's own ON DELETE SET NULL
        cursor.execute("DELETE FROM cron_celery_cronjob WHERE id = %s", [job.id])
    row = ScheduleChange.objects.get(id=kept[0].id)
    assert (row.job_id, row.job_name, row.job_code) == (None, "audited", "AU1")
    found = audit.page(job="AU1")
    assert [change.id for change in found.changes] == [row.id]


# --- the endpoint ------------------------------------------------------------------------------

def test_the_audit_endpoint_needs_the_audit_scope(client, declare):
    synced(declare)
    with cron_settings(API_TOKENS=TOKENS):
        refused = client.get("/cron/audit/", headers={"Authorization": f"Bearer {READER}"})
        answered = client.get("/cron/audit/", headers={"Authorization": f"Bearer {AUDITOR}"})
        not_read = client.get("/cron/status/", headers={"Authorization": f"Bearer {AUDITOR}"})
        anonymous = client.get("/cron/audit/")
    assert refused.status_code == 403
    assert refused.json() == {"error": "the token lacks the scope 'audit'", "missing_scope": "audit"}
    assert answered.status_code == 200 and not_read.status_code == 403 and anonymous.status_code == 401
    assert any(change["job"] == "audited" for change in answered.json()["changes"])


def test_a_staff_session_needs_the_permission_to_view_schedule_changes(client, django_user_model, declare):
    synced(declare)
    staff = django_user_model.objects.create_user("viewer", password="pw-not-used", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(content_type__app_label="cron_celery",
                                                      codename="view_cronexecution"))
    client.force_login(staff)
    refused = client.get("/cron/audit/")
    assert refused.status_code == 403 and refused.json()["missing_permission"] == "cron_celery.view_schedulechange"
    staff.user_permissions.add(Permission.objects.get(content_type__app_label="cron_celery",
                                                      codename="view_schedulechange"))
    client.force_login(django_user_model.objects.get(id=staff.id))
    assert client.get("/cron/audit/").status_code == 200


def test_the_audit_endpoint_filters_by_job_and_time_and_pages_newest_first(admin_client, declare):
    job = synced(declare)
    synced(declare, "audited-too", "AU2")
    for value in range(3):
        PeriodicTask.objects.filter(id=job.periodic_task_id).update(kwargs=f'{{"n": {value}}}')
    mine = [row.id for row in reversed(changes_of(job))]  # newest first: 3 edits, then the link
    first = admin_client.get("/cron/audit/", {"job": "audited", "limit": 2}).json()
    assert [change["id"] for change in first["changes"]] == mine[:2]
    assert first["changes"][0]["changes"] == {"kwargs": [{"n": 1}, {"n": 2}]}
    assert first["changes"][0]["code"] == "AU1" and first["changes"][0]["source"] == audit.DATABASE
    rest = admin_client.get(first["next"]).json()
    assert [change["id"] for change in rest["changes"]] == mine[2:] and rest["next"] is None
    assert [change["id"] for change in admin_client.get("/cron/audit/", {"job": "AU1"}).json()["changes"]] == mine
    later = admin_client.get("/cron/audit/", {"since": "2999-01-01"}).json()
    assert later == {"changes": [], "next": None}
    since = admin_client.get("/cron/audit/", {"job": "audited", "since": "2020-01-01T00:00:00+01:00"}).json()
    assert [change["id"] for change in since["changes"]] == mine
    assert admin_client.get("/cron/audit/", {"job": "nobody"}).status_code == 404
    CronJob.objects.filter(id=job.id).update(name="renamed")  # its rows keep the name they had
    renamed = admin_client.get("/cron/audit/", {"job": "renamed"}).json()["changes"]
    assert [change["id"] for change in renamed] == mine and {change["job"] for change in renamed} == {"audited"}
    for bad in ({"since": "yesterday"}, {"limit": "0"}, {"before": "-3"}):
        answer = admin_client.get("/cron/audit/", bad)
        assert answer.status_code == 400 and next(iter(bad)) in answer.json()["error"]


# --- retention ---------------------------------------------------------------------------------

def test_old_schedule_changes_are_deleted_by_the_hourly_tidy_in_batches_oldest_first(declare):
    job = synced(declare)
    for value in range(3):
        PeriodicTask.objects.filter(id=job.periodic_task_id).update(kwargs=f'{{"n": {value}}}')
    rows = [row.id for row in changes_of(job)]
    with connection.cursor() as cursor:
        for age, row_id in zip((900, 800, 731), rows[:3], strict=True):
            cursor.execute("UPDATE cron_celery_schedulechange SET changed_at = now() - make_interval(days => %s)"
                           " WHERE id = %s", [age, row_id])
    with cron_settings(AUDIT_RETENTION_DAYS=None):
        assert retention.tidy(batch=10).schedule_changes == 0
    assert retention.tidy(batch=2).schedule_changes == 2  # the default keeps 730 days
    assert [row.id for row in changes_of(job)] == rows[2:]
    with cron_settings(AUDIT_RETENTION_DAYS=732):
        assert retention.tidy(batch=10).schedule_changes == 0
    assert retention.tidy(batch=10).schedule_changes == 1
    assert [row.id for row in changes_of(job)] == rows[3:]


def test_a_bad_audit_retention_is_a_check_error():
    with cron_settings(AUDIT_RETENTION_DAYS=0):
        found = [message for message in checks.check_operations() if "AUDIT_RETENTION_DAYS" in message.msg]
    assert [message.id for message in found] == ["cron_celery.E013"]
    assert "whole number of days (1 or more) or None, not 0" in found[0].msg
    with cron_settings(AUDIT_RETENTION_DAYS=None):
        assert not [message for message in checks.check_operations() if "AUDIT" in message.msg]


# --- the admin ---------------------------------------------------------------------------------

def test_the_code_schedule_is_shown_beside_an_admin_edit_with_the_deploy_warning(admin_client):
    schedule_sync.sync(T0)
    job = job_row("nightly-report")
    assert overrides.compare(job) is None  # the code's schedule is in effect: nothing to say
    page = admin_client.get(f"{DASHBOARD}{job.id}/change/").content.decode()
    assert "declared in code" not in page and "Latest runs and schedule changes" in page
    other = CrontabSchedule.objects.create(minute="30", hour="4", timezone="Europe/Amsterdam")
    PeriodicTask.objects.filter(id=job.periodic_task_id).update(crontab=other)
    schedule_sync.apply_edits(T0)
    found = overrides.compare(job_row("nightly-report"))
    assert found is not None and (found.declared_text(), found.in_effect) == ("0 2 * * * (Europe/Amsterdam)",
                                                                             "30 4 * * *")
    assert not found.replaced_at_next_sync and found.warning == overrides.WARNING
    page = admin_client.get(f"{DASHBOARD}{job.id}/change/").content.decode()
    assert "declared in code: <code>0 2 * * * (Europe/Amsterdam)</code>" in page
    assert "replaces this admin edit with the code" in page and "declaration hash" in page
    assert "30 4 * * *" in page and "0 2 * * *" in page  # the change, before → after
    dashboard = admin_client.get(DASHBOARD).content.decode()
    assert 'declared in code: <code style="white-space:nowrap">0 2 * * *</code><br><span' in dashboard  # same zone
    task_page = admin_client.get(f"/admin/django_celery_beat/periodictask/{job.periodic_task_id}/change/")
    assert "declared in code: <code>0 2 * * * (Europe/Amsterdam)</code>" in task_page.content.decode()
    # A deploy that changes the declaration: this process already runs it; the next sync replaces the edit.
    CronJob.objects.filter(id=job.id).update(declaration_hash="an older declaration")
    pending = overrides.compare(job_row("nightly-report"))
    assert pending is not None and pending.replaced_at_next_sync and pending.warning == overrides.PENDING
    schedule_sync.sync(T0)
    assert overrides.compare(job_row("nightly-report")) is None  # the code's schedule is back in effect


def test_the_audit_log_lists_filters_and_exports_the_changes(admin_client, declare):
    job = synced(declare)
    synced(declare, "audited-too", "AU2")
    PeriodicTask.objects.filter(id=job.periodic_task_id).update(kwargs='{"formula": "=1+1"}')
    listing = admin_client.get(CHANGES, {"job": job.id}).content.decode()
    assert "audited" in listing and "AU2" not in listing and "formula" in listing
    ids = list(ScheduleChange.objects.filter(job_id=job.id).values_list("id", flat=True))
    exported = admin_client.post(CHANGES, {"action": "export_csv", "_selected_action": ids})
    rows = list(csv.reader(io.StringIO(b"".join(exported.streaming_content).decode())))
    assert rows[0] == list(admin_module().csv_export.SCHEDULE_CHANGE_CSV) and len(rows) == 1 + len(ids)
    assert any('"formula": "=1+1"' in row[-1] for row in rows[1:])
    change = ScheduleChange.objects.filter(job_id=job.id).first()
    assert change is not None
    detail = admin_client.get(f"{CHANGES}{change.id}/change/")
    assert detail.status_code == 200 and "formula" in detail.content.decode()
    assert admin_client.post(f"{CHANGES}{change.id}/delete/", {"post": "yes"}).status_code == 403
    assert ScheduleChange.objects.filter(id=change.id).exists()


def admin_module() -> Any:
    from cron_celery import admin

    return admin


def test_the_jobs_page_shows_its_changes_only_to_who_may_view_the_audit_log(client, django_user_model):
    schedule_sync.sync(T0)
    job = job_row("nightly-report")
    viewer = django_user_model.objects.create_user("viewer", password="pw-not-used", is_staff=True)
    viewer.user_permissions.add(*Permission.objects.filter(content_type__app_label="cron_celery",
                                                           codename__in=["view_cronjob", "view_cronexecution"]))
    client.force_login(viewer)
    page = client.get(f"{DASHBOARD}{job.id}/change/").content.decode()
    assert "No runs yet" in page and "cron-job-changes" not in page and "Latest runs and schedule" not in page
    assert client.get(CHANGES).status_code == 403
    viewer.user_permissions.add(Permission.objects.get(content_type__app_label="cron_celery",
                                                       codename="view_schedulechange"))
    client.force_login(django_user_model.objects.get(id=viewer.id))
    page = client.get(f"{DASHBOARD}{job.id}/change/").content.decode()
    assert "No runs yet" in page and "cron-job-changes" in page
    assert client.get(CHANGES).status_code == 200



def who_cells(html: str) -> list[str]:
    """The text of each "who" cell of the audit log's list, top to bottom."""
    cells = re.findall(r'<td class="field-who">(.*?)</td>', html, re.S)
    return [" ".join(re.sub(r"<[^>]+>", " ", cell).split()) for cell in cells]


def test_a_name_any_session_can_claim_is_shown_with_the_database_role_that_made_the_change(admin_client, declare):
    job = synced(declare)
    before = last_id()
    role = connection.settings_dict["USER"]
    with other_connection("ops-console") as other, other.transaction():  # not the admin: it only says so
        other.execute("SELECT set_config('cron_celery.actor', 'admin', true), "
                      "set_config('cron_celery.source', 'admin: change form', true)")
        other.execute("UPDATE django_celery_beat_periodictask SET enabled = false WHERE id = %s",
                      [job.periodic_task_id])
    (claimed,) = changes_of(job, after=before)
    assert (claimed.actor, claimed.db_role, claimed.application_name) == ("admin", role, "ops-console")
    listing = admin_client.get(CHANGES, {"job": job.id}).content.decode()
    assert who_cells(listing)[0] == f"admin database role: {role} (ops-console)"
    page = admin_client.get(f"{DASHBOARD}{job.id}/change/").content.decode()
    assert f"database role: {role} (ops-console)" in page.split('class="cron-job-changes"', 1)[1]
    assert audit.as_dict(claimed)["db_role"] == role  # the endpoint and the CSV carry it already
