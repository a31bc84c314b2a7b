"""The run path: outcomes recorded from return values and exceptions, bad input included."""

from __future__ import annotations

import datetime as dt
import threading

import pytest

from cron_celery import JobFailed, Run, exceptions, models
from cron_celery.decisions import jobs as job_rows
from cron_celery.models import CronExecution, Status, Trigger
from cron_celery.run import runs
from tests.conftest import make_job

pytestmark = pytest.mark.django_db

SLOT = dt.datetime(2026, 11, 29, 1, 0, tzinfo=dt.UTC)


def execute(job, call, **kw):
    return runs.execute(job, kw.pop("slot", SLOT), call, trigger=kw.pop("trigger", Trigger.MANUAL), **kw)


def test_the_job_receives_a_run_describing_its_slot():
    job, _job_id = make_job(timezone="Europe/Amsterdam")
    seen: list[Run] = []
    late = dt.datetime(2026, 11, 29, 23, 30, tzinfo=dt.UTC)  # already the 30th in Amsterdam
    outcome = execute(job, lambda run: seen.append(run) or "done", slot=late)
    run = seen[0]
    assert outcome.status == Status.SUCCEEDED and outcome.message == "done"
    assert (run.job, run.code, run.slot, run.attempt, run.run_number) == (job.name, job.code, late, 1, 1)
    assert run.execution_date == dt.date(2026, 11, 30)
    assert run.key == f"{job.code}:2026-11-29T23:30:00Z"
    row = CronExecution.objects.get(id=run.execution_id)
    assert row.fence == run.fence and row.execution_date == dt.date(2026, 11, 30)
    assert isinstance(run.cancelled, threading.Event) and not run.cancelled.is_set()
    run.check()  # not cancelled: no error


def test_run_check_raises_lease_lost_once_cancelled():
    job, _ = make_job()

    def body(run):
        run.cancelled.set()
        run.check()

    outcome = execute(job, body)
    assert outcome.status == Status.FAILED and isinstance(outcome.exc, exceptions.LeaseLost)
    assert CronExecution.objects.get(id=outcome.execution_id).error_code == "LEASE_LOST"


def test_an_error_dict_is_a_failure_with_its_code_and_a_clean_dict_a_success():
    job, _ = make_job(pattern="always", overlap="allow")
    bad = execute(job, lambda run: {"error": True, "message": "partner down", "error_code": "HTTP_503"})
    good = execute(job, lambda run: {"error": False, "message": "Sync completed"})
    bad_row = CronExecution.objects.get(id=bad.execution_id)
    assert (bad_row.status, bad_row.success, bad_row.message, bad_row.error_code) == (
        Status.FAILED, False, "partner down", "HTTP_503")
    assert bad_row.result == {"error": True, "message": "partner down", "error_code": "HTTP_503"}
    good_row = CronExecution.objects.get(id=good.execution_id)
    assert (good_row.status, good_row.success, good_row.message) == (Status.SUCCEEDED, True, "Sync completed")


def test_an_exception_is_recorded_with_its_traceback_and_handed_back():
    job, _ = make_job()

    def body(run):
        raise ValueError("bad row 7")

    outcome = execute(job, body)
    row = CronExecution.objects.get(id=outcome.execution_id)
    assert (row.status, row.success, row.completed) == (Status.FAILED, False, True)
    assert row.message == "ValueError: bad row 7" and row.error_code == "ValueError"
    assert "Traceback" in row.traceback and "in body" in row.traceback
    assert isinstance(outcome.exc, ValueError)


def test_job_failed_keeps_its_message_and_error_code():
    job, _ = make_job()

    def body(run):
        raise JobFailed("ledger closed", error_code="LEDGER")

    row = CronExecution.objects.get(id=execute(job, body).execution_id)
    assert (row.message, row.error_code) == ("ledger closed", "LEDGER")


def test_a_soft_time_limit_is_recorded_as_timed_out():
    from celery.exceptions import SoftTimeLimitExceeded

    job, _ = make_job()

    def body(run):
        raise SoftTimeLimitExceeded()

    row = CronExecution.objects.get(id=execute(job, body).execution_id)
    assert (row.status, row.error_code, row.success) == (Status.TIMED_OUT, "TIME_LIMIT", False)


def test_a_return_value_that_is_not_json_is_a_clear_failure():
    job, _ = make_job()
    outcome = execute(job, lambda run: {"when": dt.datetime(2026, 1, 1), "n": object()})
    row = CronExecution.objects.get(id=outcome.execution_id)
    assert (row.status, row.error_code, row.result) == (Status.FAILED, "NOT_JSON", None)
    assert "not JSON-serialisable" in row.message and "dict" in row.message


def test_a_ten_megabyte_exception_message_is_stored_truncated():
    job, _ = make_job()
    huge = "é" * (10 * 1024 * 1024)

    def body(run):
        raise RuntimeError(huge)

    outcome = execute(job, body)
    row = CronExecution.objects.get(id=outcome.execution_id)
    assert row.status == Status.FAILED
    limit = 10_000
    assert len(row.message) < limit + 100 and "truncated" in row.message
    assert len(row.traceback) < 50_000 + 100 and "truncated" in row.traceback
    assert row.message.startswith("RuntimeError: éé")


def test_unicode_and_nul_characters_are_stored_safely():
    job, _ = make_job(pattern="always", overlap="allow")
    text = "Überweisung — 送金 🚫 \x00 end"
    outcome = execute(job, lambda run: text)
    row = CronExecution.objects.get(id=outcome.execution_id)
    assert row.status == Status.SUCCEEDED and row.message == text.replace("\x00", "\ufffd")
    outcome = execute(job, lambda run: {"error": False, "message": "ok", "raw": "a\x00b"})
    row = CronExecution.objects.get(id=outcome.execution_id)
    assert row.status == Status.SUCCEEDED and row.result["truncated"] is True


def test_a_huge_result_is_stored_as_a_bounded_preview():
    job, _ = make_job()
    outcome = execute(job, lambda run: ["x" * 1000] * 1000)
    row = CronExecution.objects.get(id=outcome.execution_id)
    assert row.status == Status.SUCCEEDED
    assert row.result["truncated"] is True and len(row.result["preview"]) <= 100_000


def test_an_async_job_is_awaited():
    job, _ = make_job()

    async def body(run):
        return f"async {run.key}"

    outcome = execute(job, lambda run: runs.call_job(body, run))
    assert outcome.status == Status.SUCCEEDED and outcome.message == f"async {job.code}:2026-11-29T01:00:00Z"


def test_a_skip_is_reported_and_recorded():
    job, _ = make_job()
    execute(job, lambda run: "first")
    calls = []
    outcome = execute(job, calls.append)
    assert outcome.status == Status.SKIPPED and outcome.skip_reason == models.SkipReason.ALREADY_RAN
    assert calls == []
    assert CronExecution.objects.filter(status=Status.SKIPPED).count() == 1


def test_a_fenced_finish_reports_fenced_and_leaves_the_newer_claim_alone():
    job, _job_id = make_job()

    def body(run):
        # Another worker takes the execution over while this one still runs.
        CronExecution.objects.filter(id=run.execution_id).update(fence=run.fence + 100)
        return "stale result"

    outcome = execute(job, body)
    assert outcome.status == runs.FENCED
    row = CronExecution.objects.get(id=outcome.execution_id)
    assert row.status == Status.RUNNING and row.message == ""


def test_a_job_row_deleted_under_a_running_process_is_recreated():
    job, job_id = make_job()
    job_rows.job_id(job)
    models.CronJob.objects.filter(id=job_id).delete()
    outcome = execute(job, lambda run: "again")
    assert outcome.status == Status.SUCCEEDED
    assert models.CronJob.objects.filter(name=job.name).exists()
