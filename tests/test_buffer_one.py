"""``overlap="buffer_one"``, decided by the real claim against real PostgreSQL: one regular beat slot
waits for the live run, the next ones are skipped saying so, the waiting one goes when the live run
ends; runs somebody asked for, catch-up slots and retries keep the rules of overlap ``skip``; a pause
still skips a regular slot. tests/faults/test_buffer_one.py does the same with real beats and a worker."""

from __future__ import annotations

import datetime as dt

import pytest

from cron_celery import exceptions
from cron_celery.decisions import claims, finishes, room, waiting
from cron_celery.declaring import registry
from cron_celery.models import CronExecution, CronJob, SkipReason, Status, Trigger
from cron_celery.schedules import every
from tests.conftest import make_job
from tests.test_waiting import LATER, SLOT, begin, pending, row

pytestmark = pytest.mark.django_db

HOUR = dt.timedelta(hours=1)


def test_one_regular_slot_waits_for_the_live_run_and_the_next_is_skipped_saying_so():
    job, job_id = make_job(overlap="buffer_one")
    assert job.exclusive and job.limit == 1
    live = begin(job, job_id, slot=SLOT)
    first = pending(job, job_id, slot=SLOT + HOUR, trigger=Trigger.BEAT)
    claim = begin(job, job_id, slot=SLOT + HOUR, execution_id=first, trigger=Trigger.BEAT)
    assert (claim.outcome, claim.blocker, claim.skip_reason) == (claims.WAITING, live.execution_id, SkipReason.OVERLAP)
    assert (row(first).status, row(first).waiting_since is not None) == (Status.PENDING, True)
    second = pending(job, job_id, slot=SLOT + 2 * HOUR, trigger=Trigger.BEAT)
    skipped = begin(job, job_id, slot=SLOT + 2 * HOUR, execution_id=second, trigger=Trigger.BEAT)
    assert (skipped.outcome, skipped.skip_reason) == (Status.SKIPPED, SkipReason.OVERLAP)
    assert (row(second).status, row(second).message) == (Status.SKIPPED, room.BUFFER_FULL_MESSAGE)
    # The live run ends: the waiting slot is the one sent, and it runs.
    assert finishes.finish(job_id=job_id, execution_id=live.execution_id, fence=live.fence, status=Status.SUCCEEDED)
    chosen = waiting.next_to_run(job_id)
    assert chosen is not None and chosen.execution_id == first
    assert begin(job, job_id, slot=SLOT + HOUR, execution_id=first, trigger=Trigger.BEAT).claimed
    # It is the live run now: the buffer is free again for the next regular slot.
    third = pending(job, job_id, slot=SLOT + 3 * HOUR, trigger=Trigger.BEAT)
    assert begin(job, job_id, slot=SLOT + 3 * HOUR, execution_id=third, trigger=Trigger.BEAT).outcome == claims.WAITING


def test_its_own_redelivery_keeps_the_waiting_slot_waiting():
    job, job_id = make_job(overlap="buffer_one")
    begin(job, job_id, slot=SLOT)
    first = pending(job, job_id, slot=LATER, trigger=Trigger.BEAT)
    assert begin(job, job_id, slot=LATER, execution_id=first, trigger=Trigger.BEAT).outcome == claims.WAITING
    again = begin(job, job_id, slot=LATER, execution_id=first, trigger=Trigger.BEAT)
    assert again.outcome == claims.WAITING and row(first).status == Status.PENDING


@pytest.mark.parametrize("trigger", [Trigger.BACKFILL, Trigger.CATCH_UP, Trigger.ENQUEUE, Trigger.ONE_OFF])
def test_runs_asked_for_and_catch_up_slots_wait_as_with_skip_whatever_the_buffer_holds(trigger):
    job, job_id = make_job(overlap="buffer_one")
    begin(job, job_id, slot=SLOT)
    buffered = pending(job, job_id, slot=SLOT + HOUR, trigger=Trigger.BEAT)
    assert begin(job, job_id, slot=SLOT + HOUR, execution_id=buffered, trigger=Trigger.BEAT).outcome == claims.WAITING
    asked = pending(job, job_id, slot=SLOT + 2 * HOUR, trigger=trigger)
    assert begin(job, job_id, slot=SLOT + 2 * HOUR, execution_id=asked, trigger=trigger).outcome == claims.WAITING
    # ...and they do not fill the buffer: with only them waiting, a regular slot still gets its place.
    other, other_id = make_job(overlap="buffer_one")
    begin(other, other_id, slot=SLOT)
    asked_first = pending(other, other_id, slot=SLOT + HOUR, trigger=trigger)
    assert begin(other, other_id, slot=SLOT + HOUR, execution_id=asked_first, trigger=trigger).outcome == claims.WAITING
    regular = pending(other, other_id, slot=SLOT + 2 * HOUR, trigger=Trigger.BEAT)
    assert begin(other, other_id, slot=SLOT + 2 * HOUR, execution_id=regular,
                 trigger=Trigger.BEAT).outcome == claims.WAITING


def test_a_paused_job_still_skips_a_regular_slot_and_skip_is_unchanged():
    job, job_id = make_job(overlap="buffer_one")
    CronJob.objects.filter(id=job_id).update(paused=True)
    regular = pending(job, job_id, trigger=Trigger.BEAT)
    assert begin(job, job_id, execution_id=regular, trigger=Trigger.BEAT).skip_reason == SkipReason.PAUSED
    plain, plain_id = make_job(overlap="skip")
    begin(plain, plain_id, slot=SLOT)
    beat = pending(plain, plain_id, slot=LATER, trigger=Trigger.BEAT)
    assert begin(plain, plain_id, slot=LATER, execution_id=beat, trigger=Trigger.BEAT).skip_reason == SkipReason.OVERLAP
    assert row(beat).message == room.SKIP_MESSAGES[SkipReason.OVERLAP]


def test_an_in_process_run_meeting_the_live_run_is_skipped_as_with_skip():
    job, job_id = make_job(overlap="buffer_one")
    begin(job, job_id, slot=SLOT)
    claim = begin(job, job_id, slot=LATER)  # run_cron_task in-process: nothing to wait with
    assert (claim.outcome, claim.skip_reason) == (Status.SKIPPED, SkipReason.OVERLAP)
    assert CronExecution.objects.get(id=claim.execution_id).message == room.SKIP_MESSAGES[SkipReason.OVERLAP]


def test_the_declaration_takes_buffer_one_and_refuses_a_limit_beside_it():
    job = registry.declare(name="buffered-decl", code="BUF1", task_name="tests.fake.buffered", overlap="buffer_one",
                           schedule=every(minutes=5))
    assert job.overlap == "buffer_one" and job.exclusive
    with pytest.raises(exceptions.ImproperlyDeclared, match="max_concurrency is for jobs declared with "
                                                            "overlap='allow': overlap='buffer_one' already runs one"):
        registry.declare(name="buffered-limit", code="BUF2", task_name="tests.fake.limit", overlap="buffer_one",
                         max_concurrency=2)
    with pytest.raises(exceptions.ImproperlyDeclared, match="buffer_one"):
        registry.declare(name="buffered-typo", code="BUF3", task_name="tests.fake.typo", overlap="buffer-one")


def test_the_forced_last_slot_of_a_one_off_task_does_not_fill_the_buffer():
    """It waits because it was asked for (django-celery-beat's one_off: sent with force), not as the buffer."""
    job, job_id = make_job(overlap="buffer_one")
    begin(job, job_id, slot=SLOT)
    last = pending(job, job_id, slot=SLOT + HOUR, trigger=Trigger.BEAT, force=True)
    assert begin(job, job_id, slot=SLOT + HOUR, execution_id=last, trigger=Trigger.BEAT).outcome == claims.WAITING
    regular = pending(job, job_id, slot=SLOT + 2 * HOUR, trigger=Trigger.BEAT)
    assert begin(job, job_id, slot=SLOT + 2 * HOUR, execution_id=regular,
                 trigger=Trigger.BEAT).outcome == claims.WAITING


def test_a_rate_limited_job_never_buffers_whatever_its_overlap():
    """rate_limited skips the calls that meet its live run, which is the point of the pattern."""
    job, job_id = make_job(pattern="rate_limited", overlap="buffer_one")
    begin(job, job_id, slot=SLOT)
    regular = pending(job, job_id, slot=SLOT + HOUR, trigger=Trigger.BEAT)
    claim = begin(job, job_id, slot=SLOT + HOUR, execution_id=regular, trigger=Trigger.BEAT)
    assert (claim.outcome, claim.skip_reason) == (Status.SKIPPED, SkipReason.OVERLAP)
