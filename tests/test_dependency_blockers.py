"""``after=``: a downstream slot is never left waiting for an upstream that will never run it (issue
35, item 5), decided by the database in the write of the upstream that succeeded, or by the
reconciler when the other upstream stopped afterwards; and a job removed from the code gets no slot.
The real-process tests are in tests/faults/test_dependency_gaps.py."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import pytest

from cron_celery.decisions import claims, dependencies, dispatch, finishes
from cron_celery.declaring import registry
from cron_celery.models import CronDependency, CronExecution, CronJob, SkipReason, Status, Trigger
from cron_celery.run import outcomes
from cron_celery.schedules import every

pytestmark = pytest.mark.django_db(transaction=True)

SLOT = dt.datetime(2026, 11, 29, 1, 0, tzinfo=dt.UTC)
HOUR = dt.timedelta(hours=1)


def fan_in(declare) -> dict[str, tuple[registry.Job, int]]:
    """extract and transform (hourly, scheduled by a beat: their rows hold the schedule in effect and
    their next slot at the slot) -> load -> report."""
    made = {
        "extract": declare("bl-extract", "BL1", schedule=every(hours=1)),
        "transform": declare("bl-transform", "BL2", schedule=every(hours=1)),
        "load": declare("bl-load", "BL3", after=["bl-extract", "bl-transform"]),
        "report": declare("bl-report", "BL4", after="bl-load"),
    }
    dependencies.sync(list(made.values()))
    CronJob.objects.filter(code__in=["BL1", "BL2"]).update(schedule="every 3600s", next_run_at=SLOT)
    return {key: (job, CronJob.objects.get(code=job.code).id) for key, job in made.items()}


def succeed(job: registry.Job, job_id: int, trigger: str = Trigger.BEAT) -> int:
    execution_id, _ = dispatch.enqueue(job=job, job_id=job_id, slot=SLOT, execution_date=SLOT.date(),
                                       trigger=trigger)
    claim = claims.begin(job=job, job_id=job_id, slot=SLOT, execution_date=SLOT.date(), trigger=trigger,
                         lease_seconds=60, execution_id=execution_id)
    assert claim.outcome == Status.RUNNING, claim
    assert finishes.finish(job_id=job_id, execution_id=execution_id, fence=claim.fence, status=Status.SUCCEEDED)
    return execution_id


def of(job_id: int) -> list[CronExecution]:
    return list(CronExecution.objects.filter(job_id=job_id, slot=SLOT).order_by("run_number"))


def _set(**fields: object) -> Callable[[int], object]:
    return lambda job_id: CronJob.objects.filter(id=job_id).update(**fields)


NEVER = {
    "paused": (_set(paused=True), "is paused"),
    "window not open yet": (_set(active_from=SLOT + HOUR),
                            "is outside its active window (it opens at 2026-11-29T02:00:00Z)"),
    "window closed": (_set(active_until=SLOT), "is outside its active window (it closed at 2026-11-29T01:00:00Z)"),
    "removed from the code": (_set(removed_at=SLOT), "was removed from the code"),
    "no next slot": (_set(next_run_at=None), "has no next slot"),
    "went past the slot": (_set(next_run_at=SLOT + HOUR), "went past this slot without running it"),
}


@pytest.mark.parametrize("case", list(NEVER))
def test_an_upstream_that_never_runs_the_slot_skips_it_below_naming_that_upstream(declare, case):
    jobs_ = fan_in(declare)
    change, words = NEVER[case]
    change(jobs_["transform"][1])
    ended = succeed(*jobs_["extract"])
    (load,) = of(jobs_["load"][1])
    assert (load.status, load.skip_reason, load.trigger, load.upstream_execution_id, load.completed) == (
        Status.SKIPPED, SkipReason.UPSTREAM, Trigger.UPSTREAM, ended, True)
    assert load.message.startswith(f"Skipped: upstream job bl-transform (BL2) {words}"), load.message
    assert f"(execution {ended} of bl-extract (BL1) ended SUCCEEDED in it)" in load.message
    (report,) = of(jobs_["report"][1])
    assert (report.status, report.skip_reason, report.upstream_execution_id) == (
        Status.SKIPPED, SkipReason.UPSTREAM, load.id)
    # Found again from the success, as the skips below a failure are (announced, recorded: no alert).
    below = dependencies.skipped_below([ended])
    assert [(item.code, item.upstream_status) for item in below] == [("BL3", "SUCCEEDED"), ("BL4", "SUCCEEDED")]


def test_an_upstream_that_may_still_run_the_slot_is_waited_for(declare):
    jobs_ = fan_in(declare)
    # Due at the slot and not sent yet (or its beat is down: the reconciler records it MISSED then).
    succeed(*jobs_["extract"])
    assert of(jobs_["load"][1]) == []
    # A slot somebody asked for (a backfill, a run by hand): not one its beat went past, so it waits.
    CronJob.objects.filter(id=jobs_["transform"][1]).update(next_run_at=SLOT + 5 * HOUR)
    other = fan_in_slot_by_hand(jobs_)
    assert of(jobs_["load"][1]) == [] and other
    # Without a schedule it runs when somebody asks: waited for too.
    CronJob.objects.filter(id=jobs_["transform"][1]).update(schedule="", next_run_at=None)
    assert outcomes.decided_late(100, 0) == [] and of(jobs_["load"][1]) == []
    # Its success decides the slot as before.
    succeed(*jobs_["transform"])
    assert [row.status for row in of(jobs_["load"][1])] == [Status.PENDING]


def fan_in_slot_by_hand(jobs_: dict[str, tuple[registry.Job, int]]) -> int:
    extract, extract_id = jobs_["extract"]
    CronExecution.objects.filter(job_id=extract_id).delete()
    return succeed(extract, extract_id, trigger=Trigger.BACKFILL)


def test_an_upstream_paused_after_the_other_succeeded_is_decided_by_the_reconciler(declare):
    jobs_ = fan_in(declare)
    ended = succeed(*jobs_["extract"])
    assert of(jobs_["load"][1]) == []  # transform may still run the slot
    CronJob.objects.filter(id=jobs_["transform"][1]).update(paused=True)
    assert outcomes.decided_late(100, 0) == [ended]
    (load,) = of(jobs_["load"][1])
    assert (load.status, load.skip_reason) == (Status.SKIPPED, SkipReason.UPSTREAM)
    assert "bl-transform (BL2) is paused" in load.message
    assert outcomes.decided_late(100, 0) == []  # decided once


def test_through_a_chain_the_upstream_above_an_undecided_one_is_named(declare):
    made = {
        "x": declare("bl-x", "BX1", schedule=every(hours=1)),
        "a": declare("bl-a", "BX2", schedule=every(hours=1)),
        "m": declare("bl-m", "BX3", after="bl-x"),
        "c": declare("bl-c", "BX4", after=["bl-a", "bl-m"]),
    }
    dependencies.sync(list(made.values()))
    CronJob.objects.filter(code__in=["BX1", "BX2"]).update(schedule="every 3600s", next_run_at=SLOT)
    CronJob.objects.filter(code="BX1").update(paused=True)
    a = made["a"]
    ended = succeed(a, CronJob.objects.get(code="BX2").id)
    (c,) = of(CronJob.objects.get(code="BX4").id)
    assert c.status == Status.SKIPPED and "upstream job bl-x (BX1) is paused" in c.message, c.message
    assert c.upstream_execution_id == ended
    assert of(CronJob.objects.get(code="BX3").id) == []  # bl-m has no slot: none of its upstreams ran it


def test_a_downstream_job_removed_from_the_code_gets_no_slot(declare):
    jobs_ = fan_in(declare)
    CronJob.objects.filter(id=jobs_["load"][1]).update(removed_at=SLOT)
    succeed(*jobs_["extract"])
    succeed(*jobs_["transform"])
    assert of(jobs_["load"][1]) == [] and of(jobs_["report"][1]) == []
    assert outcomes.decided_late(100, 0) == []


def pending(job: registry.Job, job_id: int, trigger: str) -> int:
    """A run of the slot recorded and not started (its message unsent, or not taken yet)."""
    return dispatch.enqueue(job=job, job_id=job_id, slot=SLOT, execution_date=SLOT.date(), trigger=trigger)[0]


def cancel(execution_id: int) -> None:
    assert [item.execution_id for item in outcomes.cancelled([execution_id], "test", any_pending=True)] == [
        execution_id]


@pytest.mark.parametrize("trigger", [Trigger.BEAT, Trigger.CATCH_UP, Trigger.BACKFILL])
def test_cancelling_the_slots_run_of_an_upstream_skips_the_slot_below_naming_it(declare, trigger):
    jobs_ = fan_in(declare)
    held = pending(*jobs_["transform"], trigger)
    ended = succeed(*jobs_["extract"])
    assert of(jobs_["load"][1]) == []  # transform's run may still come
    cancel(held)
    (load,) = of(jobs_["load"][1])
    assert (load.status, load.skip_reason, load.upstream_execution_id) == (
        Status.SKIPPED, SkipReason.UPSTREAM, held)
    assert load.message == (f"Skipped: upstream job bl-transform (BL2) ended SKIPPED, CANCELLED in this slot "
                            f"(execution {held}).")
    (report,) = of(jobs_["report"][1])
    assert (report.status, report.upstream_execution_id) == (Status.SKIPPED, load.id)
    assert outcomes.decided_late(100, 0) == [] and ended  # decided once, by the cancel


def test_a_cancelled_run_somebody_asked_for_or_a_slot_run_beside_another_decides_nothing(declare):
    jobs_ = fan_in(declare)
    transform, transform_id = jobs_["transform"]
    for trigger in (Trigger.ONE_OFF, Trigger.ENQUEUE, Trigger.ADMIN):  # not the slot's run: it may yet come
        cancel(pending(transform, transform_id, trigger))
    beat = pending(transform, transform_id, Trigger.BEAT)
    cancel(pending(transform, transform_id, Trigger.CATCH_UP))  # the beat's run of the slot is still there
    succeed(*jobs_["extract"])
    assert of(jobs_["load"][1]) == [] and outcomes.decided_late(100, 0) == []
    # The slot's last run cancelled: decided then, naming it.
    cancel(beat)
    (load,) = of(jobs_["load"][1])
    assert (load.status, load.upstream_execution_id) == (Status.SKIPPED, beat)


def test_a_cancelled_upstream_run_decides_a_slot_whose_edge_came_after_it_through_the_reconciler(declare):
    jobs_ = fan_in(declare)
    held = pending(*jobs_["transform"], Trigger.BEAT)
    CronDependency.objects.filter(downstream_id=jobs_["load"][1]).delete()  # the edge not there yet
    cancel(held)
    dependencies.sync([job for job, _ in jobs_.values()])
    CronJob.objects.filter(id=jobs_["load"][1]).update(created_at=SLOT - HOUR)  # declared before the cancel
    assert outcomes.decided_late(100, 0) == [held]
    (load,) = of(jobs_["load"][1])
    assert (load.status, load.upstream_execution_id) == (Status.SKIPPED, held)
    assert outcomes.decided_late(100, 0) == []
