"""Runs with parameters against the real database: the claim (a run with parameters is its own
execution), the beat's dispatch, the periodic task's kwargs (checked on save and at sync), the
command, the run endpoint, the admin's "Run with parameters…", the history and the alerts.
The real worker's side is tests/test_params_worker.py; the browser's tests/browser/test_params_browser.py."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import re
from typing import Any, Literal

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from cron_celery import exceptions
from cron_celery.alerts import delivery, schedule_alerts
from cron_celery.beat import schedule_sync
from cron_celery.decisions import claims, dispatch
from cron_celery.decisions import jobs as job_rows
from cron_celery.declaring import params, registry
from cron_celery.models import Alert, CronExecution, CronJob, Status, Trigger
from cron_celery.run import runs, tasks
from cron_celery.schedules import every
from tests.admin_forms import submit
from tests.jobsapp import jobs_params

pytestmark = pytest.mark.django_db

SLOT = dt.datetime(2026, 11, 29, 1, 0, tzinfo=dt.UTC)
NOW = dt.datetime(2026, 11, 29, 12, 0, 30, tzinfo=dt.UTC)
REPORT: registry.Job = jobs_params.param_report.job
SYNC: registry.Job = jobs_params.ParamSync.job  # type: ignore[assignment]  # set: it is declared
DASHBOARD = "/admin/cron_celery/cronjob/"
HISTORY = "/admin/cron_celery/cronexecution/"
TOKEN = "params-token-0123456789-abcdefghijkl"
BEARER = {"Authorization": f"Bearer {TOKEN}"}


def run_here(slot: dt.datetime = SLOT, given: dict[str, Any] | None = None,
             **options: Any) -> tuple[Any, list[dict[str, Any]]]:
    """One in-process run of param-report (what ``run_cron_task`` does), and what its body received."""
    seen: list[dict[str, Any]] = []

    def body(run: runs.Run) -> str:
        seen.append(dict(run.params))
        return "ok"

    outcome = runs.execute(REPORT, slot, body, trigger=Trigger.MANUAL, given=given, params_given=bool(given),
                           **options)
    return outcome, seen


def rows(job: Any = REPORT) -> list[tuple[int, str, str, Any, bool]]:
    return list(CronExecution.objects.filter(task_code=job.code).order_by("run_number").values_list(
        "run_number", "status", "skip_reason", "params", "params_given"))


# --- 1. The claim: a run with parameters is its own execution ----------------------------------------

def test_a_run_with_parameters_neither_uses_up_the_slot_nor_is_skipped_because_it_ran():
    first, seen = run_here(given={"region": "us"})
    assert first.status == Status.SUCCEEDED and first.run_number == 1
    assert seen == [{"region": "us", "day": None, "dry_run": False, "limit": 100, "ratio": 0.5, "since": None,
                     "note": ""}]
    regular, _ = run_here()  # the slot's regular run still runs: the run above was not it
    assert (regular.status, regular.run_number) == (Status.SUCCEEDED, 2)
    again, nothing = run_here()  # now the slot has run
    assert (again.status, again.skip_reason, nothing) == (Status.SKIPPED, "ALREADY_RAN", [])
    later, seen = run_here(given={"dry_run": True})  # and a run with parameters still runs after it
    assert later.status == Status.SUCCEEDED and seen[0]["dry_run"] is True
    assert rows() == [
        (1, Status.SUCCEEDED, "", {"region": "us"}, True),
        (2, Status.SUCCEEDED, "", None, False),
        (3, Status.SKIPPED, "ALREADY_RAN", None, False),
        (4, Status.SUCCEEDED, "", {"dry_run": True}, True),
    ]


def test_a_run_with_parameters_after_a_failed_regular_run_does_not_fill_its_place():
    """STANDARD: a failed slot is done; a run with parameters that succeeds later changes nothing."""
    CronJob.objects.filter(id=job_rows.job_id(REPORT)).update(max_retries=0)
    failed = runs.execute(REPORT, SLOT, lambda run: {"error": True, "message": "down"}, trigger=Trigger.MANUAL)
    assert failed.status == Status.FAILED
    with_params, _ = run_here(given={"note": "by hand"})
    assert with_params.status == Status.SUCCEEDED
    regular, _ = run_here()
    assert (regular.status, regular.skip_reason) == (Status.SKIPPED, "ALREADY_RAN")  # the failure decided it


def test_the_overlap_still_applies_to_and_because_of_a_run_with_parameters():
    job_id = job_rows.job_id(REPORT)
    live = claims.begin(job=REPORT, job_id=job_id, slot=SLOT, execution_date=SLOT.date(), trigger=Trigger.ADMIN,
                        given={"region": "us"}, params_given=True, lease_seconds=60)
    assert live.claimed and live.params == {"region": "us"}
    regular, _ = run_here()
    assert (regular.status, regular.skip_reason) == (Status.SKIPPED, "OVERLAP")  # not ALREADY_RUNNING: not the slot's
    another, _ = run_here(SLOT + dt.timedelta(days=1), given={"region": "eu"})
    assert (another.status, another.skip_reason) == (Status.SKIPPED, "OVERLAP")
    skipped = CronExecution.objects.get(id=another.execution_id)
    assert (skipped.params, skipped.params_given) == ({"region": "eu"}, True)  # the skip says with what


def test_the_scheduled_values_are_the_base_and_a_persons_values_go_over_them():
    CronJob.objects.filter(id=job_rows.job_id(REPORT)).update(params={"region": "us", "limit": 5})
    regular, seen = run_here()
    assert seen[0]["region"] == "us" and seen[0]["limit"] == 5
    given, seen = run_here(SLOT + dt.timedelta(days=1), given={"limit": 7, "day": "2026-11-30"})
    assert seen[0]["region"] == "us" and seen[0]["limit"] == 7 and seen[0]["day"] == dt.date(2026, 11, 30)
    assert CronExecution.objects.get(id=regular.execution_id).params == {"region": "us", "limit": 5}
    assert CronExecution.objects.get(id=given.execution_id).params == {"region": "us", "limit": 7, "day": "2026-11-30"}


def test_an_existing_execution_is_claimed_with_the_values_on_its_row():
    job_id = job_rows.job_id(REPORT)
    execution_id, run_number = dispatch.enqueue(job=REPORT, job_id=job_id, slot=SLOT, execution_date=SLOT.date(),
                                                trigger=Trigger.ENQUEUE, given={"region": "us"})
    runs.execute(REPORT, SLOT, lambda run: "ok", trigger=Trigger.MANUAL)  # the slot's regular run, first
    CronJob.objects.filter(id=job_id).update(params={"note": "changed since"})  # not what the row holds
    claim = claims.begin(job=REPORT, job_id=job_id, slot=SLOT, execution_date=SLOT.date(), trigger=Trigger.ENQUEUE,
                         execution_id=execution_id)
    assert claim.claimed and claim.params == {"region": "us"}  # not skipped: the slot ran, but not as it
    assert run_number == 1


def test_a_direct_call_with_a_value_that_does_not_fit_is_recorded_failed_naming_it():
    result = jobs_params.param_report.apply(kwargs={"slot": "2026-11-29T01:00Z", "region": "asia"})
    assert isinstance(result.result, exceptions.InvalidParams) and result.result.field == "region"
    row = CronExecution.objects.get(task_code=REPORT.code)
    assert (row.status, row.error_code, row.trigger, row.params) == (Status.FAILED, "INVALID_PARAMS", Trigger.DIRECT,
                                                                     None)
    assert "region: expected one of 'eu', 'us', not 'asia'" in row.message


def test_a_stored_value_the_code_no_longer_takes_fails_the_run_uncalled_and_is_not_retried():
    called: list[int] = []
    outcome = runs.execute(REPORT, SLOT, lambda run: called.append(1), trigger=Trigger.MANUAL,
                           given={"gone": 1}, params_given=True, allow_retry=True)
    assert called == [] and outcome.status == Status.FAILED and outcome.error_code == "INVALID_PARAMS"
    assert "unknown parameter 'gone'" in outcome.message and outcome.execution_id is not None
    row = CronExecution.objects.get(id=outcome.execution_id)
    assert (row.status, row.error_code, row.retry_count) == (Status.FAILED, "INVALID_PARAMS", 0)


# --- 2. The beat: the job's values on every execution it inserts, in one statement --------------------

def test_the_beat_writes_the_jobs_values_on_each_row_and_runs_after_a_run_with_parameters():
    job_id = job_rows.job_id(REPORT)
    CronJob.objects.filter(id=job_id).update(params={"region": "us"})
    by_hand, _ = dispatch.enqueue(job=REPORT, job_id=job_id, slot=SLOT, execution_date=SLOT.date(),
                                  trigger=Trigger.ENQUEUE, given={"dry_run": True})
    later = SLOT + dt.timedelta(hours=1)
    decision = dispatch.Decision(job_id=job_id, expected_next_run_at=None, next_run_at=later + dt.timedelta(hours=1),
                                 run=[SLOT, later], missed=[], tz=dt.UTC)
    with CaptureQueriesContext(connection) as queries:
        advanced, published, missed = dispatch.dispatch_many([decision])
    assert len(queries) == 1  # one statement for the whole batch, whatever the values
    assert advanced == {job_id} and len(published) == 2 and missed == 0
    by_slot = {(row.slot, row.run_number): (row.params, row.params_given)
               for row in CronExecution.objects.filter(task_code=REPORT.code)}
    assert by_slot == {
        (SLOT, 1): ({"region": "us", "dry_run": True}, True),  # by hand: the person's values over the job's
        (SLOT, 2): ({"region": "us"}, False),  # the slot's regular run, after the one by hand (not lost to it)
        (later, 1): ({"region": "us"}, False),
    }
    assert CronExecution.objects.get(slot=SLOT, run_number=1).id == by_hand


def test_a_backfill_counts_no_run_with_parameters_as_the_slot_done_and_sends_the_jobs_values(declare):
    from cron_celery.run import backfill
    from cron_celery.schedules import at, daily

    job = declare("kw-daily", "PK03", schedule=daily(at(1).am()),
                  parameters=params.from_signature(kw_report, skip=1, job="kw-daily"))
    job_id = job_rows.job_id(job)
    CronJob.objects.filter(id=job_id).update(params={"limit": 1})
    by_hand = runs.execute(job, SLOT, lambda run: "ok", trigger=Trigger.MANUAL, given={"region": "us"},
                           params_given=True)
    assert by_hand.status == Status.SUCCEEDED
    planned = backfill.plan(job, SLOT.date(), SLOT.date())
    assert planned.slots == [SLOT] and planned.done == []  # the run by hand was not the slot's run
    recorded = backfill.record(job, planned)
    assert CronExecution.objects.get(id=recorded[0].execution_id).params == {"limit": 1}


def test_a_run_with_parameters_neither_decides_a_downstream_slot_nor_holds_one(declare):
    """after=: the upstream's run with parameters neither creates nor skips the downstream's slot; its
    regular run does, and a downstream's own run with parameters leaves its slot to be decided."""
    from cron_celery.decisions import dependencies
    from cron_celery.schedules import every

    up = declare("chain-up-p", "PD1", schedule=every(hours=1),
                 parameters=params.from_signature(kw_report, skip=1, job="chain-up-p"))
    down = declare("chain-down-p", "PD2", after="chain-up-p",
                   parameters=params.from_signature(kw_report, skip=1, job="chain-down-p"))
    ids = job_rows.refresh_job_ids([up, down])
    dependencies.sync([up, down])
    CronJob.objects.filter(id=ids["PD2"]).update(params={"limit": 2})  # the downstream job's own values

    failed = runs.execute(up, SLOT, lambda run: {"error": True}, trigger=Trigger.MANUAL, given={"region": "us"},
                          params_given=True)
    assert failed.status == Status.FAILED
    assert not CronExecution.objects.filter(job_id=ids["PD2"]).exists()  # not skipped UPSTREAM for it
    by_hand_below = runs.execute(down, SLOT, lambda run: "ok", trigger=Trigger.MANUAL, given={"region": "us"},
                                 params_given=True)
    assert by_hand_below.status == Status.SUCCEEDED
    assert runs.execute(up, SLOT, lambda run: "ok", trigger=Trigger.MANUAL).status == Status.SUCCEEDED
    created = CronExecution.objects.get(job_id=ids["PD2"], trigger=Trigger.UPSTREAM)  # decided by the regular run
    assert (created.status, created.run_number, created.params, created.params_given) == (
        Status.PENDING, 2, {"limit": 2}, False)


# --- 3. The periodic task's kwargs: checked at sync, copied to the job's row ---------------------------

def kw_report(run: runs.Run, *, region: Literal["eu", "us"] = "eu", limit: int = 10) -> None:
    """A scheduled job's body (declared on the fly: the beat and sync need no Celery task)."""


def kw_sync(run: runs.Run, *, partner: str) -> None:
    """A scheduled job with a required parameter."""


def scheduled(declare: Any, name: str, code: str, body: Any) -> Any:
    return declare(name, code, schedule=every(minutes=5),
                   parameters=params.from_signature(body, skip=1, job=name))


def set_kwargs(name: str, text: str) -> None:
    """Written past any form (the ORM's update, as raw SQL would): the trigger still sees it."""
    PeriodicTask.objects.filter(cron_job__name=name).update(kwargs=text)


def test_kwargs_are_checked_and_copied_to_the_job_then_onto_each_dispatched_row(declare, monkeypatch,
                                                                               django_capture_on_commit_callbacks):
    said: list[tuple[str, str, str]] = []
    monkeypatch.setattr(schedule_alerts, "schedule_problem", lambda job, **kw: said.append(
        (kw["code"], kw["problem"], kw["state"])) or 1)
    job = scheduled(declare, "kw-report", "PK01", kw_report)
    schedule_sync.sync(NOW)
    row = CronJob.objects.get(code="PK01")
    assert (row.params, row.schedule_problem, row.paused) == (None, "", False)
    set_kwargs("kw-report", '{"region": "us", "limit": 3}')
    assert schedule_sync.apply_edits(NOW) == 1  # the trigger bumped the job on the kwargs alone
    row.refresh_from_db()
    assert (row.params, row.schedule_problem) == ({"region": "us", "limit": 3}, "")
    next_slot = row.next_run_at
    assert next_slot is not None

    with connection.cursor() as cursor:  # raw SQL: no form refuses it
        cursor.execute("UPDATE django_celery_beat_periodictask SET kwargs = %s WHERE id = %s",
                       ['{"region": "asia"}', row.periodic_task_id])
    with django_capture_on_commit_callbacks(execute=True):  # the alert is queued once the refusal is committed
        schedule_sync.apply_edits(NOW)
    row.refresh_from_db()
    assert row.params == {"region": "us", "limit": 3}  # kept: the bad value never reaches a row
    assert "kwargs: Job 'kw-report' cannot take these parameters: region: expected one of 'eu', 'us', not 'asia'" \
        in row.schedule_problem
    assert (row.paused, row.next_run_at) == (False, next_slot)  # the job itself goes on
    assert said == [("PK01", row.schedule_problem, "keeping its previous parameters until the schedule is fixed")]
    decision = dispatch.Decision(job_id=row.id, expected_next_run_at=next_slot, next_run_at=next_slot
                                 + dt.timedelta(minutes=5), run=[next_slot], missed=[], tz=job.tzinfo)
    dispatch.dispatch_many([decision])
    assert CronExecution.objects.get(job_id=row.id).params == {"region": "us", "limit": 3}

    set_kwargs("kw-report", '{"limit": 4}')
    schedule_sync.apply_edits(NOW)
    row.refresh_from_db()
    assert (row.params, row.schedule_problem) == ({"limit": 4}, "")


def test_a_required_parameter_without_kwargs_pauses_the_job_until_they_give_it(declare):
    scheduled(declare, "kw-sync", "PK02", kw_sync)
    schedule_sync.sync(NOW)
    row = CronJob.objects.get(code="PK02")
    assert row.paused and row.next_run_at is None
    assert "partner: required (str, no default), and not given in the periodic task's kwargs" in row.schedule_problem
    set_kwargs("kw-sync", '{"partner": "acme"}')
    schedule_sync.apply_edits(NOW)
    row.refresh_from_db()
    assert (row.paused, row.params, row.schedule_problem) == (False, {"partner": "acme"}, "")
    assert row.next_run_at == dt.datetime(2026, 11, 29, 12, 5, tzinfo=dt.UTC)


def test_a_deploy_that_changes_the_parameters_is_checked_at_the_next_sync(declare):
    scheduled(declare, "kw-report", "PK01", kw_report)
    schedule_sync.sync(NOW)
    set_kwargs("kw-report", '{"limit": 3}')
    schedule_sync.apply_edits(NOW)

    def narrower(run: runs.Run, *, region: str = "eu") -> None: ...

    scheduled(declare, "kw-report", "PK01", narrower)  # the same job, declared again without limit
    assert schedule_sync.recheck_params() == 1
    schedule_sync.apply_edits(NOW)
    row = CronJob.objects.get(code="PK01")
    assert "unknown parameter 'limit' (it accepts region)" in row.schedule_problem
    assert row.paused and row.params == {"limit": 3}  # its previous values do not fit either: nothing runs
    assert schedule_sync.recheck_params() == 0  # the same refusal is not read again and again
    set_kwargs("kw-report", "{}")
    schedule_sync.apply_edits(NOW)
    row.refresh_from_db()
    assert (row.paused, row.params, row.schedule_problem) == (False, None, "")


def test_the_admin_refuses_kwargs_its_job_cannot_run_with_naming_the_parameter(declare, admin_client):
    scheduled(declare, "kw-report", "PK01", kw_report)
    schedule_sync.sync(NOW)
    task = PeriodicTask.objects.get(cron_job__code="PK01")
    url = f"/admin/django_celery_beat/periodictask/{task.id}/change/"
    for text, fragment in (('{"region": "asia"}', "region: expected one of &#x27;eu&#x27;, &#x27;us&#x27;"),
                           ('{"limit": "3"}', "limit: expected a whole number, not string"),
                           ('{"colour": "red"}', "unknown parameter &#x27;colour&#x27; (it accepts region, limit)")):
        refused = submit(admin_client, url, {"kwargs": text})
        assert refused.status_code == 200 and fragment in refused.content.decode(), text
        assert PeriodicTask.objects.get(id=task.id).kwargs == "{}"  # nothing saved
    saved = submit(admin_client, url, {"kwargs": '{"region": "us"}'})
    assert saved.status_code == 302
    schedule_sync.apply_edits(NOW)
    assert CronJob.objects.get(code="PK01").params == {"region": "us"}


def test_a_periodic_task_of_no_cron_job_keeps_its_kwargs_as_django_celery_beat_has_them(admin_client):
    interval = IntervalSchedule.objects.create(every=10, period=IntervalSchedule.SECONDS)
    plain = PeriodicTask.objects.create(name="plain", task="tests.jobsapp.tasks.plain_ping", interval=interval)
    saved = submit(admin_client, f"/admin/django_celery_beat/periodictask/{plain.id}/change/",
                   {"kwargs": '{"anything": [1, 2]}'})
    assert saved.status_code == 302
    assert json.loads(PeriodicTask.objects.get(id=plain.id).kwargs) == {"anything": [1, 2]}


# --- 4. The command ------------------------------------------------------------------------------------

def test_run_cron_task_param_runs_with_the_values_as_their_types(marker):
    out = io.StringIO()
    call_command("run_cron_task", "param-report", "2026-11-29", param=["region=us", "dry_run=true",
                 "day=2026-11-30", "since=2026-12-01T18:00", "limit=7"], stdout=out)
    assert "param-report 2026-11-29T00:00:00Z with region=us, dry_run=true, day=2026-11-30" in out.getvalue()
    [line] = [json.loads(text) for text in marker.read_text().splitlines()]
    assert line["kwargs"] == {"region": ["str", "us"], "dry_run": ["bool", True], "day": ["date", "2026-11-30"],
                              "limit": ["int", 7], "ratio": ["float", 0.5],
                              "since": ["datetime", "2026-12-01T18:00:00+00:00"], "note": ["str", ""]}
    assert line["run_params"] == sorted(line["kwargs"])
    row = CronExecution.objects.get(task_code=REPORT.code)
    assert (row.trigger, row.params_given, row.params["since"]) == (Trigger.MANUAL, True, "2026-12-01T18:00:00+00:00")
    call_command("run_cron_task", "param-report", "2026-11-29", stdout=io.StringIO())  # the regular run: it runs
    assert [status for _, status, *_ in rows()] == [Status.SUCCEEDED, Status.SUCCEEDED]


@pytest.mark.parametrize(("job", "given", "fragment"), [
    ("param-report", ["region=asia"], "region: expected one of 'eu', 'us', not 'asia'"),
    ("param-report", ["limit=many"], "limit: expected a whole number, not 'many'"),
    ("param-report", ["colour=red"], "unknown parameter 'colour' (it accepts region, day, dry_run, limit, ratio, "
                                     "since, note)"),
    ("param-report", ["region"], "--param: expected NAME=VALUE (e.g. region=us), not 'region'"),
    ("param-sync", [], "partner: required (str, no default), and not given"),
    ("calc-commission", ["region=us"], "unknown parameter 'region' (it declares no parameters)"),
])
def test_run_cron_task_refuses_a_bad_param_naming_it_and_records_nothing(job, given, fragment):
    with pytest.raises(CommandError) as refused:
        call_command("run_cron_task", job, "2026-11-29", param=given, enqueue=job == "param-sync")
    assert fragment in str(refused.value) and refused.value.returncode == 1
    assert not CronExecution.objects.exists()


def test_run_cron_task_enqueue_and_schedule_keep_the_values_on_the_row(queue):
    call_command("run_cron_task", "param-sync", "2026-11-29", param=["partner=acme", "full=yes"], enqueue=True,
                 stdout=io.StringIO())
    row = CronExecution.objects.get(task_code=SYNC.code)
    assert (row.status, row.params, row.params_given) == (Status.PENDING, {"partner": "acme", "full": True}, True)
    [message] = queue.headers()
    assert message["cron_execution_id"] == row.id and "partner" not in json.dumps(message)  # the row, not the message
    at = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)).replace(second=0, microsecond=0)
    call_command("run_cron_task", "param-report", at=at.isoformat(), schedule=True, param=["region=us"],
                 stdout=io.StringIO())
    one_off = CronExecution.objects.get(task_code=REPORT.code, trigger=Trigger.ONE_OFF)
    assert (one_off.params, one_off.params_given, one_off.celery_task_id) == ({"region": "us"}, True, "")


# --- 5. The run endpoint --------------------------------------------------------------------------------

def post_run(client: Any, job: str, body: object, **kwargs: Any) -> Any:
    from django.conf import settings
    from django.test import override_settings

    tokens = {"ops": {"token": TOKEN, "scopes": ["read", "run", "force"]}}
    with override_settings(CRON_CELERY={**settings.CRON_CELERY, "API_TOKENS": tokens}):
        if kwargs.get("form"):
            return client.post(f"/cron/run/{job}/", body, headers=BEARER)
        return client.post(f"/cron/run/{job}/", json.dumps(body), content_type="application/json", headers=BEARER)


def test_the_run_endpoint_sends_a_run_with_parameters(client, queue):
    sent = post_run(client, "param-report", {"date": "2026-11-29", "params": {"region": "us", "day": "2026-11-30",
                                                                               "dry_run": True}})
    assert sent.status_code == 202, sent.content
    assert sent.json()["params"] == {"region": "us", "day": "2026-11-30", "dry_run": True}
    row = CronExecution.objects.get(id=sent.json()["execution_id"])
    assert (row.trigger, row.params, row.params_given) == (Trigger.ENQUEUE, sent.json()["params"], True)
    form = post_run(client, "param-report", {"date": "2026-11-29", "params": '{"limit": 3}'}, form=True)
    assert form.status_code == 202 and CronExecution.objects.get(id=form.json()["execution_id"]).params == {"limit": 3}
    plain = post_run(client, "param-report", {"date": "2026-11-29", "params": {}})
    assert "params" not in plain.json()  # no values: the slot's regular run
    assert CronExecution.objects.get(id=plain.json()["execution_id"]).params_given is False
    from cron_celery.web import views

    summary = views.execution_summary(row)  # what status/ lists for it
    assert (summary["params"], summary["params_given"]) == ({"region": "us", "day": "2026-11-30", "dry_run": True},
                                                            True)


@pytest.mark.parametrize(("job", "body", "field", "fragment"), [
    ("param-report", {"params": {"region": "asia"}}, "region", "region: expected one of 'eu', 'us', not 'asia'"),
    ("param-report", {"params": {"limit": "3"}}, "limit", "limit: expected a whole number, not string '3'"),
    ("param-report", {"params": {"colour": 1}}, "colour", "unknown parameter 'colour'"),
    ("param-report", {"params": ["region", "us"]}, "params", "params must be an object"),
    ("param-sync", {"params": {"full": True}}, "partner", "partner: required"),
])
def test_the_run_endpoint_answers_400_naming_the_field(client, queue, job, body, field, fragment):
    refused = post_run(client, job, body)
    assert refused.status_code == 400
    assert refused.json()["field"] == field and fragment in refused.json()["error"]
    assert not CronExecution.objects.exists()


# --- 6. The admin: the action, the history, the export, the alerts -------------------------------------

def test_the_admin_action_shows_a_form_from_the_signature_and_sends_the_run(admin_client, queue):
    job_id = job_rows.job_id(REPORT)
    CronJob.objects.filter(id=job_id).update(params={"limit": 9})
    page = admin_client.post(DASHBOARD, {"action": "run_with_params", "_selected_action": [job_id]})
    html = page.content.decode()
    assert page.status_code == 200 and "Run param-report with parameters" in html
    for field in ("id_param_region", "id_param_day", "id_param_dry_run", "id_param_limit", "id_param_ratio",
                  "id_param_since", "id_param_note", "id_date", "id_force"):
        assert f'id="{field}"' in html, field
    assert 'name="param_limit" value="9"' in html  # its scheduled value, not its default (100)
    assert "int; default 100; its scheduled value (the periodic task&#x27;s kwargs) is 9" in html
    form = {"action": "run_with_params", "_selected_action": [job_id], "apply": "1", "param_region": "us",
            "param_day": "2026-11-30", "param_dry_run": "on", "param_limit": "9", "param_ratio": "0.25",
            "param_since": "2026-12-01 18:00", "param_note": "", "date": "2026-11-29"}
    bad = admin_client.post(DASHBOARD, {**form, "param_limit": "nine"})
    assert bad.status_code == 200 and "Enter a whole number" in bad.content.decode()
    assert not CronExecution.objects.exists()
    done = admin_client.post(DASHBOARD, form, follow=True)
    said = re.sub(r"<[^>]+>", "", done.content.decode())
    assert "Param-report: sent for 2026-11-29 00:00 UTC with region=us, day=2026-11-30, dry_run=true" in said
    row = CronExecution.objects.get(task_code=REPORT.code)
    assert (row.trigger, row.params_given, row.slot) == (Trigger.ADMIN, True, SLOT.replace(hour=0))
    assert row.params == {"region": "us", "day": "2026-11-30", "dry_run": True, "limit": 9, "ratio": 0.25,
                          "since": "2026-12-01T18:00:00+00:00", "note": ""}


def test_the_admin_action_takes_one_job_with_parameters(admin_client):
    two = admin_client.post(DASHBOARD, {"action": "run_with_params", "_selected_action": [
        job_rows.job_id(REPORT), job_rows.job_id(SYNC)]}, follow=True)
    assert "Run with parameters takes one job at a time" in two.content.decode()
    from tests.jobsapp import tasks as jobs

    none = admin_client.post(DASHBOARD, {"action": "run_with_params", "_selected_action": [
        job_rows.job_id(jobs.calc_commission.job)]}, follow=True)
    assert "Calc-commission declares no parameters: use “Run now”" in none.content.decode()
    assert not CronExecution.objects.exists()


def test_the_history_the_detail_page_and_the_export_show_the_values(admin_client):
    by_hand, _ = run_here(given={"region": "us", "dry_run": True})
    regular, _ = run_here(SLOT + dt.timedelta(days=1))
    listing = admin_client.get(f"{HISTORY}?job={job_rows.job_id(REPORT)}").content.decode()
    assert "<code title=\"region=us, dry_run=true\">region=us, dry_run=true</code>" in listing and ">given<" in listing
    detail = admin_client.get(f"{HISTORY}{by_hand.execution_id}/change/").content.decode()
    assert "<code>region</code>" in detail and "given by hand" in detail and "its default" in detail
    export = admin_client.post(HISTORY, {"action": "export_csv", "_selected_action": [by_hand.execution_id,
                                                                                    regular.execution_id]})
    table = list(csv.reader(io.StringIO(b"".join(export.streaming_content).decode())))  # type: ignore[attr-defined]
    assert table[0][-2:] == ["params", "params_given"]
    assert [line[-2:] for line in table[1:]] == [['{"region": "us", "dry_run": true}', "True"], ["", "False"]]


def test_re_running_a_run_with_parameters_sends_the_same_values_and_a_regular_one_the_scheduled_ones(
        admin_client, queue):
    CronJob.objects.filter(id=job_rows.job_id(REPORT)).update(params={"limit": 5})
    by_hand, _ = run_here(given={"region": "us"})
    regular, _ = run_here(SLOT + dt.timedelta(days=1))
    done = admin_client.post(HISTORY, {"action": "rerun", "_selected_action": [by_hand.execution_id,
                                                                             regular.execution_id]}, follow=True)
    assert "sent again with region=us, limit=5" in done.content.decode()
    again = {row.slot: (row.params, row.params_given)
             for row in CronExecution.objects.filter(task_code=REPORT.code, trigger=Trigger.ADMIN)}
    assert again == {SLOT: ({"region": "us", "limit": 5}, True),
                     SLOT + dt.timedelta(days=1): ({"limit": 5}, False)}


def test_an_alert_says_with_which_values_the_run_ran():
    outcome = runs.execute(REPORT, SLOT, lambda run: {"error": True, "message": "down"}, trigger=Trigger.MANUAL,
                           given={"region": "us"}, params_given=True)
    assert outcome.execution_id is not None
    execution = CronExecution.objects.get(id=outcome.execution_id)
    alert = Alert.objects.create(execution=execution, job=execution.job, event="FAILED", channel="webhook")
    message = delivery.message_for(alert)
    assert ("Parameters", "region=us (given by hand)") in message.facts()
    assert message.as_dict()["params"] == "region=us (given by hand)" and "Parameters: region=us" in message.text()


def test_send_run_refuses_a_run_that_could_only_fail_for_a_missing_value(queue):
    with pytest.raises(exceptions.InvalidParams, match="partner: required") as refused:
        tasks.send_run(SYNC, SLOT, Trigger.ENQUEUE)
    assert refused.value.field == "partner" and not CronExecution.objects.exists()
    CronJob.objects.filter(id=job_rows.job_id(SYNC)).update(params={"partner": "acme"})  # the scheduled value
    sent = tasks.send_run(SYNC, SLOT, Trigger.ENQUEUE)
    assert CronExecution.objects.get(id=sent.execution_id).params == {"partner": "acme"}


@pytest.mark.django_db(transaction=True)
def test_a_run_with_parameters_committed_while_the_beat_waits_for_the_job_never_swallows_its_slot():
    """The beat's round takes its snapshot, then waits for the job's row, which a person's run with
    parameters of the same slot holds; that run commits as run 1. The beat's slot is recorded after it
    (run 2), PENDING, to be sent. (Before: its insert met run 1, did nothing, and the job advanced past
    the slot: the slot's regular run was lost, unrecorded.)"""
    import threading
    import time

    from django.db import connection, connections, transaction

    from cron_celery.decisions import dispatch, executions
    from cron_celery.decisions import jobs as job_rows
    from cron_celery.models import CronExecution, Status, Trigger
    from tests.jobsapp import jobs_params

    slot = dt.datetime(2026, 11, 29, 1, 0, tzinfo=dt.UTC)
    report = jobs_params.param_report.job
    job_id = job_rows.job_id(report)
    result: dict[str, object] = {}

    def beat() -> None:
        try:
            decision = dispatch.Decision(job_id=job_id, expected_next_run_at=None,
                                         next_run_at=slot + dt.timedelta(hours=1), run=[slot], missed=[], tz=dt.UTC)
            result["beat"] = dispatch.dispatch_many([decision])
        finally:
            connections.close_all()

    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SELECT 1 FROM {executions.JOB} WHERE id = %s FOR UPDATE", [job_id])
        thread = threading.Thread(target=beat)
        thread.start()
        time.sleep(1.0)  # the beat's statement has its snapshot and waits for the job's row
        executions.insert(cursor, report, job_id, slot, slot.date(), Trigger.ENQUEUE, status="PENDING",
                          given={"region": "us"}, params_given=True)
    thread.join(10)
    beat_result = result["beat"]
    assert isinstance(beat_result, tuple)
    advanced, publish, missed = beat_result
    rows = list(CronExecution.objects.filter(job_id=job_id, slot=slot).order_by("run_number")
                .values_list("run_number", "status", "trigger", "params_given"))
    assert rows == [(1, Status.PENDING, Trigger.ENQUEUE, True), (2, Status.PENDING, Trigger.BEAT, False)]
    assert advanced == {job_id} and missed == 0
    assert [(item.slot, item.trigger) for item in publish] == [(slot, Trigger.BEAT)]
