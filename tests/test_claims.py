"""Every branch of the SQL that decides whether a slot runs (claims.py, finishes.py, dispatch.py, jobs.py)."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from cron_celery import models
from cron_celery.decisions import claims, dispatch, executions, finishes, heartbeats
from cron_celery.decisions import jobs as job_rows
from cron_celery.models import CronExecution, CronJob, SkipReason, Status, Trigger
from tests.conftest import make_job

pytestmark = pytest.mark.django_db

SLOT = dt.datetime(2026, 11, 29, 1, 0, tzinfo=dt.UTC)
OTHER_SLOT = SLOT + dt.timedelta(hours=1)
DAY = SLOT.date()


def begin(job, job_id, slot=SLOT, **kw):
    return claims.begin(job=job, job_id=job_id, slot=slot, execution_date=slot.date(),
                        trigger=kw.pop("trigger", Trigger.MANUAL), lease_seconds=60, **kw)


def finish(job_id, claim, status=Status.SUCCEEDED, **kw):
    return finishes.finish(job_id=job_id, execution_id=claim.execution_id, fence=claim.fence,
                         status=status, **kw)


def expire(execution_id):
    CronExecution.objects.filter(id=execution_id).update(
        lease_until=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))


# --- the pure decision, every branch --------------------------------------------------

NOTHING = {"succeeded": False, "failed": False, "live": False, "stale": False, "job_live": False}


@pytest.mark.parametrize(
    ("pattern", "overlap", "state", "flags", "expected"),
    [
        ("standard", "skip", {}, {}, ""),
        ("standard", "skip", {"succeeded": True}, {}, SkipReason.ALREADY_RAN),
        ("standard", "skip", {"failed": True}, {}, SkipReason.ALREADY_RAN),
        ("standard", "skip", {"stale": True}, {}, SkipReason.ALREADY_RAN),
        ("standard", "skip", {"live": True}, {}, SkipReason.ALREADY_RUNNING),
        ("standard", "skip", {"succeeded": True}, {"rerun": True}, ""),
        ("standard", "skip", {"succeeded": True}, {"force": True}, ""),
        ("rerun_on_failure", "skip", {"failed": True}, {}, ""),
        ("rerun_on_failure", "skip", {"stale": True}, {}, ""),
        ("rerun_on_failure", "skip", {"succeeded": True}, {}, SkipReason.ALREADY_RAN),
        ("rerun_on_failure", "skip", {"live": True}, {}, SkipReason.ALREADY_RUNNING),
        ("always", "allow", {"succeeded": True, "live": True, "job_live": True}, {}, ""),
        ("always", "skip", {"job_live": True}, {}, SkipReason.OVERLAP),
        ("rate_limited", "allow", {"succeeded": True}, {}, ""),
        ("rate_limited", "allow", {"job_live": True}, {}, SkipReason.OVERLAP),
        ("standard", "allow", {"job_live": True}, {}, ""),
        ("standard", "skip", {"job_live": True}, {"force": True}, SkipReason.OVERLAP),
        ("standard", "skip", {}, {"paused": True}, SkipReason.PAUSED),
        ("standard", "skip", {}, {"paused": True, "force": True}, ""),
        ("standard", "skip", {}, {"paused": True, "rerun": True}, SkipReason.PAUSED),
        # An execution that already had an attempt (a retry, a takeover) owns its slot: only the
        # pause and the overlap apply to it.
        ("standard", "allow", {"succeeded": True}, {"attempted": True}, ""),
        ("standard", "allow", {"failed": True, "live": True}, {"attempted": True}, ""),
        ("rerun_on_failure", "skip", {"job_live": True}, {"attempted": True}, SkipReason.OVERLAP),
        ("standard", "skip", {}, {"attempted": True, "paused": True}, SkipReason.PAUSED),
        # max_concurrency=2 (see _CONCURRENT): the count of other live runs decides.
        ("always", "allow", {"job_live": True, "live_count": 1, "concurrent": 2}, {}, ""),
        ("always", "allow", {"job_live": True, "live_count": 2, "concurrent": 2}, {}, SkipReason.CONCURRENCY),
        ("always", "allow", {"job_live": True, "live_count": 2, "concurrent": 2}, {"force": True},
         SkipReason.CONCURRENCY),
        ("always", "allow", {"job_live": True, "live_count": 5}, {}, ""),  # no limit declared
        # A full concurrency group (groups.full gave its limit) refuses whatever the job's own count.
        ("always", "allow", {"group_full": 2}, {}, SkipReason.CONCURRENCY),
        ("always", "allow", {"group_full": 2}, {"force": True}, SkipReason.CONCURRENCY),
        ("always", "allow", {"group_full": None, "live_count": 1, "concurrent": 2}, {}, ""),
        ("standard", "skip", {"group_full": 2, "job_live": True}, {}, SkipReason.OVERLAP),
        # Older runs wait for the job's room: they go first (oldest first), forced or not.
        ("always", "skip", {"ahead": 1}, {}, SkipReason.OVERLAP),
        ("always", "skip", {"ahead": 1}, {"force": True}, SkipReason.OVERLAP),
        ("always", "allow", {"ahead": 1, "live_count": 1, "concurrent": 2}, {}, SkipReason.CONCURRENCY),
        ("always", "allow", {"ahead": 1, "live_count": 0, "concurrent": 2}, {}, ""),
        ("always", "allow", {"ahead": 3}, {}, ""),  # no limit: nothing waits for room
    ],
)
def test_decision_table(pattern, overlap, state, flags, expected):
    from cron_celery.declaring import registry

    limit = state.pop("concurrent", None)
    job = registry.declare(name="decide", code="D1", task_name="x", pattern=pattern, overlap=overlap,
                           max_concurrency=limit)
    got = claims._decide(job, {**NOTHING, **state}, paused=flags.get("paused", False),
                         force=flags.get("force", False), rerun=flags.get("rerun", False),
                         attempted=flags.get("attempted", False))
    assert got == expected


# --- begin: new executions --------------------------------------------------------------

def test_first_call_claims_a_new_execution_with_a_fence_and_lease():
    job, job_id = make_job()
    claim = begin(job, job_id, worker="host-a", pid=42)
    assert claim.claimed and claim.run_number == 1
    row = CronExecution.objects.get(id=claim.execution_id)
    assert row.status == Status.RUNNING and row.fence == claim.fence
    assert row.lease_until is not None and row.started is not None
    assert (row.worker, row.pid, row.task_code, row.task_name) == ("host-a", 42, job.code, job.name)
    assert row.execution_date == DAY and row.completed is False and row.success is None
    assert CronJob.objects.get(id=job_id).fence == claim.fence


def test_every_claim_gets_a_larger_fence():
    job, job_id = make_job(pattern="always", overlap="allow")
    fences = [begin(job, job_id).fence for _ in range(5)]
    assert fences == sorted(fences) and len(set(fences)) == 5


def test_standard_skips_a_slot_that_already_ran_and_records_the_skip():
    job, job_id = make_job("standard")
    first = begin(job, job_id)
    assert finish(job_id, first, Status.FAILED, message="boom")
    second = begin(job, job_id)
    assert second.outcome == Status.SKIPPED and second.skip_reason == SkipReason.ALREADY_RAN
    row = CronExecution.objects.get(id=second.execution_id)
    assert (row.status, row.run_number, row.completed, row.success) == (Status.SKIPPED, 2, True, None)
    assert "already ran" in row.message


def test_standard_reports_a_slot_in_flight_as_already_running():
    job, job_id = make_job("standard", overlap="allow")
    begin(job, job_id)
    claim = begin(job, job_id)
    assert claim.skip_reason == SkipReason.ALREADY_RUNNING


def test_standard_treats_a_dead_run_of_the_slot_as_already_ran():
    job, job_id = make_job("standard")
    first = begin(job, job_id)
    expire(first.execution_id)
    assert begin(job, job_id).skip_reason == SkipReason.ALREADY_RAN


def test_rerun_on_failure_runs_again_after_a_failure_but_not_after_a_success():
    job, job_id = make_job("rerun_on_failure")
    first = begin(job, job_id)
    finish(job_id, first, Status.FAILED)
    second = begin(job, job_id)
    assert second.claimed and second.run_number == 2
    finish(job_id, second, Status.SUCCEEDED)
    third = begin(job, job_id)
    assert third.skip_reason == SkipReason.ALREADY_RAN


def test_always_runs_every_call():
    job, job_id = make_job("always", overlap="allow")
    claims_ = [begin(job, job_id) for _ in range(3)]
    assert all(c.claimed for c in claims_)
    assert [c.run_number for c in claims_] == [1, 2, 3]


def test_rate_limited_never_runs_two_at_once_even_across_slots():
    job, job_id = make_job("rate_limited", overlap="allow")
    first = begin(job, job_id)
    assert begin(job, job_id, slot=OTHER_SLOT).skip_reason == SkipReason.OVERLAP
    finish(job_id, first)
    assert begin(job, job_id, slot=OTHER_SLOT).claimed
    assert begin(job, job_id, slot=SLOT).skip_reason == SkipReason.OVERLAP


def test_overlap_skip_refuses_another_slot_while_one_runs_and_allow_permits_it():
    job, job_id = make_job("standard", overlap="skip")
    begin(job, job_id)
    assert begin(job, job_id, slot=OTHER_SLOT).skip_reason == SkipReason.OVERLAP
    job2, job2_id = make_job("standard", overlap="allow")
    begin(job2, job2_id)
    assert begin(job2, job2_id, slot=OTHER_SLOT).claimed


def test_overlap_ignores_runs_whose_lease_expired():
    job, job_id = make_job("standard", overlap="skip")
    first = begin(job, job_id)
    expire(first.execution_id)
    assert begin(job, job_id, slot=OTHER_SLOT).claimed


def test_paused_job_is_skipped_unless_forced():
    job, job_id = make_job("standard")
    CronJob.objects.filter(id=job_id).update(paused=True)
    assert begin(job, job_id).skip_reason == SkipReason.PAUSED
    assert begin(job, job_id, rerun=True).skip_reason == SkipReason.PAUSED
    forced = begin(job, job_id, force=True)
    assert forced.claimed
    assert CronExecution.objects.get(id=forced.execution_id).forced is True


def test_rerun_and_force_run_a_slot_that_succeeded_as_a_new_run_number():
    job, job_id = make_job("standard")
    finish(job_id, begin(job, job_id))
    rerun = begin(job, job_id, rerun=True)
    assert rerun.claimed and rerun.run_number == 2
    finish(job_id, rerun)
    forced = begin(job, job_id, force=True)
    assert forced.claimed and forced.run_number == 3


# --- begin: executions that already exist (messages from beat / --enqueue) --------------

def enqueue(job, job_id, slot=SLOT, **kw):
    return dispatch.enqueue(job=job, job_id=job_id, slot=slot, execution_date=slot.date(),
                          trigger=Trigger.ENQUEUE, **kw)


def test_a_pending_execution_is_claimed_in_place():
    job, job_id = make_job("standard")
    execution_id, run_number = enqueue(job, job_id)
    assert CronExecution.objects.get(id=execution_id).status == Status.PENDING
    claim = begin(job, job_id, execution_id=execution_id, celery_task_id="abc")
    assert claim.claimed and claim.execution_id == execution_id and claim.run_number == run_number
    row = CronExecution.objects.get(id=execution_id)
    assert (row.status, row.celery_task_id, row.retry_count) == (Status.RUNNING, "abc", 0)
    assert CronExecution.objects.count() == 1


@pytest.mark.parametrize("status", sorted(Status.terminal()))
def test_a_delivery_of_a_finished_execution_is_a_duplicate_and_writes_nothing(status):
    job, job_id = make_job("standard")
    execution_id, _ = enqueue(job, job_id)
    CronExecution.objects.filter(id=execution_id).update(status=status, message="kept")
    before = list(CronExecution.objects.values())
    claim = begin(job, job_id, execution_id=execution_id)
    assert claim.outcome == claims.DUPLICATE and claim.status_seen == status
    assert list(CronExecution.objects.values()) == before


def test_a_delivery_of_an_execution_running_elsewhere_is_a_duplicate():
    job, job_id = make_job("standard")
    execution_id, _ = enqueue(job, job_id)
    first = begin(job, job_id, execution_id=execution_id)
    again = begin(job, job_id, execution_id=execution_id)
    assert again.outcome == claims.DUPLICATE and again.status_seen == Status.RUNNING
    assert CronExecution.objects.get(id=execution_id).fence == first.fence


def test_a_delivery_for_an_unknown_execution_is_a_duplicate():
    job, job_id = make_job("standard")
    claim = begin(job, job_id, execution_id=987654321)
    assert claim.outcome == claims.DUPLICATE and claim.status_seen == "MISSING"
    assert not CronExecution.objects.exists()


def test_an_expired_running_execution_is_taken_over_with_a_new_fence_and_attempt():
    job, job_id = make_job("standard", max_retries=1)  # a takeover is an attempt: it needs one left
    execution_id, _ = enqueue(job, job_id)
    first = begin(job, job_id, execution_id=execution_id)
    expire(execution_id)
    second = begin(job, job_id, execution_id=execution_id)
    assert second.claimed and second.fence > first.fence and second.retry_count == 1
    # the stale worker can neither renew nor finish
    assert heartbeats.heartbeat(execution_id, first.fence, 60) is False
    assert finish(job_id, first, Status.SUCCEEDED, message="stale") is False
    assert finish(job_id, second, Status.SUCCEEDED, message="fresh") is True
    assert CronExecution.objects.get(id=execution_id).message == "fresh"


def test_a_pending_execution_is_skipped_in_place_when_the_pattern_says_so():
    job, job_id = make_job("standard")
    finish(job_id, begin(job, job_id))
    execution_id, _run_number = enqueue(job, job_id)
    claim = begin(job, job_id, execution_id=execution_id)
    assert claim.outcome == Status.SKIPPED and claim.execution_id == execution_id
    assert CronExecution.objects.get(id=execution_id).skip_reason == SkipReason.ALREADY_RAN
    assert CronExecution.objects.count() == 2


def test_a_forced_enqueued_execution_runs_past_the_slot_check():
    job, job_id = make_job("standard")
    finish(job_id, begin(job, job_id))
    execution_id, _ = enqueue(job, job_id, forced=True)
    assert begin(job, job_id, execution_id=execution_id, force=True).claimed


def test_a_new_run_takes_the_next_run_number_after_a_pending_one():
    job, job_id = make_job("always", overlap="allow")
    enqueue(job, job_id)  # run 1, PENDING
    claim = begin(job, job_id)
    assert claim.claimed and claim.run_number == 2


# --- heartbeat and finish ---------------------------------------------------------------

def test_heartbeat_extends_the_lease_only_for_the_current_fence():
    job, job_id = make_job()
    claim = begin(job, job_id)
    expire(claim.execution_id)
    assert heartbeats.heartbeat(claim.execution_id, claim.fence, 60) is True
    row = CronExecution.objects.get(id=claim.execution_id)
    assert row.lease_until > dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
    assert heartbeats.heartbeat(claim.execution_id, claim.fence - 1, 60) is False


def test_finish_writes_status_result_and_the_job_aggregates_in_one_go():
    job, job_id = make_job("always", overlap="allow")
    failed = begin(job, job_id)
    assert finish(job_id, failed, Status.FAILED, message="nope", error_code="E1", traceback="tb")
    assert CronJob.objects.get(id=job_id).consecutive_failures == 1
    ok = begin(job, job_id)
    assert finish(job_id, ok, Status.SUCCEEDED, message="fine", result={"n": 3})
    row = CronExecution.objects.get(id=ok.execution_id)
    assert (row.status, row.success, row.completed, row.result) == (Status.SUCCEEDED, True, True, {"n": 3})
    assert row.ended is not None and row.lease_until is None
    failed_row = CronExecution.objects.get(id=failed.execution_id)
    assert (failed_row.success, failed_row.error_code, failed_row.traceback) == (False, "E1", "tb")
    job_row = CronJob.objects.get(id=job_id)
    assert job_row.consecutive_failures == 0 and job_row.last_status == Status.SUCCEEDED
    assert job_row.last_success_at is not None


def test_finish_twice_is_refused_the_second_time():
    job, job_id = make_job()
    claim = begin(job, job_id)
    assert finish(job_id, claim, Status.SUCCEEDED, message="first")
    assert not finish(job_id, claim, Status.FAILED, message="second")
    row = CronExecution.objects.get(id=claim.execution_id)
    assert (row.status, row.message) == (Status.SUCCEEDED, "first")
    assert CronJob.objects.get(id=job_id).consecutive_failures == 0


def test_ensure_job_is_idempotent_and_follows_the_declaration():
    job, job_id = make_job("standard")
    assert job_rows.ensure_job(job) == job_id
    from cron_celery.declaring import registry

    changed = registry.declare(name=job.name, code=job.code, task_name=job.task_name, pattern="always")
    assert job_rows.ensure_job(changed) == job_id
    assert CronJob.objects.get(id=job_id).pattern == models.ExecutionPattern.ALWAYS


def test_ensure_jobs_upserts_many_rows_in_one_statement_and_falls_back_on_a_stale_name():
    from cron_celery.declaring import registry

    jobs = [make_job()[0] for _ in range(3)]
    ids = {job.code: CronJob.objects.get(code=job.code).id for job in jobs}
    changed = [registry.declare(name=job.name, code=job.code, task_name=job.task_name, pattern="always")
               for job in jobs]
    new = registry.declare(name=f"{jobs[0].name}-fresh", code=f"{jobs[0].code}-F", task_name="x.fresh")
    with CaptureQueriesContext(connection) as queries:
        found = job_rows.ensure_jobs([*changed, new])
    assert len([q for q in queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))]) == 2
    assert {code: found[code] for code in ids} == ids and new.code in found
    assert set(CronJob.objects.filter(code__in=ids).values_list("pattern", flat=True)) == {"always"}
    # A new code under an existing row's name: the bulk statement fails, each job is retried alone.
    clash = registry.declare(name=jobs[1].name, code=f"{jobs[1].code}-B", task_name="x.clash")
    again = job_rows.ensure_jobs([changed[0], clash])
    assert again[changed[0].code] == ids[jobs[0].code] and again[clash.code] not in ids.values()
    assert CronJob.objects.get(id=ids[jobs[1].code]).name == f"{jobs[1].name}-was-{jobs[1].code}"


def test_the_database_refuses_two_executions_with_the_same_run_number():
    from django.db import IntegrityError, transaction

    job, job_id = make_job()
    enqueue(job, job_id)
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {executions.EXE} (job_id, task_code, task_name, slot, execution_date, run_number,"
            " status, trigger, skip_reason, forced, created_at, completed, message, error_code,"
            " traceback, retry_count, celery_task_id, worker) VALUES (%s, 'x', 'x', %s, %s, 1,"
            " 'PENDING', 'BEAT', '', false, now(), false, '', '', '', 0, '', '')",
            [job_id, SLOT, DAY],
        )


# --- the one-statement claim and ensure_job ---------------------------------------------

def test_the_one_statement_claim_falls_back_to_the_full_path_for_a_paused_job():
    job, job_id = make_job("always", overlap="allow")
    assert not claims._needs_state(job, None, False, False)
    CronJob.objects.filter(id=job_id).update(paused=True)
    assert claims._claim_new(job=job, job_id=job_id, slot=SLOT, execution_date=DAY,
                             trigger=Trigger.MANUAL, forced=False, celery_task_id="", worker="",
                             pid=None, lease_seconds=60) is None
    assert begin(job, job_id).skip_reason == SkipReason.PAUSED


def test_the_one_statement_claim_yields_on_a_run_number_taken_meanwhile():
    job, job_id = make_job("always", overlap="allow")
    enqueue(job, job_id)  # run 1 is taken by a PENDING execution
    fast = claims._claim_new(job=job, job_id=job_id, slot=SLOT, execution_date=DAY,
                             trigger=Trigger.MANUAL, forced=False, celery_task_id="", worker="",
                             pid=None, lease_seconds=60)
    assert fast is not None and fast.run_number == 2  # it reads the committed rows
    missing = claims._claim_new(job=job, job_id=job_id + 10_000, slot=SLOT, execution_date=DAY,
                                trigger=Trigger.MANUAL, forced=False, celery_task_id="", worker="",
                                pid=None, lease_seconds=60)
    assert missing is None
    with pytest.raises(claims.JobRowMissing):
        begin(job, job_id + 10_000)


def test_a_renamed_job_keeps_its_row_and_a_stale_name_is_moved_aside():
    from cron_celery.declaring import registry

    job, job_id = make_job()
    renamed = registry.declare(name=f"{job.name}-new", code=job.code, task_name=job.task_name)
    assert job_rows.ensure_job(renamed) == job_id
    assert CronJob.objects.get(id=job_id).name == renamed.name
    # A new code under the old row's name: the old row is renamed out of the way.
    other = registry.declare(name=renamed.name, code=f"{job.code}-B", task_name="x.y")
    other_id = job_rows.ensure_job(other)
    assert other_id != job_id
    assert CronJob.objects.get(id=job_id).name == f"{renamed.name}-was-{job.code}"


def test_an_expired_run_on_its_last_attempt_is_not_taken_over():
    """A redelivered message must not give a job more attempts than ``max_retries`` allows
    (a job that kills its whole worker would loop): the caller records it LOST instead."""
    job, job_id = make_job("standard", max_retries=0)
    execution_id, _ = enqueue(job, job_id)
    begin(job, job_id, execution_id=execution_id)
    expire(execution_id)
    again = begin(job, job_id, execution_id=execution_id)
    assert (again.outcome, again.status_seen) == (claims.DUPLICATE, claims.CAPPED)
    assert CronExecution.objects.get(id=execution_id).status == Status.RUNNING  # unchanged here
