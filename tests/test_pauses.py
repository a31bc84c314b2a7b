"""A pause with a note and an end: the admin's Pause form, what every view shows of it, the end
refused when it is not ahead, the note cleared by any resume, and the end that resumes the job by
itself (``pauses.end_due``), by the database's clock. Real PostgreSQL; every test commits (the audit
log's author is transaction-local, as in production). The real processes' side (a beat, a worker,
the reconciler alone) is tests/faults/test_pause_ends.py."""

from __future__ import annotations

import datetime as dt
import json
import zoneinfo
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.db.models import F
from django_celery_beat.models import PeriodicTask

from cron_celery.beat import schedule_sync
from cron_celery.decisions import dispatch, leadership, pauses
from cron_celery.models import CronExecution, CronJob, ScheduleChange, Status

pytestmark = pytest.mark.django_db(transaction=True)

T0 = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)
DASHBOARD = "/admin/cron_celery/cronjob/"
NOTE = "warehouse migration"


@pytest.fixture
def job(declare: Any) -> CronJob:
    declare("paused-report", "PZ1", schedule="0 3 * * *", timezone="Europe/Amsterdam")
    schedule_sync.sync(T0)
    return CronJob.objects.get(code="PZ1")


def pause(admin_client: Any, job: CronJob, *, note: str = NOTE, until: str = "") -> str:
    response = admin_client.post(DASHBOARD, {"action": "pause", "apply": "1", "_selected_action": [job.id],
                                             "note": note, "until": until}, follow=True)
    assert response.status_code == 200
    return str(response.content.decode())


def row(job: CronJob) -> CronJob:
    return CronJob.objects.get(id=job.id)


def ahead(seconds: float) -> dt.datetime:
    return leadership.database_now() + dt.timedelta(seconds=seconds)


def test_the_pause_form_asks_for_a_note_and_an_end(admin_client: Any, job: CronJob) -> None:
    response = admin_client.post(DASHBOARD, {"action": "pause", "_selected_action": [job.id]})
    page = response.content.decode()
    assert response.status_code == 200 and 'name="note"' in page and 'name="until"' in page
    assert row(job).paused is False, "the form is asked for before anything is paused"


def test_a_pause_with_a_note_and_an_end_is_shown_everywhere_and_audited(admin_client: Any, job: CronJob) -> None:
    end = ahead(3600).replace(microsecond=0)
    before = ScheduleChange.objects.order_by("-id").values_list("id", flat=True).first() or 0
    said = pause(admin_client, job, until=end.isoformat())
    assert "1 job(s) paused." in said
    paused = row(job)
    assert (paused.paused, paused.pause_note, paused.paused_by, paused.paused_until) == (True, NOTE, "admin", end)
    assert paused.paused_at is not None and paused.paused_at <= leadership.database_now()
    assert PeriodicTask.objects.get(id=job.periodic_task_id).enabled is False
    # The audit log: the switch (the periodic task's enabled), and what was said of the pause.
    changes = [(c.actor, c.source, c.changes) for c in ScheduleChange.objects.filter(job_id=job.id, id__gt=before)
               .order_by("id")]
    stamp = end.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert changes == [("admin", "admin: pause action", {"enabled": [True, False]}),
                       ("admin", "admin: pause action", {"pause_note": ["", NOTE], "paused_until": [None, stamp]})]
    # The dashboard's status cell, the job's page, the API, list_cron_tasks.
    dashboard = admin_client.get(DASHBOARD).content.decode()
    assert "until" in dashboard and NOTE in dashboard and "by admin" in dashboard
    page = admin_client.get(f"{DASHBOARD}{job.id}/change/").content.decode()
    assert NOTE in page and "Paused until" in page
    status = admin_client.get("/cron/status/").json()
    (summary,) = [item for item in status["jobs"] if item["code"] == "PZ1"]
    assert summary["paused"] is True
    assert summary["pause"] == {"note": NOTE, "by": "admin", "since": paused.paused_at.isoformat(),
                                "until": end.isoformat()}
    out = StringIO()
    call_command("list_cron_tasks", stdout=out)
    (line,) = [text for text in out.getvalue().splitlines() if " PZ1 " in text]
    assert f"paused until {end.astimezone(dt.UTC):%Y-%m-%d %H:%M}Z ({NOTE})" in line


def test_an_end_typed_without_an_offset_is_read_in_the_jobs_timezone(admin_client: Any, job: CronJob) -> None:
    local = (leadership.database_now() + dt.timedelta(days=2)).astimezone(
        zoneinfo.ZoneInfo("Europe/Amsterdam")).replace(hour=8, minute=0, second=0, microsecond=0)
    pause(admin_client, job, until=local.strftime("%Y-%m-%d %H:%M"))
    assert row(job).paused_until == local


@pytest.mark.parametrize("until", ["past", "now", "garbage"])
def test_an_end_that_is_not_ahead_or_not_a_time_is_refused_and_nothing_is_paused(
        admin_client: Any, job: CronJob, until: str) -> None:
    text = {"past": (leadership.database_now() - dt.timedelta(minutes=5)).isoformat(),
            "now": leadership.database_now().isoformat(), "garbage": "next tuesday"}[until]
    said = pause(admin_client, job, until=text)
    assert "paused-report" in said and ("is not after now" in said or "ISO-8601" in said), said
    assert "job(s) paused" not in said
    kept = row(job)
    assert (kept.paused, kept.pause_note, kept.paused_until) == (False, "", None), "a refused pause changed the job"
    assert PeriodicTask.objects.get(id=job.periodic_task_id).enabled is True


def test_say_refuses_an_end_not_ahead_of_the_database_clock(job: CronJob) -> None:
    from cron_celery import exceptions

    PeriodicTask.objects.filter(id=job.periodic_task_id).update(enabled=False)
    with pytest.raises(exceptions.PauseRefused, match="is not after now"):
        pauses.say(job.id, note=NOTE, until=leadership.database_now() - dt.timedelta(seconds=1), by="ops")
    PeriodicTask.objects.filter(id=job.periodic_task_id).update(enabled=True)
    with pytest.raises(exceptions.PauseRefused, match="it is not paused"):
        pauses.say(job.id, note=NOTE, until=None, by="ops")


@pytest.mark.parametrize("how", ["admin resume", "periodic task enabled", "row unpaused"])
def test_any_resume_clears_what_was_said_of_the_pause(admin_client: Any, job: CronJob, how: str) -> None:
    pause(admin_client, job, until=ahead(3600).isoformat())
    assert row(job).pause_note == NOTE
    if how == "admin resume":
        admin_client.post(DASHBOARD, {"action": "resume", "_selected_action": [job.id]})
    elif how == "periodic task enabled":
        task = PeriodicTask.objects.get(id=job.periodic_task_id)
        task.enabled = True
        task.save()
    else:  # a job without a periodic task is paused on its row
        CronJob.objects.filter(id=job.id).update(periodic_task=None)
        CronJob.objects.filter(id=job.id).update(paused=False)
    resumed = row(job)
    assert (resumed.paused, resumed.pause_note, resumed.paused_by, resumed.paused_at, resumed.paused_until) == (
        False, "", "", None, None)


def test_a_pause_ends_by_itself_once_its_end_passes_by_the_database_clock(admin_client: Any, job: CronJob,
                                                                         declare: Any) -> None:
    declare("paused-forever", "PZ2", schedule="0 4 * * *", timezone="UTC")
    schedule_sync.sync(T0)
    other = CronJob.objects.get(code="PZ2")
    pause(admin_client, other, note="until somebody says")  # no end: only a person resumes it
    pause(admin_client, job, until=ahead(3600).isoformat())
    assert pauses.end_due() == [], "an end an hour ahead has not passed"
    # The end passes (moved back by SQL rather than waiting an hour).
    CronJob.objects.filter(id=job.id).update(paused_until=leadership.database_now() - dt.timedelta(seconds=1))
    next_at, _edited, now = dispatch.next_due()
    assert next_at is not None and next_at <= now, "the beat's idle tick sees the pause end as due"
    before = ScheduleChange.objects.order_by("-id").values_list("id", flat=True).first() or 0
    assert pauses.end_due() == [job.id]
    assert pauses.end_due() == [], "resumed once"
    resumed = row(job)
    assert (resumed.paused, resumed.pause_note, resumed.paused_until) == (False, "", None)
    assert PeriodicTask.objects.get(id=job.periodic_task_id).enabled is True
    changes = [(c.actor, c.source, c.changes) for c in ScheduleChange.objects.filter(job_id=job.id, id__gt=before)
               .order_by("id")]
    assert changes[0] == ("", pauses.PAUSE_ENDED, {"enabled": [False, True]})
    assert changes[1][1] == pauses.PAUSE_ENDED and changes[1][2]["pause_note"] == [NOTE, ""]
    assert row(other).paused and row(other).pause_note == "until somebody says", "a pause without an end stays"
    schedule_sync.apply_edits(leadership.database_now())  # the beat takes the resume in: a next slot again
    assert row(job).next_run_at is not None


def test_a_pause_whose_job_stays_paused_for_another_reason_loses_only_its_end(admin_client: Any,
                                                                              job: CronJob) -> None:
    """A job paused by a schedule that cannot drive it (its periodic task still enabled) keeps that
    pause when an end written on it passes: the end goes, so the beat does not look at it again."""
    pause(admin_client, job, until=ahead(3600).isoformat())
    PeriodicTask.objects.filter(id=job.periodic_task_id).update(enabled=True)  # by SQL: no trigger sees it
    with connection.cursor() as cursor:  # as schedule_problems.set_aside pauses it, with the end written anyway
        cursor.execute("UPDATE cron_celery_cronjob SET paused = true, pause_note = %s, paused_until = now()"
                       " - interval '1 second' WHERE id = %s", [NOTE, job.id])
    assert pauses.end_due() == []
    kept = row(job)
    assert kept.paused is True and kept.paused_until is None
    assert not CronJob.objects.filter(paused_until__isnull=False).exists(), "no end left for the tick to read"


def test_the_api_says_no_pause_for_a_running_job(admin_client: Any, job: CronJob) -> None:
    status = admin_client.get("/cron/status/").json()
    (summary,) = [item for item in status["jobs"] if item["code"] == "PZ1"]
    assert summary["paused"] is False and summary["pause"] is None
    assert json.dumps(summary)  # serialisable as it is


def failed(job: CronJob, minutes: int) -> CronExecution:
    """A final failure of the job at T0 plus ``minutes``, counted as the reconciler counts one."""
    row = CronExecution.objects.create(job=job, task_code=job.code, task_name=job.name,
                                       slot=T0 + dt.timedelta(minutes=minutes), execution_date=T0.date(),
                                       run_number=1, status=Status.FAILED, error_code="DesignedFailure",
                                       completed=True, success=False, started=T0, ended=T0)
    CronJob.objects.filter(id=job.id).update(consecutive_failures=F("consecutive_failures") + 1)
    return row


def test_pause_after_failures_pauses_at_the_nth_failure_in_a_row_and_again_after_a_resume(
        admin_client: Any, declare: Any) -> None:
    declare("fragile", "PZ3", schedule="0 3 * * *", timezone="UTC", pause_after_failures=2)
    schedule_sync.sync(T0)
    job = CronJob.objects.get(code="PZ3")
    assert job.pause_after_failures == 2, "declared in code, written to the row"

    def after(row: CronExecution, *, counted: bool = True) -> pauses.SelfPaused | None:
        with transaction.atomic():
            return pauses.after_failures(job_id=job.id, execution_id=row.id, counted=counted, status=row.status,
                                         slot=row.slot, error_code=row.error_code)

    first = failed(job, 0)
    assert after(first) is None and not row(job).paused, "one failure of two"
    second = failed(job, 1)
    paused = after(second)
    assert paused is not None and [item["id"] for item in paused.failures] == [second.id, first.id]
    kept = row(job)
    assert (kept.paused, kept.paused_by) == (True, pauses.BY_FAILURES)
    assert kept.pause_note.startswith("Paused after 2 failures in a row (pause_after_failures=2): "
                                      f"execution {second.id} FAILED DesignedFailure")
    assert PeriodicTask.objects.get(id=job.periodic_task_id).enabled is False
    (change,) = ScheduleChange.objects.filter(job_id=job.id, changes__has_key="enabled",
                                             source=pauses.PAUSED_AFTER_FAILURES)
    assert (change.actor, change.changes["enabled"]) == ("", [True, False])
    assert after(failed(job, 2)) is None, "paused already: nothing more"
    admin_client.post(DASHBOARD, {"action": "resume", "_selected_action": [job.id]})
    assert not row(job).paused and row(job).pause_note == ""
    # Its streak goes on (the worker's own final write counts after it records: counted=False).
    fourth = failed(job, 3)
    CronJob.objects.filter(id=job.id).update(consecutive_failures=F("consecutive_failures") - 1)
    assert after(fourth, counted=False) is not None and row(job).paused, "the streak is still long enough"


def test_a_job_without_pause_after_failures_never_pauses_itself(declare: Any) -> None:
    declare("sturdy", "PZ4", schedule="0 3 * * *", timezone="UTC")
    schedule_sync.sync(T0)
    job = CronJob.objects.get(code="PZ4")
    for minutes in range(5):
        row_ = failed(job, minutes)
        with transaction.atomic():
            assert pauses.after_failures(job_id=job.id, execution_id=row_.id, counted=True, status=row_.status,
                                         slot=row_.slot, error_code=row_.error_code) is None
    assert not row(job).paused


PAUSER = "pauser-token-0123456789-abcdefghijklm"
RUNNER = "runner-token-0123456789-abcdefghijklm"


def tokens_of(**named: list[str]) -> Any:
    from django.conf import settings
    from django.test import override_settings

    values = {"ops": PAUSER, "deploy": RUNNER}
    return override_settings(CRON_CELERY={**settings.CRON_CELERY, "API_TOKENS": {
        name: {"token": values[name], "scopes": scopes} for name, scopes in named.items()}})


def test_the_pause_endpoint_pauses_with_a_note_and_an_end_and_the_resume_endpoint_clears_them(
        client: Any, job: CronJob) -> None:
    end = ahead(3600).replace(microsecond=0)
    before = ScheduleChange.objects.order_by("-id").values_list("id", flat=True).first() or 0
    with tokens_of(ops=["pause"]):
        paused = client.post("/cron/pause/PZ1/", {"note": NOTE, "until": end.isoformat()},
                             content_type="application/json", headers={"Authorization": f"Bearer {PAUSER}"})
        assert paused.status_code == 200, paused.content
        assert paused.json()["paused"] is True and paused.json()["pause"]["note"] == NOTE
        assert paused.json()["pause"]["until"] == end.isoformat() and paused.json()["pause"]["by"] == "token:ops"
        state = row(job)
        assert (state.paused, state.pause_note, state.paused_by, state.paused_until) == (True, NOTE, "token:ops", end)
        assert PeriodicTask.objects.get(id=job.periodic_task_id).enabled is False
        resumed = client.post("/cron/resume/paused-report/", headers={"Authorization": f"Bearer {PAUSER}"})
    assert resumed.status_code == 200 and resumed.json() == {"job": "paused-report", "code": "PZ1", "paused": False,
                                                             "pause": None}
    state = row(job)
    assert (state.paused, state.pause_note, state.paused_by, state.paused_until) == (False, "", "", None)
    changes = [(c.actor, c.source, c.changes) for c in ScheduleChange.objects.filter(job_id=job.id, id__gt=before)
               .order_by("id")]
    stamp = end.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert changes[:2] == [("token:ops", "endpoint: pause", {"enabled": [True, False]}),
                           ("token:ops", "endpoint: pause", {"pause_note": ["", NOTE], "paused_until": [None, stamp]})]
    assert changes[2][:2] == ("token:ops", "endpoint: resume") and changes[2][2]["enabled"] == [False, True]


@pytest.mark.parametrize(("fields", "words"), [
    ({"until": "2001-01-01T00:00Z"}, "is not after now"),
    ({"until": "next tuesday"}, "expected an ISO-8601 time"),
    ({"note": "x" * 2001}, "note must be at most 2000 characters"),
    ({"note": "a\x00b"}, "without NUL"),
])
def test_a_pause_the_endpoint_refuses_says_why_and_pauses_nothing(client: Any, job: CronJob,
                                                                 fields: dict[str, str], words: str) -> None:
    with tokens_of(ops=["pause"]):
        answer = client.post("/cron/pause/PZ1/", fields, content_type="application/json",
                             headers={"Authorization": f"Bearer {PAUSER}"})
    assert answer.status_code == 400 and words in answer.json()["error"], answer.content
    assert answer.json()["field"] in ("until", "note")
    assert row(job).paused is False and PeriodicTask.objects.get(id=job.periodic_task_id).enabled is True


def test_pausing_needs_the_pause_scope_or_the_operate_permission(client: Any, admin_client: Any,
                                                                 job: CronJob) -> None:
    with tokens_of(deploy=["run", "force"]):
        refused = client.post("/cron/pause/PZ1/", headers={"Authorization": f"Bearer {RUNNER}"})
    assert refused.status_code == 403 and refused.json()["missing_scope"] == "pause"
    assert client.post("/cron/pause/PZ1/").status_code in (401, 403)
    assert client.get("/cron/pause/PZ1/").status_code in (401, 403, 405)
    assert row(job).paused is False
    # A session with the admin's operate permission (the test's superuser), as the admin's Pause… needs.
    assert admin_client.post("/cron/pause/PZ1/", {"note": "by hand"}).status_code == 200
    assert (row(job).paused, row(job).pause_note, row(job).paused_by) == (True, "by hand", "admin")
    assert admin_client.post("/cron/pause/NOPE/").status_code == 404
