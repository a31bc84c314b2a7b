"""The row is the truth: a real Celery worker (in-thread, Redis broker, real PostgreSQL) runs a job's
body with the parameter values on the execution it claims — whatever sends the message, however often:
a person's run, its retry, a redelivery, the reconciler's resend (headers only), a one-off sent later,
the beat's dispatch. The body writes what it received, with the Python types, to CRON_TEST_MARKER."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery.contrib.testing.worker import start_worker

from cron_celery import slots
from cron_celery.decisions import dispatch, oneoffs
from cron_celery.decisions import jobs as job_rows
from cron_celery.models import CronExecution, CronJob, Status, Trigger
from cron_celery.run import tasks
from tests.celery_app import app
from tests.conftest import manage, subprocess_env, wait_for
from tests.jobsapp import jobs_params

pytestmark = pytest.mark.django_db(transaction=True)

SLOT = dt.datetime(2026, 11, 29, 1, 0, tzinfo=dt.UTC)
REPORT = jobs_params.param_report.job


@pytest.fixture
def worker() -> Iterator[None]:
    with start_worker(app, pool="threads", concurrency=1, perform_ping_check=False, loglevel="WARNING",
                      shutdown_timeout=30):
        yield


def received(marker: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in marker.read_text(encoding="utf-8").splitlines() if line]


def ended(execution_id: int) -> Any:
    return lambda: CronExecution.objects.filter(id=execution_id, completed=True).exists()


def test_a_run_sent_with_parameters_reaches_the_body_as_their_types_and_is_recorded(worker, marker):
    sent = tasks.send_run(REPORT, SLOT, Trigger.ENQUEUE, given={
        "region": "us", "day": "2026-11-30", "dry_run": True, "limit": 7, "ratio": 2,
        "since": "2026-12-01T18:00:00+01:00"})
    wait_for(ended(sent.execution_id), what="the run with parameters")
    row = CronExecution.objects.get(id=sent.execution_id)
    assert (row.status, row.message, row.params_given) == (Status.SUCCEEDED, "report us (dry run)", True)
    assert row.params == {"region": "us", "day": "2026-11-30", "dry_run": True, "limit": 7, "ratio": 2.0,
                          "since": "2026-12-01T18:00:00+01:00"}
    [line] = received(marker)
    assert line["execution"] == sent.execution_id
    assert line["kwargs"] == {"region": ["str", "us"], "day": ["date", "2026-11-30"], "dry_run": ["bool", True],
                              "limit": ["int", 7], "ratio": ["float", 2.0],
                              "since": ["datetime", "2026-12-01T18:00:00+01:00"], "note": ["str", ""]}
    assert line["run_params"] == sorted(line["kwargs"])  # run.params holds the same, defaults included


def test_the_retry_a_redelivery_and_a_resend_all_run_with_the_values_on_the_row(worker, marker):
    """The guarantee of docs/reliability.md: the message carries headers only; every later delivery
    of the execution reads its values from the row."""
    # A retry: the first attempt fails, the retry's message (headers only) runs with the same values.
    sent = tasks.send_run(REPORT, SLOT, Trigger.ENQUEUE, given={"region": "us", "note": "fail-once"})
    wait_for(ended(sent.execution_id), what="the retried run")
    row = CronExecution.objects.get(id=sent.execution_id)
    assert (row.status, row.retry_count) == (Status.SUCCEEDED, 1)
    assert [(line["attempt"], line["kwargs"]["region"], line["kwargs"]["note"]) for line in received(marker)] == [
        (1, ["str", "us"], ["str", "fail-once"]), (2, ["str", "us"], ["str", "fail-once"])]

    # A redelivery of a finished execution's message: nothing runs again.
    app.send_task(REPORT.task_name, task_id=row.celery_task_id, headers=tasks.headers(row.id, SLOT, Trigger.ENQUEUE))
    # The reconciler's resend of a PENDING execution nobody started: headers only, and a message that
    # carries other values besides (a hand-made one): the row's still win.
    pending, _ = dispatch.enqueue(job=REPORT, job_id=job_rows.job_id(REPORT), slot=SLOT, execution_date=SLOT.date(),
                                  trigger=Trigger.ENQUEUE, given={"region": "us", "limit": 3})
    tasks.send(app, REPORT.task_name, execution_id=pending, slot=SLOT, trigger=Trigger.ENQUEUE)
    wait_for(ended(pending), what="the resent execution")
    app.send_task(REPORT.task_name, kwargs={"region": "eu", "limit": 99},
                  headers=tasks.headers(pending, SLOT, Trigger.ENQUEUE))  # again, with other values in it
    later = dispatch.enqueue(job=REPORT, job_id=job_rows.job_id(REPORT), slot=SLOT + dt.timedelta(days=1),
                             execution_date=SLOT.date(), trigger=Trigger.ENQUEUE, given={"dry_run": True})[0]
    tasks.send(app, REPORT.task_name, execution_id=later, slot=SLOT + dt.timedelta(days=1), trigger=Trigger.ENQUEUE)
    wait_for(ended(later), what="a run sent after the duplicates")  # the duplicates were handled before it
    lines = received(marker)
    assert [line["execution"] for line in lines] == [row.id, row.id, pending, later]  # no second run of either
    assert (lines[2]["kwargs"]["region"], lines[2]["kwargs"]["limit"]) == (["str", "us"], ["int", 3])
    assert CronExecution.objects.get(id=pending).params == {"region": "us", "limit": 3}


def test_a_one_off_recorded_with_parameters_runs_with_them_when_the_beat_sends_it(worker, marker):
    at = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).replace(second=0, microsecond=0)
    recorded = tasks.schedule_one_off(REPORT, at, given={"region": "us", "note": "one-off"})
    CronJob.objects.filter(id=job_rows.job_id(REPORT)).update(params={"region": "eu"})  # changed since: not its own
    [due] = oneoffs.take_due(at, limit=10)  # what the beat does when the time comes
    tasks.send(app, due.task, execution_id=due.execution_id, slot=due.slot, trigger=Trigger.ONE_OFF,
               celery_task_id=due.celery_task_id)
    wait_for(ended(recorded.execution_id), what="the one-off run")
    [line] = received(marker)
    assert (line["kwargs"]["region"], line["kwargs"]["note"]) == (["str", "us"], ["str", "one-off"])


def test_the_beats_rows_run_with_the_periodic_tasks_values(worker, marker):
    job_id = job_rows.job_id(REPORT)
    CronJob.objects.filter(id=job_id).update(params={"region": "us", "limit": 5})  # as apply_edits copies them
    decision = dispatch.Decision(job_id=job_id, expected_next_run_at=None, next_run_at=SLOT + dt.timedelta(hours=1),
                                 run=[SLOT], missed=[], tz=dt.UTC)
    _advanced, [item], _missed = dispatch.dispatch_many([decision])
    tasks.publish(app, REPORT.task_name, tasks.headers(item.execution_id, SLOT, Trigger.BEAT),
                  task_id=item.celery_task_id)
    wait_for(ended(item.execution_id), what="the beat's run")
    [line] = received(marker)
    assert (line["kwargs"]["region"], line["kwargs"]["limit"]) == (["str", "us"], ["int", 5])
    assert not CronExecution.objects.get(id=item.execution_id).params_given  # the slot's regular run


def test_a_direct_call_checks_its_keyword_arguments_and_keeps_them_on_the_row(worker, marker):
    jobs_params.param_report.delay(slot=slots.iso(SLOT), region="us", day=dt.date(2026, 11, 30).isoformat())
    wait_for(lambda: CronExecution.objects.filter(task_code=REPORT.code, completed=True).exists(),
             what="the direct call")
    row = CronExecution.objects.get(task_code=REPORT.code)
    assert (row.trigger, row.params, row.params_given) == (Trigger.DIRECT, {"region": "us", "day": "2026-11-30"},
                                                           False)
    [line] = received(marker)
    assert line["kwargs"]["day"] == ["date", "2026-11-30"]


def test_run_cron_task_param_in_a_real_process(marker):
    done = manage("run_cron_task", "param-sync", "2026-11-29", "--param", "partner=acme", "--param", "full=on",
                  env=subprocess_env())
    assert done.returncode == 0, done.stderr
    assert "param-sync 2026-11-29T00:00:00Z with partner=acme, full=true succeeded" in done.stdout
    [line] = received(marker)
    assert line["kwargs"] == {"partner": ["str", "acme"], "full": ["bool", True], "date": ["date", "2026-11-29"]}
    refused = manage("run_cron_task", "param-sync", "2026-11-29", "--param", "partner=acme", "--param", "full=perhaps",
                     env=subprocess_env())
    assert refused.returncode == 1
    assert "Job 'param-sync' cannot take these parameters: full: expected true or false" in refused.stderr
    missing = manage("run_cron_task", "param-sync", "2026-11-30", env=subprocess_env())
    assert missing.returncode == 1 and "partner: required (str, no default), and not given" in missing.stderr
    assert CronExecution.objects.count() == 1
