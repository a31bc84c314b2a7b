"""``run.previous`` and ``run.last_success``: what a run is told of its job's history, read with its
claim (the quick claim's statement, the full claim's transaction, a claim found again after a lost
answer), against the real database."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from cron_celery.decisions import claims, dispatch, finishes, heartbeats
from cron_celery.decisions.previous import PreviousRun
from cron_celery.declaring import registry
from cron_celery.models import CronJob, Status, Trigger
from cron_celery.run import runs
from tests.conftest import make_job

pytestmark = pytest.mark.django_db(transaction=True)

SLOT = dt.datetime(2026, 11, 29, 1, 0, tzinfo=dt.UTC)
HOUR = dt.timedelta(hours=1)
Told = tuple[PreviousRun | None, PreviousRun | None]


def run(job: registry.Job, slot: dt.datetime, told: dict[tuple[dt.datetime, int], Told], result: Any = "ok",
        **options: Any) -> runs.Outcome:
    """One in-process run of ``job`` at ``slot`` whose body keeps what it was told and returns ``result``
    (raises for ``"fail"``)."""

    def body(current: runs.Run) -> Any:
        told[(current.slot, current.run_number)] = (current.previous, current.last_success)
        if result == "fail":
            raise RuntimeError("the export failed")
        return result

    return runs.execute(job, slot, body, trigger=Trigger.MANUAL, **options)


def seen(run: PreviousRun | None) -> tuple[dt.datetime, int, str, Any] | None:
    return None if run is None else (run.slot, run.run_number, run.status, run.result)


def test_a_run_is_told_the_previous_run_and_the_last_success_by_slot_order():
    job, job_id = make_job(pattern="always", overlap="allow", schedule="0 * * * *")
    told: dict[tuple[dt.datetime, int], Told] = {}
    assert run(job, SLOT, told, {"rows": 10}).ok
    assert told[(SLOT, 1)] == (None, None)  # a first run: nothing before it
    assert run(job, SLOT + HOUR, told, "fail").status == Status.FAILED
    previous, success = told[(SLOT + HOUR, 1)]
    assert seen(previous) == seen(success) == (SLOT, 1, Status.SUCCEEDED, {"rows": 10})
    assert previous is not None and previous.ok and previous.ended is not None and previous.trigger == Trigger.MANUAL
    assert run(job, SLOT + 2 * HOUR, told, "exported").ok
    previous, success = told[(SLOT + 2 * HOUR, 1)]
    assert seen(previous) == (SLOT + HOUR, 1, Status.FAILED, None) and not previous.ok  # type: ignore[union-attr]
    assert seen(success) == (SLOT, 1, Status.SUCCEEDED, {"rows": 10})
    # A backfilled day is told about the days before it, not about the newest run.
    assert run(job, SLOT - HOUR, told).ok
    assert told[(SLOT - HOUR, 1)] == (None, None)
    # A second run of a slot is told about the slot's first.
    assert run(job, SLOT + 2 * HOUR, told, "again").ok
    assert seen(told[(SLOT + 2 * HOUR, 2)][0]) == (SLOT + 2 * HOUR, 1, Status.SUCCEEDED, "exported")
    # A skipped slot did not run: the run after it is told about the run before it.
    CronJob.objects.filter(id=job_id).update(paused=True)
    assert run(job, SLOT + 3 * HOUR, told).status == Status.SKIPPED
    CronJob.objects.filter(id=job_id).update(paused=False)
    assert run(job, SLOT + 4 * HOUR, told, "later").ok
    assert seen(told[(SLOT + 4 * HOUR, 1)][0]) == (SLOT + 2 * HOUR, 2, Status.SUCCEEDED, "again")


def claimed(job: registry.Job, job_id: int, slot: dt.datetime, **options: Any) -> claims.Claim:
    options.setdefault("trigger", Trigger.MANUAL)
    claim = claims.begin(job=job, job_id=job_id, slot=slot, execution_date=slot.date(), worker="w1", pid=7,
                         **options)
    assert claim.claimed, claim
    return claim


def finished(job_id: int, claim: claims.Claim, status: str = Status.SUCCEEDED, result: Any = None) -> None:
    assert claim.execution_id is not None and claim.fence is not None
    assert finishes.finish(job_id=job_id, execution_id=claim.execution_id, fence=claim.fence, status=status,
                           result=result, history=False)


@pytest.mark.parametrize("path", ["a new run", "the beat's message", "a retry", "a claim found again",
                                  "a full claim"])
def test_every_path_of_the_claim_tells_the_run_the_same_history(path: str):
    """The quick claims of a new row and of a message's PENDING row, the full claim of a RETRYING one
    (``_take_row``), a claim this process made and found again after the answer was lost, and the full
    path's insert (another server holds the job's lock: the overlap is read in the database) all read
    the previous run and the last success."""
    job, job_id = make_job(max_retries=1, schedule="0 * * * *")
    finished(job_id, claimed(job, job_id, SLOT), result=[1, 2])
    finished(job_id, claimed(job, job_id, SLOT + HOUR), Status.FAILED)
    later = SLOT + 2 * HOUR
    claim: claims.Claim | None
    if path == "a new run":
        claim = claimed(job, job_id, later)
    elif path == "the beat's message":
        execution_id, _ = dispatch.enqueue(job=job, job_id=job_id, slot=later, execution_date=later.date(),
                                           trigger=Trigger.BEAT)
        claim = claimed(job, job_id, later, execution_id=execution_id, trigger=Trigger.BEAT)
    elif path == "a retry":
        first = claimed(job, job_id, later)
        assert first.execution_id is not None and first.fence is not None
        assert finishes.retry(job_id=job_id, execution_id=first.execution_id, fence=first.fence,
                              status=Status.FAILED, message="", error_code="", traceback="", countdown=0)
        claim = claimed(job, job_id, later, execution_id=first.execution_id, trigger=Trigger.MANUAL)
        assert claim.retry_count == 1
    elif path == "a claim found again":
        first = claimed(job, job_id, later)
        assert first.execution_id is not None
        claim = heartbeats.own_claim(first.execution_id, "w1", 7)
    else:
        claim = claimed(job, job_id, later, lock_busy=True)
    assert claim is not None
    assert seen(claim.previous) == (SLOT + HOUR, 1, Status.FAILED, None)
    assert seen(claim.last_success) == (SLOT, 1, Status.SUCCEEDED, [1, 2])


def test_the_history_is_read_as_the_claim_saw_it():
    """An earlier slot that ends after the claim does not change what the run was told: both are read
    once, with the claim; a run of an overlap-allow job whose predecessor still runs is told about the
    one before that."""
    job, job_id = make_job(pattern="always", overlap="allow", schedule="0 * * * *")
    finished(job_id, claimed(job, job_id, SLOT), result="first")
    still_running = claimed(job, job_id, SLOT + HOUR)
    claim = claimed(job, job_id, SLOT + 2 * HOUR)
    finished(job_id, still_running, result="second")
    assert seen(claim.previous) == seen(claim.last_success) == (SLOT, 1, Status.SUCCEEDED, "first")
    told: dict[tuple[dt.datetime, int], Told] = {}
    assert run(job, SLOT + 3 * HOUR, told).ok
    assert seen(told[(SLOT + 3 * HOUR, 1)][1]) == (SLOT + HOUR, 1, Status.SUCCEEDED, "second")
