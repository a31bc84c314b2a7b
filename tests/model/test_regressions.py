"""Straight-line tests of what the model test (test_model.py) found, on real rows.

Each reproduces one counterexample's sequence with the real operations, and failed on the code
(or, where the model was wrong, on the model) it was found against.
"""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection

from cron_celery.decisions import claims, dispatch, executions, finishes, heartbeats, repairs
from cron_celery.declaring import registry
from cron_celery.models import Alert, CronExecution, CronJob, Trigger
from cron_celery.run import outcomes
from tests.conftest import expire_lease, make_job

pytestmark = pytest.mark.django_db

SLOT = dt.datetime(2031, 3, 1, 1, 0, tzinfo=dt.UTC)


def _live_runs(job_id: int) -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id FROM {executions.EXE} WHERE job_id = %s AND status = 'RUNNING'"
                       " AND lease_until > now()", [job_id])
        return [int(row[0]) for row in cursor.fetchall()]


def test_a_late_heartbeat_does_not_make_two_live_runs_of_an_exclusive_job() -> None:
    job, job_id = make_job("rate_limited", "skip")
    first = claims.begin(job=job, job_id=job_id, slot=SLOT, execution_date=SLOT.date(), trigger=Trigger.MANUAL,
                         lease_seconds=60)
    assert first.claimed and first.fence is not None and first.execution_id is not None
    expire_lease(first.execution_id)  # its worker froze: the lease runs out
    later = SLOT + dt.timedelta(hours=1)
    second = claims.begin(job=job, job_id=job_id, slot=later, execution_date=later.date(), trigger=Trigger.MANUAL,
                          lease_seconds=60)
    assert second.claimed  # the job was free: its only run had no live lease
    heartbeats.heartbeat(first.execution_id, first.fence, 60)  # the frozen worker comes back
    assert len(_live_runs(job_id)) <= 1, "two live runs of a rate_limited job"


def test_a_superseded_run_is_fenced_and_its_history_keeps_the_fence_it_ran_under() -> None:
    """The next run of an exclusive job starts once a frozen run's lease ran out: the frozen run's
    heartbeat and final write are refused, and the reconciler ends it LEASE_EXPIRED with the
    fence it ran under in its history (tests/faults/test_frozen.py does it with real workers)."""
    job, job_id = make_job("standard", "skip")
    first = claims.begin(job=job, job_id=job_id, slot=SLOT, execution_date=SLOT.date(), trigger=Trigger.MANUAL,
                         lease_seconds=60)
    assert first.claimed and first.fence is not None and first.execution_id is not None
    expire_lease(first.execution_id)  # its worker froze: the lease runs out
    later = SLOT + dt.timedelta(hours=1)
    second = claims.begin(job=job, job_id=job_id, slot=later, execution_date=later.date(), trigger=Trigger.MANUAL,
                          lease_seconds=60)
    assert second.claimed and second.fence is not None and second.fence > first.fence
    assert second.execution_id is not None
    assert not heartbeats.heartbeat(first.execution_id, first.fence, 60)
    assert not finishes.finish(job_id=job_id, execution_id=first.execution_id, fence=first.fence,
                             status="SUCCEEDED")
    ended = repairs.end_dead_attempts(job_id=job_id, status="LOST", error_code="LEASE_EXPIRED",
                                     message="its worker stopped renewing the lease", execution_id=first.execution_id)
    assert ended is not None and ended.status == "LOST"
    row = CronExecution.objects.get(id=first.execution_id)
    assert [(entry["attempt"], entry["fence"], entry["status"]) for entry in row.attempts] == [
        (1, first.fence, "LOST")]
    assert finishes.finish(job_id=job_id, execution_id=second.execution_id, fence=second.fence, status="SUCCEEDED")


@pytest.mark.parametrize("retried", [False, True], ids=["running-expired", "retrying"])
def test_two_workers_delivering_an_attempted_execution_of_a_paused_job_give_it_up_once(retried: bool) -> None:
    """The model's to-do: two workers receive the message of an attempted ``rerun_on_failure``/
    ``allow`` execution (an in-process run whose worker vanished, retried by the reconciler or not
    yet) at the same instant while its job is paused. Worst interleaving: both claims decide
    before either gives up. The execution ends once with its own failure (LOST, the give-up), the
    job counts one failure, and the second worker's call changes nothing — never CAPPED: attempts
    remain (``retry_count`` 0, or 1 of 1 but RETRYING, not a vanished last attempt)."""
    job, job_id = make_job("rerun_on_failure", "allow", max_retries=1)
    first = claims.begin(job=job, job_id=job_id, slot=SLOT, execution_date=SLOT.date(), trigger=Trigger.MANUAL,
                         lease_seconds=60)
    assert first.claimed and first.execution_id is not None
    execution_id = first.execution_id
    expire_lease(execution_id)
    if retried:  # the reconciler's first step: a lost attempt, retried
        ended = repairs.end_dead_attempts(job_id=job_id, status="LOST", error_code="LEASE_EXPIRED",
                                         message="lost", execution_id=execution_id)
        assert ended is not None and ended.status == "RETRYING" and ended.retry_count == 1
    CronJob.objects.filter(id=job_id).update(paused=True)
    decided = [claims.begin(job=job, job_id=job_id, slot=SLOT, execution_date=SLOT.date(), trigger=Trigger.MANUAL,
                            execution_id=execution_id) for _ in range(2)]
    assert [claim.outcome for claim in decided] == [claims.GIVE_UP, claims.GIVE_UP], decided
    given = [outcomes.given_up(job, job_id=job_id, execution_id=execution_id, note="not retried: the job is paused")
             for _ in decided]
    assert given[0] is not None and given[0].status == "LOST" and given[1] is None, given
    row = CronExecution.objects.get(id=execution_id)
    assert (row.status, row.retry_count) == ("LOST", 1 if retried else 0)
    assert CronJob.objects.get(id=job_id).consecutive_failures == 1
    later = claims.begin(job=job, job_id=job_id, slot=SLOT, execution_date=SLOT.date(), trigger=Trigger.MANUAL,
                         execution_id=execution_id)
    assert (later.outcome, later.status_seen) == (claims.DUPLICATE, "LOST")


def test_a_missed_slot_after_a_run_started_is_a_new_outage_and_alerts_again() -> None:
    """Found by the model (its own error: it ended an outage only when a run ended). The beat comes
    back late twice for an ``always`` job with catch-up ``latest``: each time the older slot is
    MISSED and the newer one runs. The run of the first return started before the second outage,
    so that outage alerts MISSED too — one alert per job and outage, outages told apart by slots."""
    job, job_id = make_job("always", "skip", catch_up="latest", notify={"on_failure": ["webhook"]})
    registry.register(job)  # the MISSED alert asks the registry for the job's channels
    try:
        _two_outages(job, job_id)
    finally:
        registry.unregister(job.name)


def _two_outages(job: registry.Job, job_id: int) -> None:
    def beat_back_late(missed: dt.datetime, run: dt.datetime, expected: dt.datetime | None) -> int:
        decision = dispatch.Decision(job_id=job_id, expected_next_run_at=expected,
                                   next_run_at=run + dt.timedelta(hours=1),
                                   run=[run], missed=[missed], tz=job.tzinfo)
        advanced, publish, missed_count = dispatch.dispatch_many([decision])
        assert job_id in advanced and len(publish) == 1 and missed_count == 1
        outcomes.missed(repairs.newest_missed([job_id]))
        return publish[0].execution_id

    hour = dt.timedelta(hours=1)
    first = beat_back_late(SLOT, SLOT + hour, None)
    assert Alert.objects.filter(job_id=job_id, event="MISSED").count() == 1
    claim = claims.begin(job=job, job_id=job_id, slot=SLOT + hour, execution_date=SLOT.date(), trigger=Trigger.BEAT,
                         execution_id=first)
    assert claim.claimed  # it started (and still runs)
    beat_back_late(SLOT + 2 * hour, SLOT + 3 * hour, SLOT + 2 * hour)
    assert Alert.objects.filter(job_id=job_id, event="MISSED").count() == 2


def test_a_frozen_run_of_a_rerun_on_failure_slot_is_fenced_once_the_slot_runs_again() -> None:
    """Found by the model (a fixed-seed draw after its rules moved): a ``rerun_on_failure`` job
    without a limit (overlap ``allow``) ran a slot; its worker froze past the lease. Its slot counts
    as not in flight, so a new run of the slot was claimed and succeeded; then the frozen worker
    came back and its success was recorded too: the slot succeeded twice, neither forced. The new
    claim of the slot now supersedes the frozen run, as a claim of a job with a limit does."""
    job, job_id = make_job("rerun_on_failure", "allow")
    frozen = claims.begin(job=job, job_id=job_id, slot=SLOT, execution_date=SLOT.date(), trigger=Trigger.MANUAL,
                          lease_seconds=60)
    assert frozen.claimed and frozen.execution_id is not None and frozen.fence is not None
    expire_lease(frozen.execution_id)
    again = claims.begin(job=job, job_id=job_id, slot=SLOT, execution_date=SLOT.date(), trigger=Trigger.MANUAL,
                         lease_seconds=60)
    assert again.claimed and again.execution_id is not None
    assert finishes.finish(job_id=job_id, execution_id=again.execution_id, fence=again.fence, status="SUCCEEDED")
    assert not finishes.finish(job_id=job_id, execution_id=frozen.execution_id, fence=frozen.fence,
                               status="SUCCEEDED"), "the frozen run's late success was recorded"
    assert CronExecution.objects.filter(job_id=job_id, slot=SLOT, status="SUCCEEDED").count() == 1
