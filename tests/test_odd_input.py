"""Odd input gets a clear error, never a 500, a traceback or a lost request (issue 35 item 11).

A NUL character or a lone surrogate in a parameter's value (``jsonb`` and PostgreSQL's text cannot
hold either), a time at the very end of the calendar and a date whose slot falls before year 1, sent
each way a person sends a run: the run endpoint (a 400 naming the field), ``run_cron_task`` (one line
on stderr, exit code 1 like every input it cannot read, nothing recorded) and a direct ``delay()``
to a real worker (the execution is recorded, closed ``FAILED`` with ``INVALID_PARAMS``; a slot that
cannot be read is refused in the caller, before anything is sent).
"""

from __future__ import annotations

import datetime as dt
import io
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from celery.contrib.testing.worker import start_worker
from django.core.management import CommandError, call_command

from cron_celery import exceptions, slots
from cron_celery.models import CronExecution, Status
from tests.celery_app import app
from tests.conftest import ROOT, subprocess_env, wait_for
from tests.jobsapp import jobs_params, tasks

NUL, SURROGATE = "a\x00b", "\ud800"
TOKEN = "odd-input-token-0123456789-abcdefgh"
BEARER = {"Authorization": f"Bearer {TOKEN}"}


def post_run(client: Any, job: str, body: str | dict[str, str], *, form: bool = False) -> Any:
    from django.conf import settings
    from django.test import override_settings

    granted = {"ops": {"token": TOKEN, "scopes": ["read", "run", "force"]}}
    with override_settings(CRON_CELERY={**settings.CRON_CELERY, "API_TOKENS": granted}):
        if form:
            return client.post(f"/cron/run/{job}/", body, headers=BEARER)
        return client.post(f"/cron/run/{job}/", body, content_type="application/json", headers=BEARER)


def refused(response: Any) -> dict[str, Any]:
    assert response.status_code == 400, (response.status_code, response.content[:2000])
    answer = response.json()
    assert answer["error"]
    return dict(answer)


# --- the run endpoint ---------------------------------------------------------------------------------

@pytest.mark.django_db
@pytest.mark.parametrize("value", [NUL, SURROGATE, "\udcff", "x" * 10 + "\x00"])
def test_the_run_endpoint_answers_400_for_a_value_jsonb_cannot_hold(client, queue, value):
    # json.dumps writes both as \u escapes (ensure_ascii): the text is valid JSON, its value is not storable.
    answer = refused(post_run(client, "param-report", json.dumps({"date": "2026-11-29", "params": {"note": value}})))
    assert answer["field"] == "note" and "cannot be stored" in answer["error"]
    form = refused(post_run(client, "param-report", {"date": "2026-11-29", "params": json.dumps({"note": value})},
                            form=True))
    assert form["field"] == "note"
    assert not CronExecution.objects.exists() and queue.headers() == []


@pytest.mark.django_db
def test_the_run_endpoint_answers_400_for_a_name_jsonb_cannot_hold_and_for_json_nested_too_deep(client, queue):
    assert refused(post_run(client, "param-report", json.dumps({"params": {"no\x00te": "x"}})))["field"] == "no\x00te"
    deep = '{"params": ' + "[" * 100_000 + "]" * 100_000 + "}"
    assert "not JSON" in refused(post_run(client, "param-report", deep))["error"]
    assert "not JSON" in refused(post_run(client, "param-report", {"params": "[" * 100_000}, form=True))["error"]
    assert not CronExecution.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("fields", [
    {"at": "9999-12-31T23:59", "schedule": "true"},  # the job's next slot after it is past the calendar's end
    {"at": "0001-01-01T00:00"},  # Amsterdam's midnight of 1 January of year 1 is in year 0 in UTC
    {"at": "0001-01-01T00:00+05:00"},
    {"date": "0000-01-01"},
    {"at": "10000-01-01T00:00"},
    {"at": "2026-11-29T01:00\x00"},
])
def test_the_run_endpoint_answers_400_for_a_time_outside_the_calendar(client, queue, fields):
    assert refused(post_run(client, "nightly-report", json.dumps(fields)))
    assert not CronExecution.objects.exists() and queue.headers() == []


@pytest.mark.django_db
def test_a_job_without_a_schedule_on_the_first_day_of_year_1_is_refused_when_its_midnight_is_in_year_0(
        client, queue, declare):
    declare("odd-amsterdam", "OD01", timezone="Europe/Amsterdam")
    assert "calendar" in refused(post_run(client, "odd-amsterdam", json.dumps({"date": "0001-01-01"})))["error"]
    assert not CronExecution.objects.exists()


# --- run_cron_task --------------------------------------------------------------------------------------

@pytest.mark.django_db
@pytest.mark.parametrize(("args", "options"), [
    (("param-report", "2026-11-29"), {"param": [f"note={NUL}"]}),
    (("param-report", "2026-11-29"), {"param": [f"note={SURROGATE}"], "enqueue": True}),
    (("param-report",), {"at": "2026-12-31T18:00", "param": [f"note={NUL}"], "schedule": True}),
    (("param-report", "2026-11-29"), {"param": ["no\x00te=x"]}),
    (("nightly-report",), {"at": "9999-12-31T23:59", "schedule": True}),
    (("nightly-report",), {"at": "0001-01-01T00:00"}),
    (("nightly-report", "0000-01-01"), {}),
    (("calc-commission",), {"at": "9999-12-31T23:59:59-05:00"}),
])
def test_run_cron_task_refuses_odd_input_with_a_command_error_and_records_nothing(args, options):
    with pytest.raises(CommandError) as error:
        call_command("run_cron_task", *args, stdout=io.StringIO(), **options)
    assert error.value.returncode == 1 and "\n" not in str(error.value)
    assert not CronExecution.objects.exists()


def command(*args: bytes) -> subprocess.CompletedProcess[bytes]:
    """``run_cron_task`` in a real process, its arguments as bytes (a shell passes what it was given)."""
    return subprocess.run([sys.executable.encode(), b"-m", b"django", b"run_cron_task", *args], cwd=ROOT,
                          env=subprocess_env(PYTHONIOENCODING="utf-8"), capture_output=True, timeout=60, check=False)


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_run_cron_task_in_a_real_process_refuses_bytes_that_are_no_text_and_times_outside_the_calendar():
    # Bytes that are not UTF-8 reach Python as lone surrogates (the file system's "surrogateescape").
    for args in ([b"param-report", b"2026-11-29", b"--param", b"note=caf\xe9"],
                 [b"param-report", b"2026-11-29", b"--param", b"note=\xed\xa0\x80", b"--enqueue"],
                 [b"nightly-report", b"--at", b"9999-12-31T23:59", b"--schedule"],
                 [b"nightly-report", b"--at", b"0001-01-01T00:00"]):
        done = command(*args)
        stderr = done.stderr.decode("utf-8", "replace")
        assert done.returncode == 1, (args, done.stdout, stderr)
        assert "Traceback" not in stderr and stderr.startswith("CommandError: "), (args, stderr)
    assert not CronExecution.objects.exists()


# --- delay() to a real worker ----------------------------------------------------------------------------

@pytest.fixture
def worker() -> Iterator[None]:
    with start_worker(app, pool="threads", concurrency=1, perform_ping_check=False, loglevel="WARNING",
                      shutdown_timeout=30):
        yield


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
@pytest.mark.parametrize("value", [NUL, SURROGATE])
def test_a_delay_with_a_value_jsonb_cannot_hold_is_recorded_failed_with_an_error_code(worker, value):
    jobs_params.param_report.delay(slot="2026-11-29T01:00Z", note=value)
    wait_for(lambda: CronExecution.objects.filter(task_code="P001", completed=True).exists(), timeout=60,
             what="the direct call's execution to be closed")
    row = CronExecution.objects.get(task_code="P001")
    assert (row.status, row.error_code, row.params) == (Status.FAILED, "INVALID_PARAMS", None)
    assert "note:" in row.message and "cannot be stored" in row.message


@pytest.mark.django_db
@pytest.mark.parametrize("kwargs", [
    {"slot": "0001-01-01T00:00"},  # Amsterdam's midnight, in year 0 in UTC
    {"execution_date": "0000-01-01"},
    {"slot": "9999-12-31T23:59:59-05:00"},
    {"slot": "2026-11-29\x00"},
])
def test_a_delay_naming_a_slot_outside_the_calendar_is_refused_in_the_caller_before_anything_is_sent(queue, kwargs):
    with pytest.raises(exceptions.InvalidSlot):
        tasks.nightly_report.delay(**kwargs)
    assert queue.headers() == [] and not CronExecution.objects.exists()


def test_the_calendar_ends_are_invalid_slots_not_overflows():
    amsterdam = slots.parse_slot("2026-01-01", tasks.nightly_report.job.tzinfo).tzinfo
    assert amsterdam is dt.UTC
    for value in ("0001-01-01T00:00", dt.date(1, 1, 1), dt.datetime(1, 1, 1, 0, 0)):
        with pytest.raises(exceptions.InvalidSlot, match="calendar"):
            slots.parse_slot(value, tasks.nightly_report.job.tzinfo)
