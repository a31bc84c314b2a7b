"""A pause holds the runs somebody asked for, step by step against real PostgreSQL and the session's
Redis queue: the claim's held WAITING, nobody sending a held execution while its job is paused (the
next-to-run choice, the concurrency group's, the reconciler, the late-start alert), the admin's Resume
and the reconciler sending it once resumed, cancelling it, and the one_off task's forced last slot
waiting for a live run. tests/faults/test_pause_holds.py does the same with real workers and a beat."""

from __future__ import annotations

import datetime as dt

import pytest

from cron_celery import enums, reconciler
from cron_celery.decisions import claims, finishes, groups, timing, waiting
from cron_celery.decisions import jobs as job_rows
from cron_celery.models import CronExecution, CronJob, SkipReason, Status, Trigger
from cron_celery.run import resumes, tasks
from tests.celery_app import app
from tests.conftest import make_job
from tests.test_waiting import LATER, SLOT, backdate, begin, pending, reconcile_settings, row

pytestmark = pytest.mark.django_db

HISTORY = "/admin/cron_celery/cronexecution/"
DASHBOARD = "/admin/cron_celery/cronjob/"


def paused(job_id: int, flag: bool = True) -> None:
    CronJob.objects.filter(id=job_id).update(paused=flag)


@pytest.mark.parametrize("trigger", sorted(claims.BUFFERED_TRIGGERS))
def test_a_run_somebody_asked_for_that_reaches_a_paused_job_is_held_not_skipped(trigger):
    job, job_id = make_job(overlap="skip")
    paused(job_id)
    held_id = pending(job, job_id, trigger=trigger)
    claim = begin(job, job_id, execution_id=held_id, trigger=trigger)
    assert (claim.outcome, claim.skip_reason) == (claims.WAITING, SkipReason.PAUSED)
    r = row(held_id)
    assert (r.status, r.skip_reason, r.completed) == (Status.PENDING, "", False)
    assert r.waiting_since is not None and "paused" in r.message


def test_a_regular_slot_and_an_in_process_run_of_a_paused_job_are_still_skipped():
    job, job_id = make_job(overlap="skip")
    paused(job_id)
    beat_id = pending(job, job_id, trigger=Trigger.BEAT)
    assert begin(job, job_id, execution_id=beat_id, trigger=Trigger.BEAT).skip_reason == SkipReason.PAUSED
    assert row(beat_id).status == Status.SKIPPED
    assert begin(job, job_id, slot=LATER).skip_reason == SkipReason.PAUSED


def test_a_rate_limited_job_skips_a_backfill_slot_while_paused():
    job, job_id = make_job(pattern="rate_limited", overlap="allow")
    paused(job_id)
    held_id = pending(job, job_id)
    assert begin(job, job_id, execution_id=held_id, trigger=Trigger.BACKFILL).skip_reason == SkipReason.PAUSED


def test_nothing_sends_a_held_execution_while_its_job_is_paused_but_a_forced_one_goes(queue):
    job, job_id = make_job(overlap="skip")
    live = begin(job, job_id, slot=LATER)
    held_id = pending(job, job_id)
    forced_id = pending(job, job_id, slot=SLOT + dt.timedelta(hours=3), trigger=Trigger.ADMIN, force=True)
    for execution_id in (held_id, forced_id):
        assert begin(job, job_id, execution_id=execution_id).outcome == claims.WAITING
    paused(job_id)
    assert live.fence is not None
    finishes.finish(job_id=job_id, execution_id=live.execution_id, fence=live.fence, status=Status.SUCCEEDED)
    chosen = waiting.next_to_run(job_id)
    assert chosen is not None and chosen.execution_id == forced_id  # the older held one is passed over
    paused(job_id, False)
    CronExecution.objects.filter(id=forced_id).update(status=Status.SUCCEEDED, completed=True)
    again = waiting.next_to_run(job_id)
    assert again is not None and again.execution_id == held_id


def test_a_paused_job_of_a_concurrency_group_gives_its_place_to_the_others(declare):
    vacuum = declare("held-vacuum", "HV1", overlap="skip", concurrency_group="warehouse")
    load = declare("held-load", "HV2", pattern="always", overlap="allow", concurrency_group="warehouse")
    vacuum_id, load_id = job_rows.job_id(vacuum), job_rows.job_id(load)
    held_id = pending(vacuum, vacuum_id)
    waits_id = pending(load, load_id, slot=LATER)
    CronExecution.objects.filter(id__in=[held_id, waits_id]).update(
        waiting_since=dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    paused(vacuum_id)
    chosen = groups.next_to_run("warehouse")
    assert chosen is not None and chosen.execution_id == waits_id  # the paused job's older slot waits


@reconcile_settings
def test_the_reconciler_leaves_a_held_execution_alone_while_paused_and_sends_it_once_resumed(queue):
    job, job_id = make_job(overlap="skip")
    paused(job_id)
    held_id = pending(job, job_id)
    begin(job, job_id, execution_id=held_id, trigger=Trigger.BACKFILL)
    backdate(held_id, minutes=24 * 60)  # held a day: no resend, no MISSED, no LOST
    for _ in range(3):
        assert reconciler.run_pass() == reconciler.Report()
    assert row(held_id).status == Status.PENDING and queue.headers() == []
    paused(job_id, False)  # resumed outside the admin (the ORM, SQL, django-celery-beat's own admin)
    assert reconciler.run_pass() == reconciler.Report(resent=1)
    [sent] = queue.headers()
    assert sent[tasks.HEADER_EXECUTION] == held_id
    assert begin(job, job_id, execution_id=held_id, trigger=Trigger.BACKFILL).claimed


@reconcile_settings
def test_after_a_resume_outside_the_admin_one_pass_sends_every_held_run_of_a_job_without_a_limit(queue):
    job, job_id = make_job("always", overlap="allow")
    paused(job_id)
    ids = [pending(job, job_id, slot=SLOT + dt.timedelta(hours=hour), trigger=Trigger.ENQUEUE) for hour in (3, 2, 1)]
    for execution_id in ids:
        assert begin(job, job_id, execution_id=execution_id, trigger=Trigger.ENQUEUE).outcome == claims.WAITING
        backdate(execution_id, minutes=24 * 60)
    paused(job_id, False)  # no run of it ends to send the next: the pass sends them all
    assert reconciler.run_pass() == reconciler.Report(resent=3)
    assert sorted(headers[tasks.HEADER_EXECUTION] for headers in queue.headers()) == sorted(ids)


def test_a_held_one_off_is_not_alerted_late_while_its_job_is_paused():
    job, job_id = make_job(overlap="skip")
    CronJob.objects.filter(id=job_id).update(start_deadline=1, paused=True)
    held_id = pending(job, job_id, trigger=Trigger.ONE_OFF)
    begin(job, job_id, execution_id=held_id, trigger=Trigger.ONE_OFF)
    backdate(held_id)
    CronExecution.objects.filter(id=held_id).update(due_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    assert timing.mark_late(100) == []
    paused(job_id, False)
    assert [found.execution_id for found in timing.mark_late(100)] == [held_id]


def test_the_admins_resume_sends_the_oldest_held_run_of_a_job_with_a_limit(queue, admin_client, declare):
    job = declare("held-resumed", "HR1", overlap="skip")
    job_id = job_rows.job_id(job)
    paused(job_id)
    ids = [pending(job, job_id, slot=SLOT + dt.timedelta(hours=hour)) for hour in (2, 1)]
    for execution_id in ids:
        begin(job, job_id, execution_id=execution_id, trigger=Trigger.BACKFILL)
    admin_client.post(DASHBOARD, {"action": "resume", "_selected_action": [job_id]})
    assert not CronJob.objects.get(id=job_id).paused
    assert [headers[tasks.HEADER_EXECUTION] for headers in queue.headers()] == [ids[1]]  # 01:00 first


def test_resuming_a_job_without_a_limit_sends_every_held_run(queue):
    job, job_id = make_job("always", overlap="allow")
    paused(job_id)
    ids = [pending(job, job_id, slot=SLOT + dt.timedelta(hours=hour), trigger=Trigger.ENQUEUE) for hour in (2, 1)]
    for execution_id in ids:
        assert begin(job, job_id, execution_id=execution_id, trigger=Trigger.ENQUEUE).outcome == claims.WAITING
    resumes.release(app, job)
    assert queue.headers() == []  # still paused: nothing goes
    paused(job_id, False)
    resumes.release(app, job)
    assert [headers[tasks.HEADER_EXECUTION] for headers in queue.headers()] == [ids[1], ids[0]]


def test_cancelling_runs_not_started_in_the_history_ends_held_ones_and_leaves_started_ones(admin_client):
    job, job_id = make_job(overlap="skip")
    ran = begin(job, job_id, slot=LATER)  # started before (a run that starts now waits behind the held one)
    paused(job_id)
    held_id = pending(job, job_id)
    begin(job, job_id, execution_id=held_id, trigger=Trigger.BACKFILL)
    paused(job_id, False)
    done = admin_client.post(HISTORY, {"action": "cancel_not_started",
                                       "_selected_action": [held_id, ran.execution_id]}, follow=True)
    assert "1 run(s) cancelled; 1 left as they are" in done.content.decode()
    r = row(held_id)
    assert (r.status, r.skip_reason, r.waiting_since) == (Status.SKIPPED, SkipReason.CANCELLED, None)
    assert r.message.startswith("Cancelled before it ran, by ")
    assert row(ran.execution_id).status == Status.RUNNING
    # Its message turning up later does nothing.
    assert begin(job, job_id, execution_id=held_id, trigger=Trigger.BACKFILL).outcome == claims.DUPLICATE


def test_the_forced_last_slot_of_a_one_off_task_waits_for_a_live_run_instead_of_being_skipped():
    job, job_id = make_job(overlap="skip")
    live = begin(job, job_id, slot=LATER)
    last_id = pending(job, job_id, trigger=Trigger.BEAT, force=True)  # as dispatch_many writes it
    paused(job_id)  # its periodic task was disabled with it
    claim = begin(job, job_id, execution_id=last_id, trigger=Trigger.BEAT)
    assert (claim.outcome, claim.blocker) == (claims.WAITING, live.execution_id)
    assert claims.waits_its_turn(job, {"own_trigger": enums.Trigger.BEAT, "own_force": True})
    assert not claims.waits_its_turn(job, {"own_trigger": enums.Trigger.BEAT, "own_force": False})


def test_runs_that_find_their_job_free_wait_or_skip_behind_older_runs_that_wait_for_it():
    """Oldest first: with an older run of the exclusive job waiting for its room (a catch-up slot whose
    live run ended), a newer catch-up slot that finds the job free waits behind it, a regular beat slot
    is skipped (OVERLAP, saying why), and the older one, when its own message comes, runs. A held run of
    a paused job does not keep a forced run back."""
    job, job_id = make_job(overlap="skip")
    older = pending(job, job_id, trigger=Trigger.CATCH_UP)
    live = begin(job, job_id, slot=SLOT - dt.timedelta(hours=1))
    assert begin(job, job_id, execution_id=older, trigger=Trigger.CATCH_UP).outcome == claims.WAITING
    finishes.finish(job_id=job_id, execution_id=live.execution_id, fence=live.fence, status=Status.SUCCEEDED)
    newer = pending(job, job_id, slot=LATER, trigger=Trigger.CATCH_UP)
    claim = begin(job, job_id, slot=LATER, execution_id=newer, trigger=Trigger.CATCH_UP)
    assert (claim.outcome, claim.behind) == (claims.WAITING, True)
    assert row(newer).message.startswith("Waiting: 1 older run(s) of this job wait to run first")
    regular = pending(job, job_id, slot=LATER + dt.timedelta(hours=1), trigger=Trigger.BEAT)
    skipped = begin(job, job_id, slot=LATER + dt.timedelta(hours=1), execution_id=regular, trigger=Trigger.BEAT)
    assert (skipped.outcome, skipped.skip_reason, skipped.behind) == (Status.SKIPPED, SkipReason.OVERLAP, True)
    assert "older run(s) of this job wait to run first" in row(regular).message
    assert begin(job, job_id, execution_id=older, trigger=Trigger.CATCH_UP).claimed, "the oldest goes"
    # Paused, the held ones may not go: a forced run is not kept back by them.
    other, other_id = make_job(overlap="skip")
    held = pending(other, other_id, trigger=Trigger.BACKFILL)
    paused(other_id)
    assert begin(other, other_id, execution_id=held, trigger=Trigger.BACKFILL).outcome == claims.WAITING
    assert begin(other, other_id, slot=LATER, force=True).claimed


def test_a_run_behind_older_waiting_runs_of_a_job_with_room_for_two_says_so_and_sends_the_oldest():
    """max_concurrency=2 with one live run and an older run waiting (sent, not claimed yet): a newer regular
    slot is skipped saying older runs wait first (not naming a concurrency group it has none of), and tells its
    caller to send the oldest; a newer run asked for waits behind them, saying so."""
    job, job_id = make_job(pattern="always", overlap="allow", max_concurrency=2)
    first = begin(job, job_id, slot=SLOT)
    begin(job, job_id, slot=SLOT + dt.timedelta(hours=1))
    older = pending(job, job_id, slot=SLOT + dt.timedelta(hours=2), trigger=Trigger.ENQUEUE)
    assert begin(job, job_id, slot=SLOT + dt.timedelta(hours=2), execution_id=older,
                 trigger=Trigger.ENQUEUE).outcome == claims.WAITING
    finishes.finish(job_id=job_id, execution_id=first.execution_id, fence=first.fence, status=Status.SUCCEEDED)
    regular = pending(job, job_id, slot=SLOT + dt.timedelta(hours=3), trigger=Trigger.BEAT)
    skipped = begin(job, job_id, slot=SLOT + dt.timedelta(hours=3), execution_id=regular, trigger=Trigger.BEAT)
    assert (skipped.outcome, skipped.skip_reason, skipped.behind) == (Status.SKIPPED, SkipReason.CONCURRENCY, True)
    assert "older run(s) of this job wait to run first" in row(regular).message, row(regular).message
    asked = pending(job, job_id, slot=SLOT + dt.timedelta(hours=4), trigger=Trigger.ENQUEUE)
    waits = begin(job, job_id, slot=SLOT + dt.timedelta(hours=4), execution_id=asked, trigger=Trigger.ENQUEUE)
    assert (waits.outcome, waits.behind) == (claims.WAITING, True)
    assert row(asked).message.startswith("Waiting: 1 older run(s) of this job wait to run first"), row(asked).message
