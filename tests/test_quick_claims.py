"""The one-round-trip claims (cron_celery/decisions/quick_claims.py): a run nothing stands in the way of
is claimed in one query; anything else is left to the full claim, which decides as before; and a
claim that committed while the query waited for the job's row is never run past."""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction
from django.db.models import F
from django.test.utils import CaptureQueriesContext

from cron_celery.decisions import claims, dispatch
from cron_celery.models import CronExecution, CronJob, SkipReason, Status, Trigger
from tests.conftest import make_job, wait_for

SLOT = dt.datetime(2026, 11, 29, 1, 0, tzinfo=dt.UTC)


def begin(job: Any, job_id: int, **kw: Any) -> claims.Claim:
    return claims.begin(job=job, job_id=job_id, slot=SLOT, execution_date=SLOT.date(),
                        trigger=kw.pop("trigger", Trigger.BEAT), lease_seconds=60, **kw)


def pending(job: Any, job_id: int, trigger: str = Trigger.BEAT, **kw: Any) -> int:
    """A PENDING execution of the slot, as the beat (or run_cron_task --enqueue) writes it."""
    execution_id, _ = dispatch.enqueue(job=job, job_id=job_id, slot=SLOT, execution_date=SLOT.date(),
                                       trigger=trigger, **kw)
    return execution_id


def claimed_in_statements(job: Any, job_id: int, **kw: Any) -> tuple[claims.Claim, int]:
    with CaptureQueriesContext(connection) as queries:
        claim = begin(job, job_id, **kw)
    return claim, len(queries.captured_queries)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("pattern", "overlap"), [("standard", "skip"), ("standard", "allow"),
                                                  ("rerun_on_failure", "skip"), ("always", "skip")])
def test_the_beats_pending_execution_is_claimed_in_one_statement(pattern: str, overlap: str) -> None:
    job, job_id = make_job(pattern, overlap)
    execution_id = pending(job, job_id)
    fence_before = CronJob.objects.get(id=job_id).fence
    claim, statements = claimed_in_statements(job, job_id, execution_id=execution_id, celery_task_id="t-1",
                                              worker="w#1", pid=7)
    assert statements == 1
    assert (claim.outcome, claim.execution_id, claim.run_number) == (Status.RUNNING, execution_id, 1)
    row = CronExecution.objects.get(id=execution_id)
    assert (row.status, row.fence, row.worker, row.pid, row.celery_task_id) == (
        Status.RUNNING, fence_before + 1, "w#1", 7, "t-1")
    assert row.started is not None and row.lease_until is not None and row.lease_until > row.started
    # The same message delivered again finds the row running: the full claim calls it a duplicate.
    again, statements = claimed_in_statements(job, job_id, execution_id=execution_id)
    assert statements > 1 and (again.outcome, again.status_seen) == (claims.DUPLICATE, Status.RUNNING)


@pytest.mark.django_db(transaction=True)
def test_a_new_run_of_a_standard_exclusive_job_is_claimed_in_one_statement() -> None:
    job, job_id = make_job("standard", "skip")
    claim, statements = claimed_in_statements(job, job_id, trigger=Trigger.MANUAL)
    assert statements == 1 and claim.claimed and claim.run_number == 1
    # The slot is now taken and the job busy: the full claim decides, and skips.
    second, statements = claimed_in_statements(job, job_id, trigger=Trigger.MANUAL)
    assert statements > 1 and second.skip_reason == SkipReason.ALREADY_RUNNING


def _checks(job: Any, execution_id: int | None) -> tuple[bool, bool]:
    checks = claims._quick_checks(job, execution_id, False, False)
    assert checks is not None  # the job is one the quick claim is tried for
    return checks


def _other_runs(job_id: int, status: str, *, slot: dt.datetime = SLOT, live: bool = True,
                params_given: bool = False) -> CronExecution:
    """Another execution of the job, written as the full claim or a finish would leave it."""
    return CronExecution.objects.create(
        job_id=job_id, task_code="X", task_name="x", slot=slot, execution_date=slot.date(), run_number=9,
        status=status, trigger=Trigger.BEAT, params_given=params_given, fence=1 if status == Status.RUNNING else None,
        lease_until=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1 if live else -1),
        started=None if status in (Status.PENDING, Status.RETRYING) else dt.datetime.now(dt.UTC))  # it ran


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("pattern", "overlap", "other", "expected"), [
    # the slot's regular run is taken, running, or waiting elsewhere: the slot check
    ("standard", "allow", {"status": Status.SUCCEEDED}, SkipReason.ALREADY_RAN),
    ("standard", "allow", {"status": Status.FAILED}, SkipReason.ALREADY_RAN),
    ("standard", "allow", {"status": Status.PENDING}, SkipReason.ALREADY_RUNNING),
    ("rerun_on_failure", "allow", {"status": Status.FAILED}, ""),  # the full claim lets it run
    # another slot's run is RUNNING: the overlap check of an exclusive job, live or stale
    ("always", "skip", {"status": Status.RUNNING, "slot": SLOT - dt.timedelta(hours=1)}, SkipReason.OVERLAP),
    ("always", "skip", {"status": Status.RUNNING, "slot": SLOT - dt.timedelta(hours=1), "live": False}, ""),
])
def test_anything_in_the_way_leaves_the_decision_to_the_full_claim(pattern: str, overlap: str, other: dict[str, Any],
                                                                   expected: str) -> None:
    job, job_id = make_job(pattern, overlap)
    execution_id = pending(job, job_id)
    in_the_way = _other_runs(job_id, **other)
    assert claims._claim_pending(job_id=job_id, execution_id=execution_id, slot=SLOT, celery_task_id="",
                                 worker="", pid=None, lease_seconds=60, checks=_checks(job, execution_id)) is None
    claim = begin(job, job_id, execution_id=execution_id)
    assert claim.skip_reason == expected
    assert CronExecution.objects.get(id=execution_id).status == (Status.RUNNING if not expected else Status.SKIPPED)
    if other.get("live") is False:  # the stale run no longer owns the job: the claim's fence superseded it
        assert claim.fence is not None and CronExecution.objects.get(id=in_the_way.id).fence == claim.fence


@pytest.mark.django_db(transaction=True)
def test_a_run_with_a_persons_parameters_beside_the_slots_run_is_not_in_its_way() -> None:
    job, job_id = make_job("standard", "allow")
    execution_id = pending(job, job_id)
    _other_runs(job_id, Status.SUCCEEDED, params_given=True)
    claim, statements = claimed_in_statements(job, job_id, execution_id=execution_id)
    assert statements == 1 and claim.claimed


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("what", ["paused", "force", "rerun", "params_given", "limit"])
def test_the_full_claim_decides_a_paused_job_a_forced_or_rerun_row_and_a_limited_job(what: str) -> None:
    job, job_id = make_job("always", "allow", **({"max_concurrency": 2} if what == "limit" else {}))
    execution_id = pending(job, job_id, trigger=Trigger.BACKFILL)
    if what == "paused":
        CronJob.objects.filter(id=job_id).update(paused=True)
    elif what == "force":  # --force: past the pause too (the row's ``force``)
        CronExecution.objects.filter(id=execution_id).update(force=True, forced=True)
    elif what == "rerun":  # --rerun: past the slot check (the row's ``forced``)
        CronExecution.objects.filter(id=execution_id).update(forced=True)
    elif what == "params_given":
        CronExecution.objects.filter(id=execution_id).update(params_given=True)
    claim, statements = claimed_in_statements(job, job_id, execution_id=execution_id)
    assert statements > 1
    if what == "paused":  # a backfill slot waits for the resume
        assert (claim.outcome, claim.skip_reason) == (claims.WAITING, SkipReason.PAUSED)
    else:
        assert claim.claimed


def _watcher() -> psycopg.Connection[Any]:
    options = connection.settings_dict
    return psycopg.connect(host=options["HOST"], port=options["PORT"], user=options["USER"],
                           password=options["PASSWORD"] or None, dbname=options["NAME"], autocommit=True)


def _in_thread(target: Any) -> threading.Thread:
    def run() -> None:
        try:
            target()
        finally:
            connection.close()
    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", ["pending", "new"])
@pytest.mark.parametrize(("pattern", "overlap", "other_slot"), [
    ("standard", "allow", SLOT),  # the slot check
    ("always", "skip", SLOT - dt.timedelta(hours=1)),  # the overlap check
])
def test_a_claim_committed_while_the_statement_waited_for_the_jobs_row_is_never_run_past(
        pattern: str, overlap: str, other_slot: dt.datetime, path: str) -> None:
    """Another worker's full claim holds the job's row: it took the next fence and made its run
    RUNNING, not yet committed. The one-round-trip claim of the beat's PENDING row starts and waits
    for the row; the other commits. Had its checks read a snapshot taken before the wait (one
    statement locking and claiming at once did: both cases failed so), they would have seen nothing
    in the way and claimed a second run. Its claim statement runs once the lock is held, sees the
    other run and claims nothing; the full claim then skips. The same for a new run (``new``)."""
    job, job_id = make_job(pattern, overlap)
    execution_id = pending(job, job_id) if path == "pending" else None
    holding, release = threading.Event(), threading.Event()

    def other_claim() -> None:
        with transaction.atomic():
            CronJob.objects.filter(id=job_id).update(fence=F("fence") + 1)
            _other_runs(job_id, Status.RUNNING, slot=other_slot)
            holding.set()
            release.wait(30)

    answers: list[claims.Claim | None] = []

    def claim_quickly() -> None:
        if execution_id is None:
            answers.append(claims._claim_new(
                job=job, job_id=job_id, slot=SLOT, execution_date=SLOT.date(), trigger=Trigger.MANUAL, forced=False,
                celery_task_id="", worker="me#1", pid=1, lease_seconds=60, checks=_checks(job, None)))
            return
        answers.append(claims._claim_pending(
            job_id=job_id, execution_id=execution_id, slot=SLOT, celery_task_id="", worker="me#1", pid=1,
            lease_seconds=60, checks=_checks(job, execution_id)))

    holder = _in_thread(other_claim)
    try:
        assert holding.wait(30)
        claimer = _in_thread(claim_quickly)
        with _watcher() as watcher:
            def waits_for_the_row() -> bool:
                with watcher.cursor() as cursor:
                    cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                   "AND wait_event_type = 'Lock' AND query LIKE %s", ["%cron_celery_%"])
                    row = cursor.fetchone()
                    return bool(row and row[0])
            wait_for(waits_for_the_row, timeout=30, what="the quick claim to wait for the job's row")
    finally:
        release.set()
        holder.join(30)
    claimer.join(30)
    assert answers == [None]
    assert not CronExecution.objects.filter(job_id=job_id, worker="me#1").exists()
    if execution_id is not None:
        assert CronExecution.objects.get(id=execution_id).status == Status.PENDING
    claim = begin(job, job_id, execution_id=execution_id, trigger=Trigger.MANUAL)
    expected = SkipReason.ALREADY_RUNNING if pattern == "standard" else SkipReason.OVERLAP
    assert (claim.outcome, claim.skip_reason) == (Status.SKIPPED, expected)
