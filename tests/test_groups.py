"""Concurrency groups step by step: a limit shared by several jobs, decided in the claim, the
waiting executions it makes and who sends them, the reconciler, the declaration and the check —
against real PostgreSQL and the session's real Redis queue."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection
from django.test import override_settings

from cron_celery import checks, exceptions, reconciler
from cron_celery.decisions import claims, executions, finishes, groups, heartbeats
from cron_celery.declaring import registry
from cron_celery.models import CronExecution, CronJob, SkipReason, Status, Trigger
from cron_celery.run import tasks
from tests.celery_app import app
from tests.conftest import make_job
from tests.test_waiting import RECONCILE, backdate, begin, pending, row

pytestmark = pytest.mark.django_db

SLOT = dt.datetime(2026, 11, 29, 1, 0, tzinfo=dt.UTC)
shared = override_settings(CRON_CELERY={"CONCURRENCY_GROUPS": {"shared": 2}, "RECONCILE": RECONCILE})


def hour(n: int) -> dt.datetime:
    return SLOT + dt.timedelta(hours=n)


def expire(execution_id: int) -> None:
    """The run's worker stopped renewing its lease (it froze, or died)."""
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {executions.EXE} SET lease_until = now() - interval '1 minute' WHERE id = %s",
                       [execution_id])


@shared
def test_two_jobs_of_a_group_share_its_limit_and_a_beat_slot_over_it_is_skipped():
    a, a_id = make_job("always", "allow", concurrency_group="shared")
    b, b_id = make_job("standard", "skip", concurrency_group="shared")
    assert CronJob.objects.get(id=a_id).concurrency_group == "shared"
    assert begin(a, a_id, hour(1)).claimed and begin(b, b_id, hour(1)).claimed
    beat_id = pending(a, a_id, hour(2), trigger=Trigger.BEAT)
    claim = begin(a, a_id, hour(2), execution_id=beat_id, trigger=Trigger.BEAT)
    assert (claim.outcome, claim.skip_reason) == (Status.SKIPPED, SkipReason.CONCURRENCY)
    assert row(beat_id).message == ("Skipped: the job's concurrency group 'shared' already has 2 runs at once, "
                                    "as many as CONCURRENCY_GROUPS allows.")
    # A job outside the group is not held back by it.
    other, other_id = make_job("always", "allow")
    assert begin(other, other_id, hour(1)).claimed


@shared
def test_a_requested_run_waits_for_room_in_the_group_and_is_sent_when_a_run_of_another_job_ends(queue):
    a, a_id = make_job("always", "allow", concurrency_group="shared")
    b, b_id = make_job("always", "allow", concurrency_group="shared")
    first, second = begin(a, a_id, hour(1)), begin(a, a_id, hour(2))
    waiting_id = pending(b, b_id, hour(3), trigger=Trigger.BACKFILL)
    CronExecution.objects.filter(id=waiting_id).update(celery_task_id="backfill-of-b")
    claim = begin(b, b_id, hour(3), execution_id=waiting_id, trigger=Trigger.BACKFILL)
    assert (claim.outcome, claim.skip_reason) == (claims.WAITING, SkipReason.CONCURRENCY)
    assert row(waiting_id).status == Status.PENDING and row(waiting_id).waiting_since is not None
    assert "concurrency group 'shared' has 2 runs at once" in row(waiting_id).message
    tasks.send_waiting(app, a)
    assert queue.headers() == []  # the group is still full: nothing is sent
    assert finishes.finish(job_id=a_id, execution_id=first.execution_id, fence=first.fence, status=Status.SUCCEEDED)
    tasks.send_waiting(app, a)  # a run of job a ended: the waiting run of job b is sent
    [sent] = queue.headers()
    assert (sent["id"], sent[tasks.HEADER_EXECUTION]) == ("backfill-of-b", waiting_id)
    assert begin(b, b_id, hour(3), execution_id=waiting_id, trigger=Trigger.BACKFILL).claimed
    assert second.claimed


@shared
def test_the_next_of_a_group_is_the_oldest_waiting_one_whose_own_job_has_room():
    a, a_id = make_job("standard", "skip", concurrency_group="shared")
    b, b_id = make_job("always", "allow", concurrency_group="shared")
    live_a, live_b = begin(a, a_id, hour(10)), begin(b, b_id, hour(10))
    older_a = pending(a, a_id, hour(1))  # waits; a is overlap-skip, so a has no room while live_a runs
    newer_b = pending(b, b_id, hour(2))
    for job, job_id, slot, execution_id in ((a, a_id, hour(1), older_a), (b, b_id, hour(2), newer_b)):
        assert begin(job, job_id, slot, execution_id=execution_id, trigger=Trigger.BACKFILL).outcome == claims.WAITING
    assert groups.next_to_run("shared") is None  # the group is full
    assert finishes.finish(job_id=b_id, execution_id=live_b.execution_id, fence=live_b.fence, status=Status.SUCCEEDED)
    nxt = groups.next_to_run("shared")  # older_a is older, but a still runs: b's waiting run goes
    assert nxt is not None and (nxt.execution_id, nxt.task_name) == (newer_b, b.task_name)
    assert live_a.claimed


@shared
def test_a_stale_run_of_another_job_still_holds_its_place_and_the_claiming_jobs_own_is_superseded():
    """The claim cannot fence another job's run, so a run whose lease ran out keeps its place until
    the reconciler ends it; the claiming job's own stale run is superseded and does not count."""
    a, a_id = make_job("always", "allow", concurrency_group="shared")
    b, b_id = make_job("always", "allow", concurrency_group="shared")
    frozen_b = begin(b, b_id, hour(1))
    frozen_a = begin(a, a_id, hour(1))
    expire(frozen_b.execution_id)
    expire(frozen_a.execution_id)
    # b's frozen run counts, a's own does not: one place left, and it is taken.
    third = begin(a, a_id, hour(2))
    assert third.claimed
    assert row(frozen_a.execution_id).fence == third.fence  # superseded: its heartbeat is refused
    assert not heartbeats.heartbeat(frozen_a.execution_id, frozen_a.fence, 60)
    assert begin(a, a_id, hour(3)).skip_reason == SkipReason.CONCURRENCY  # b's frozen run still counts
    assert heartbeats.heartbeat(frozen_b.execution_id, frozen_b.fence, 60)  # it woke up: the group is at 2, not 3


@shared
def test_the_reconciler_sends_a_waiting_run_of_a_group_only_once_the_group_has_room(queue):
    a, a_id = make_job("always", "allow", concurrency_group="shared", catch_up="none")
    b, b_id = make_job("always", "allow", concurrency_group="shared", catch_up="none")
    first, _second = begin(a, a_id, hour(1)), begin(a, a_id, hour(2))
    waiting_id = pending(b, b_id, hour(3), trigger=Trigger.CATCH_UP)
    assert begin(b, b_id, hour(3), execution_id=waiting_id, trigger=Trigger.CATCH_UP).outcome == claims.WAITING
    backdate(waiting_id)
    assert reconciler.run_pass() == reconciler.Report()  # b itself has room, its group has none
    assert queue.headers() == []
    finishes.finish(job_id=a_id, execution_id=first.execution_id, fence=first.fence, status=Status.SUCCEEDED)
    backdate(waiting_id)  # the send after that run ended was lost
    assert reconciler.run_pass() == reconciler.Report(resent=1)
    [sent] = queue.headers()
    assert sent[tasks.HEADER_EXECUTION] == waiting_id


def test_a_group_name_that_is_not_a_slug_is_refused_at_declaration():
    with pytest.raises(exceptions.ImproperlyDeclared, match="concurrency_group must name a group"):
        registry.declare(name="grouped", code="G1", task_name="x", concurrency_group="Ware House")
    with pytest.raises(exceptions.ImproperlyDeclared, match="concurrency_group must name a group"):
        registry.declare(name="grouped", code="G1", task_name="x", concurrency_group=2)


def test_the_check_names_a_bad_limit_and_a_job_whose_group_is_not_configured():
    job, _ = make_job("always", "allow", concurrency_group="nowhere")
    registry.register(job)
    try:
        with override_settings(CRON_CELERY={"CONCURRENCY_GROUPS": {"shared": 0, "Bad Name": 1, "ok": True}}):
            found = checks.check_groups()
    finally:
        registry.unregister(job.name)
    assert {error.id for error in found} == {"cron_celery.E015"}
    texts = [error.msg for error in found]
    assert "CRON_CELERY['CONCURRENCY_GROUPS']['shared'] must be a whole number of runs (1 or more), not 0." in texts
    assert "CRON_CELERY['CONCURRENCY_GROUPS']['ok'] must be a whole number of runs (1 or more), not True." in texts
    assert "CRON_CELERY['CONCURRENCY_GROUPS']: 'Bad Name' is not a group name (a lower-case slug)." in texts
    assert (f"Job {job.name!r}: its concurrency_group 'nowhere' is not in CRON_CELERY['CONCURRENCY_GROUPS'] "
            "(none is configured).") in texts
    with override_settings(CRON_CELERY={"CONCURRENCY_GROUPS": ["shared"]}):
        assert [error.msg for error in checks.check_groups()] == [
            "CRON_CELERY['CONCURRENCY_GROUPS'] must be a dict of group names to limits, not list."]


def test_the_test_projects_groups_pass_the_check():
    assert checks.check_groups() == []
