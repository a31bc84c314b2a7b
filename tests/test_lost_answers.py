"""A statement whose commit landed but whose answer was lost with the connection, and a
heartbeat that races a claim: the cases an independent review found in the reconnecting run
path and in superseding a stale run (real PostgreSQL; the lost answer is an ``OperationalError``
raised after the real statement committed)."""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import pytest
from django.db import OperationalError, connection, connections

from cron_celery.decisions import claims, dispatch, executions, heartbeats, supersede
from cron_celery.models import CronExecution, Status, Trigger
from cron_celery.run import runs
from tests.conftest import expire_lease, make_job

pytestmark = pytest.mark.django_db(transaction=True)

SLOT = dt.datetime(2031, 3, 1, 1, 0, tzinfo=dt.UTC)


def _live_runs(job_id: int) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id, fence FROM {executions.EXE} WHERE job_id = %s AND status = 'RUNNING'"
                       " AND lease_until > now()", [job_id])
        return list(cursor.fetchall())


def _in_thread(target: Any) -> Any:
    """``target()`` on a connection of its own (another worker's heartbeat thread)."""
    result: list[Any] = []

    def body() -> None:
        try:
            result.append(target())
        finally:
            connections.close_all()

    thread = threading.Thread(target=body)
    thread.start()
    thread.join(30)
    return result[0] if result else None


def _answer_lost_once(monkeypatch: pytest.MonkeyPatch, name: str) -> list[Any]:
    """``claims.<name>`` commits, then its first call raises as if the connection dropped."""
    real = getattr(claims, name)
    calls: list[Any] = []

    def committed_then_lost(**kwargs: Any) -> Any:
        claim = real(**kwargs)
        calls.append(claim)
        if len(calls) == 1:
            raise OperationalError("server closed the connection unexpectedly")
        return claim

    monkeypatch.setattr(claims, name, committed_then_lost)
    return calls


def test_a_heartbeat_renewing_a_stale_run_while_the_next_run_is_claimed_leaves_one_live_run(monkeypatch):
    """The stale run's heartbeat (no job lock) commits between the claim's look at the job and
    the superseding: the stale run is superseded anyway, and its next heartbeat is refused."""
    job, job_id = make_job("standard", "skip")
    first = claims.begin(job=job, job_id=job_id, slot=SLOT, execution_date=SLOT.date(), trigger=Trigger.MANUAL,
                         lease_seconds=60)
    assert first.claimed and first.execution_id is not None and first.fence is not None
    expire_lease(first.execution_id)  # its worker froze: the lease runs out
    real = supersede.stale_runs
    renewed: list[Any] = []
    stale_id, stale_fence = first.execution_id, first.fence

    def racing(cursor: Any, job_: Any, job_id_: int, state: dict[str, Any], fence: int) -> None:
        renewed.append(_in_thread(lambda: heartbeats.heartbeat(stale_id, stale_fence, 60)))
        real(cursor, job_, job_id_, state, fence)

    monkeypatch.setattr(supersede, "stale_runs", racing)
    later = SLOT + dt.timedelta(hours=1)
    second = claims.begin(job=job, job_id=job_id, slot=later, execution_date=later.date(), trigger=Trigger.MANUAL,
                          lease_seconds=60)
    assert renewed == [True] and second.claimed
    assert not heartbeats.heartbeat(first.execution_id, first.fence, 60)
    assert [row[0] for row in _live_runs(job_id)] == [second.execution_id]


def test_a_claim_of_an_execution_whose_answer_was_lost_runs_the_body_once(monkeypatch):
    """A beat slot: the claim committed, its answer was lost, the repeat finds the execution
    RUNNING by this very process and takes it as its own (before: a duplicate, and the run lost)."""
    job, job_id = make_job("standard", "skip", max_retries=0)
    execution_id, _ = dispatch.enqueue(job=job, job_id=job_id, slot=SLOT, execution_date=SLOT.date(),
                                     trigger=Trigger.BEAT)
    calls = _answer_lost_once(monkeypatch, "begin")
    bodies: list[int | None] = []
    outcome = runs.execute(job, SLOT, lambda run: bodies.append(run.execution_id) or "ok", trigger=Trigger.BEAT,
                           execution_id=execution_id)
    assert len(calls) == 2 and bodies == [execution_id]
    row = CronExecution.objects.get(id=execution_id)
    assert (outcome.status, row.status, row.retry_count) == (Status.SUCCEEDED, Status.SUCCEEDED, 0)


@pytest.mark.parametrize("pattern, overlap", [("always", "skip"), ("always", "allow")])
def test_a_claim_that_inserts_an_execution_is_not_repeated_after_a_lost_answer(monkeypatch, pattern, overlap):
    """An in-process run inserts its execution: repeating it would insert a second (skipped
    against the first, or run twice once the reconciler retried the orphan). The error is
    raised instead; the one row it made is the reconciler's to end."""
    job, job_id = make_job(pattern, overlap, max_retries=1)
    calls = _answer_lost_once(monkeypatch, "begin" if overlap == "skip" else "_claim_new")
    bodies: list[int | None] = []
    with pytest.raises(OperationalError):
        runs.execute(job, SLOT, lambda run: bodies.append(run.execution_id) or "ok", trigger=Trigger.MANUAL)
    assert len(calls) == 1 and bodies == []
    assert list(CronExecution.objects.filter(job_id=job_id).values_list("status", flat=True)) == [Status.RUNNING]
