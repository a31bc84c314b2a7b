"""Buffered executions step by step: the claim's WAITING and GIVE_UP outcomes, who sends a waiting
execution when its job is free, and the reconciler telling a queued message from a lost one —
against real PostgreSQL and the session's real Redis queue."""

from __future__ import annotations

import datetime as dt

import pytest
from django.core.management.base import CommandError
from django.db import connection
from django.test import override_settings

from cron_celery import reconciler
from cron_celery.decisions import claims, dispatch, executions, finishes, waiting
from cron_celery.decisions import jobs as job_rows
from cron_celery.models import CronExecution, CronJob, SkipReason, Status, Trigger
from cron_celery.reconciler import inflight
from cron_celery.run import outcomes, tasks
from tests.celery_app import app
from tests.conftest import db_now, make_job

pytestmark = pytest.mark.django_db

SLOT = dt.datetime(2026, 11, 29, 1, 0, tzinfo=dt.UTC)
LATER = SLOT + dt.timedelta(hours=1)
RECONCILE = {"INTERVAL": 0, "PENDING_GRACE": 60, "MISSED_GRACE": 120, "REPUBLISH_LIMIT": 2, "BATCH": 100}
reconcile_settings = override_settings(CRON_CELERY={"RECONCILE": RECONCILE})


def begin(job, job_id, slot=SLOT, **kw):
    return claims.begin(job=job, job_id=job_id, slot=slot, execution_date=slot.date(),
                        trigger=kw.pop("trigger", Trigger.MANUAL), lease_seconds=60, **kw)


def pending(job, job_id, slot=SLOT, trigger=Trigger.BACKFILL, **kw):
    execution_id, _ = dispatch.enqueue(job=job, job_id=job_id, slot=slot, execution_date=slot.date(),
                                     trigger=trigger, **kw)
    return execution_id


def row(execution_id):
    return CronExecution.objects.get(id=execution_id)


def backdate(execution_id, minutes=60):
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {executions.EXE} SET created_at = now() - make_interval(mins => %s),"
                       " lease_until = now() - make_interval(mins => %s) WHERE id = %s",
                       [minutes, minutes, execution_id])


@pytest.mark.parametrize("trigger", [Trigger.BACKFILL, Trigger.CATCH_UP, Trigger.ENQUEUE, Trigger.ADMIN,
                                     Trigger.UPSTREAM, Trigger.ONE_OFF])
def test_a_requested_slot_that_meets_a_live_run_waits_instead_of_being_skipped(trigger):
    job, job_id = make_job(overlap="skip")
    live = begin(job, job_id, slot=LATER)
    waiting_id = pending(job, job_id, trigger=trigger, forced=True)
    claim = begin(job, job_id, execution_id=waiting_id, trigger=trigger)
    assert (claim.outcome, claim.blocker, claim.skip_reason) == (claims.WAITING, live.execution_id, SkipReason.OVERLAP)
    r = row(waiting_id)
    assert (r.status, r.skip_reason, r.completed) == (Status.PENDING, "", False)
    assert r.waiting_since == db_now() and r.lease_until == db_now()
    assert f"execution {live.execution_id}" in r.message
    assert CronExecution.objects.filter(job_id=job_id, status=Status.SKIPPED).count() == 0


def test_a_regular_beat_slot_that_meets_a_live_run_is_still_skipped():
    job, job_id = make_job(overlap="skip")
    begin(job, job_id, slot=LATER)
    beat_id = pending(job, job_id, trigger=Trigger.BEAT)
    claim = begin(job, job_id, execution_id=beat_id, trigger=Trigger.BEAT)
    assert (claim.outcome, claim.skip_reason) == (Status.SKIPPED, SkipReason.OVERLAP)
    assert row(beat_id).status == Status.SKIPPED and row(beat_id).waiting_since is None


def test_a_busy_lock_with_a_live_run_makes_a_backfill_wait_too():
    job, job_id = make_job(overlap="skip")
    begin(job, job_id, slot=LATER)
    waiting_id = pending(job, job_id)
    claim = begin(job, job_id, execution_id=waiting_id, trigger=Trigger.BACKFILL, lock_busy=True)
    assert (claim.outcome, claim.skip_reason) == (claims.WAITING, SkipReason.LOCK_UNAVAILABLE)


def test_a_retry_that_meets_a_live_run_waits_and_keeps_its_error():
    job, job_id = make_job(overlap="skip", max_retries=2)
    first = begin(job, job_id, execution_id=pending(job, job_id, trigger=Trigger.BEAT), trigger=Trigger.BEAT)
    assert finishes.retry(job_id=job_id, execution_id=first.execution_id, fence=first.fence, status=Status.FAILED,
                        message="ConnectionError: down", error_code="ConnectionError", traceback="", countdown=0)
    live = begin(job, job_id, slot=LATER)
    claim = begin(job, job_id, execution_id=first.execution_id, trigger=Trigger.BEAT)
    assert claim.outcome == claims.WAITING and claim.blocker == live.execution_id
    r = row(first.execution_id)
    assert (r.status, r.message, r.error_code, r.retry_count) == (
        Status.RETRYING, "ConnectionError: down", "ConnectionError", 1)
    assert r.waiting_since is not None
    # The live run ends: the retry claims its execution, no longer waiting.
    assert finishes.finish(job_id=job_id, execution_id=live.execution_id, fence=live.fence, status=Status.SUCCEEDED)
    again = begin(job, job_id, execution_id=first.execution_id, trigger=Trigger.BEAT)
    assert again.claimed and row(first.execution_id).waiting_since is None


def test_a_retry_owns_its_slot_even_if_another_run_of_the_slot_succeeded_meanwhile():
    job, job_id = make_job("standard", overlap="allow", max_retries=2)
    first = begin(job, job_id, execution_id=pending(job, job_id, trigger=Trigger.BEAT), trigger=Trigger.BEAT)
    assert finishes.retry(job_id=job_id, execution_id=first.execution_id, fence=first.fence, status=Status.FAILED,
                        message="boom", error_code="E", traceback="", countdown=0)
    forced = begin(job, job_id, force=True)
    assert finishes.finish(job_id=job_id, execution_id=forced.execution_id, fence=forced.fence,
                         status=Status.SUCCEEDED)
    assert begin(job, job_id, execution_id=first.execution_id, trigger=Trigger.BEAT).claimed


def test_a_retry_of_a_paused_job_ends_with_its_failure_counted():
    job, job_id = make_job(overlap="skip", max_retries=2)
    first = begin(job, job_id, execution_id=pending(job, job_id, trigger=Trigger.BEAT), trigger=Trigger.BEAT)
    assert finishes.retry(job_id=job_id, execution_id=first.execution_id, fence=first.fence, status=Status.TIMED_OUT,
                        message="SoftTimeLimitExceeded", error_code="TIME_LIMIT", traceback="tb", countdown=0)
    CronJob.objects.filter(id=job_id).update(paused=True)
    claim = begin(job, job_id, execution_id=first.execution_id, trigger=Trigger.BEAT)
    assert (claim.outcome, claim.status_seen) == (claims.GIVE_UP, Status.RETRYING)
    assert row(first.execution_id).status == Status.RETRYING  # the claim itself wrote nothing
    given = outcomes.given_up(job, job_id=job_id, execution_id=first.execution_id, note="not retried: paused")
    assert given is not None and given.status == Status.TIMED_OUT
    r = row(first.execution_id)
    assert (r.status, r.error_code, r.completed, r.success) == (Status.TIMED_OUT, "TIME_LIMIT", True, False)
    assert r.message == "SoftTimeLimitExceeded\n(not retried: paused)"
    assert [a["status"] for a in r.attempts] == [Status.TIMED_OUT]
    job_row = CronJob.objects.get(id=job_id)
    assert (job_row.consecutive_failures, job_row.last_status) == (1, Status.TIMED_OUT)
    assert outcomes.given_up(job, job_id=job_id, execution_id=first.execution_id, note="again") is None


def test_an_expired_run_of_a_paused_job_ends_lost_not_skipped():
    job, job_id = make_job(overlap="skip", max_retries=2)
    first = begin(job, job_id, execution_id=pending(job, job_id, trigger=Trigger.BEAT), trigger=Trigger.BEAT)
    CronExecution.objects.filter(id=first.execution_id).update(lease_until=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
    CronJob.objects.filter(id=job_id).update(paused=True)
    claim = begin(job, job_id, execution_id=first.execution_id, trigger=Trigger.BEAT)
    assert claim.outcome == claims.GIVE_UP
    given = outcomes.given_up(job, job_id=job_id, execution_id=first.execution_id, note="not retried: paused")
    assert given is not None and (given.status, given.error_code) == (Status.LOST, "LEASE_EXPIRED")
    assert CronJob.objects.get(id=job_id).consecutive_failures == 1


def test_the_oldest_waiting_execution_is_next_once_the_job_is_free():
    job, job_id = make_job(overlap="skip")
    live = begin(job, job_id, slot=SLOT + dt.timedelta(days=1))
    slots = [SLOT + dt.timedelta(hours=hour) for hour in (3, 1, 2)]
    ids = [pending(job, job_id, slot=slot) for slot in slots]
    for execution_id, slot in zip(ids, slots, strict=True):
        claim = begin(job, job_id, slot, execution_id=execution_id, trigger=Trigger.BACKFILL)
        assert claim.outcome == claims.WAITING
    assert waiting.next_to_run(job_id) is None  # the live run still holds the job
    assert finishes.finish(job_id=job_id, execution_id=live.execution_id, fence=live.fence, status=Status.SUCCEEDED)
    nxt = waiting.next_to_run(job_id)
    assert nxt is not None and (nxt.execution_id, nxt.slot, nxt.trigger, nxt.task_name) == (
        ids[1], SLOT + dt.timedelta(hours=1), Trigger.BACKFILL, job.task_name)


def test_send_waiting_sends_the_next_one_with_its_own_task_id(queue):
    job, job_id = make_job(overlap="skip")
    live = begin(job, job_id, slot=LATER)
    waiting_id = pending(job, job_id)
    CronExecution.objects.filter(id=waiting_id).update(celery_task_id="task-of-the-backfill")
    begin(job, job_id, execution_id=waiting_id, trigger=Trigger.BACKFILL)
    tasks.send_waiting(app, job)
    assert queue.headers() == []  # still busy: nothing is sent
    assert finishes.finish(job_id=job_id, execution_id=live.execution_id, fence=live.fence, status=Status.SUCCEEDED)
    tasks.send_waiting(app, job)
    [sent] = queue.headers()
    assert (sent["id"], sent[tasks.HEADER_EXECUTION], sent[tasks.HEADER_TRIGGER]) == (
        "task-of-the-backfill", waiting_id, Trigger.BACKFILL)


@reconcile_settings
def test_the_reconciler_leaves_a_waiting_execution_behind_a_live_run_alone(queue):
    job, job_id = make_job(overlap="skip")
    begin(job, job_id, slot=LATER)
    waiting_id = pending(job, job_id)
    begin(job, job_id, execution_id=waiting_id, trigger=Trigger.BACKFILL)
    backdate(waiting_id)
    assert reconciler.run_pass() == reconciler.Report()
    assert row(waiting_id).status == Status.PENDING and queue.headers() == []


@reconcile_settings
def test_the_reconciler_sends_a_waiting_execution_whose_job_is_free_and_whose_message_is_gone(queue):
    job, job_id = make_job(overlap="skip", catch_up="none")
    live = begin(job, job_id, slot=LATER)
    waiting_id = pending(job, job_id, trigger=Trigger.CATCH_UP)
    begin(job, job_id, execution_id=waiting_id, trigger=Trigger.CATCH_UP)
    finishes.finish(job_id=job_id, execution_id=live.execution_id, fence=live.fence, status=Status.SUCCEEDED)
    backdate(waiting_id)  # the send after the live run ended was lost
    assert reconciler.run_pass() == reconciler.Report(resent=1)  # never MISSED: it was asked for
    [sent] = queue.headers()
    assert sent[tasks.HEADER_EXECUTION] == waiting_id


@reconcile_settings
def test_a_message_still_in_the_queue_is_late_not_lost(queue):
    """A beat slot of a catch-up 'none' job whose message waits in the queue past PENDING_GRACE is left
    alone (its grace restarts); once the message is gone it is MISSED as before."""
    job, job_id = make_job(catch_up="none", overlap="allow")
    queued = pending(job, job_id, trigger=Trigger.BEAT)
    task_id = f"queued-{queued}"
    CronExecution.objects.filter(id=queued).update(celery_task_id=task_id)
    tasks.send(app, job.task_name, execution_id=queued, slot=SLOT, trigger=Trigger.BEAT, celery_task_id=task_id)
    backdate(queued)
    assert reconciler.run_pass() == reconciler.Report(waiting=1)
    assert (row(queued).status, row(queued).lease_until, row(queued).republished) == (Status.PENDING, db_now(), 0)
    queue.client.delete(queue.name)  # the broker lost it
    backdate(queued)
    assert reconciler.run_pass() == reconciler.Report(missed=1)
    assert (row(queued).status, row(queued).error_code) == (Status.MISSED, "NOT_DELIVERED")


def test_locate_finds_queued_and_unacknowledged_messages_and_misses_the_rest(queue):
    job, _ = make_job()
    tasks.send(app, job.task_name, execution_id=1, slot=SLOT, trigger=Trigger.BEAT, celery_task_id="in-the-queue")
    held = '{"headers": {"id": "held-by-a-worker"}}'
    queue.client.hset("unacked", f"tag-of-{queue.name}", f"[{held}, \"\", \"{queue.name}\"]")
    try:
        name = inflight.queue_of(app, job.task_name)
        assert name == queue.name
        found = inflight.locate(app, {"in-the-queue": name, "held-by-a-worker": name, "nowhere": name})
    finally:
        queue.client.hdel("unacked", f"tag-of-{queue.name}")
    assert found == {"in-the-queue": inflight.QUEUED, "held-by-a-worker": inflight.QUEUED,
                     "nowhere": inflight.GONE}


def test_an_in_process_run_sends_the_execution_that_waited_for_it(queue, marker):
    from django.core.management import call_command

    from tests.jobsapp import jobs_buffer

    job = jobs_buffer.hourly_exclusive.job
    job_id = job_rows.job_id(job)
    blocker = begin(job, job_id, slot=LATER)
    waiting_id = pending(job, job_id)
    begin(job, job_id, execution_id=waiting_id, trigger=Trigger.BACKFILL)
    finishes.finish(job_id=job_id, execution_id=blocker.execution_id, fence=blocker.fence, status=Status.SUCCEEDED)
    # The job is free, but an older run waits for it: the in-process run does not go ahead of it (refused,
    # saying why), and sends it.
    with pytest.raises(CommandError, match=r"older run\(s\) of this job wait to run first"):
        call_command("run_cron_task", job.name, "--at", "2026-11-29T05:00:00Z")
    [sent] = queue.headers()
    assert sent[tasks.HEADER_EXECUTION] == waiting_id


def test_a_forced_run_of_a_paused_job_keeps_its_force_while_it_waits(queue):
    job, job_id = make_job(overlap="skip")
    live = begin(job, job_id, slot=LATER, force=True)
    CronJob.objects.filter(id=job_id).update(paused=True)
    sent = tasks.send_run(job, SLOT, Trigger.ADMIN, force=True)
    assert row(sent.execution_id).force is True
    assert begin(job, job_id, execution_id=sent.execution_id, trigger=Trigger.ADMIN).outcome == claims.WAITING
    finishes.finish(job_id=job_id, execution_id=live.execution_id, fence=live.fence, status=Status.SUCCEEDED)
    queue.client.delete(queue.name)
    tasks.send_waiting(app, job)
    [headers] = queue.headers()
    assert tasks.HEADER_FORCE not in headers  # the row carries it, not the message
    assert begin(job, job_id, execution_id=sent.execution_id, trigger=Trigger.ADMIN).claimed


@reconcile_settings
def test_waiting_executions_are_sent_one_at_a_time_and_never_given_up(queue):
    """Each time the job is free, only its oldest waiting execution is sent again, and a waiting
    execution never reaches REPUBLISH_LIMIT: every delivery proved its message arrived."""
    job, job_id = make_job(overlap="skip")
    slots = [SLOT + dt.timedelta(hours=hour) for hour in range(3)]
    ids = [pending(job, job_id, slot=slot) for slot in slots]
    for round_ in range(4):  # more rounds than REPUBLISH_LIMIT (2)
        # Another worker's run of the job (a run that starts now would wait behind the older ones).
        live = CronExecution.objects.create(
            job_id=job_id, task_code=job.code, task_name=job.name, slot=SLOT + dt.timedelta(days=1, hours=round_),
            execution_date=SLOT.date(), run_number=1, status=Status.RUNNING, trigger=Trigger.MANUAL,
            started=db_now(), lease_until=db_now() + dt.timedelta(hours=1))
        for execution_id, slot in zip(ids, slots, strict=True):
            claim = begin(job, job_id, slot, execution_id=execution_id, trigger=Trigger.BACKFILL)
            assert claim.outcome == claims.WAITING
        CronExecution.objects.filter(id=live.id).update(status=Status.SUCCEEDED, completed=True, ended=db_now(),
                                                        lease_until=None)
        for execution_id in ids:
            backdate(execution_id)
        queue.client.delete(queue.name)
        assert reconciler.run_pass() == reconciler.Report(resent=1)
        assert [h[tasks.HEADER_EXECUTION] for h in queue.headers()] == [ids[0]]
    assert [row(execution_id).status for execution_id in ids] == [Status.PENDING] * 3


def test_a_rate_limited_job_still_skips_calls_that_meet_a_live_run():
    job, job_id = make_job(pattern="rate_limited", overlap="allow")
    begin(job, job_id, slot=LATER)
    extra = pending(job, job_id, trigger=Trigger.ENQUEUE)
    claim = begin(job, job_id, execution_id=extra, trigger=Trigger.ENQUEUE)
    assert (claim.outcome, claim.skip_reason) == (Status.SKIPPED, SkipReason.OVERLAP)


def test_a_retry_whose_job_was_resumed_meanwhile_is_not_given_up():
    job, job_id = make_job(overlap="skip", max_retries=2)
    first = begin(job, job_id, execution_id=pending(job, job_id, trigger=Trigger.BEAT), trigger=Trigger.BEAT)
    finishes.retry(job_id=job_id, execution_id=first.execution_id, fence=first.fence, status=Status.FAILED,
                 message="boom", error_code="E", traceback="", countdown=0)
    assert outcomes.given_up(job, job_id=job_id, execution_id=first.execution_id, note="paused") is None
    assert row(first.execution_id).status == Status.RETRYING


def test_a_delay_with_a_countdown_names_the_minute_it_is_due(queue):
    from tests.jobsapp import jobs_buffer

    eta = dt.datetime(2030, 1, 2, 6, 0, 42, tzinfo=dt.UTC)
    jobs_buffer.delayed_now.apply_async(eta=eta)
    jobs_buffer.delayed_now.apply_async(countdown=3600)
    due, later = queue.headers()
    assert due[tasks.HEADER_SLOT] == "2030-01-02T06:00:00Z"
    in_an_hour = dt.datetime.fromisoformat(later[tasks.HEADER_SLOT].replace("Z", "+00:00"))
    assert in_an_hour - dt.datetime.now(dt.UTC) > dt.timedelta(minutes=58)


@pytest.mark.django_db(transaction=True)
def test_the_next_waiting_execution_is_chosen_after_the_claim_it_waited_for():
    """A run of an overlap-skip job has ended; its waiting execution W is being claimed (the claim's
    transaction holds the job's row) while a second caller asks for the next waiting execution and
    waits for that row. Once the claim commits, W is RUNNING: the caller must find nothing to send.
    Before, its statement chose from the rows as they were when it began (W still waiting), cut
    W's fresh lease to now and sent W again, whose repeat delivery found its own run "expired"."""
    import threading

    from tests.model.harness import RowHolder, blocked_by, wait_until

    job, job_id = make_job(overlap="skip")
    live = begin(job, job_id, slot=LATER)
    waiting_id = pending(job, job_id, forced=True)
    assert begin(job, job_id, execution_id=waiting_id, trigger=Trigger.BACKFILL).outcome == claims.WAITING
    assert live.fence is not None and finishes.finish(execution_id=live.execution_id, fence=live.fence,
                                                      job_id=job_id, status=Status.SUCCEEDED, message="done")
    claim = RowHolder(  # the waiting execution's claim, in one statement, holding the job's row
        f"WITH j AS (UPDATE {executions.JOB} SET fence = fence + 1 WHERE id = %s RETURNING fence)"
        f" UPDATE {executions.EXE} SET status = 'RUNNING', fence = j.fence, waiting_since = NULL,"
        " started = clock_timestamp(), lease_until = now() + interval '60 seconds' FROM j WHERE id = %s",
        [job_id, waiting_id])
    claim.start()
    assert claim.locked.wait(10) and claim.raised is None
    chosen: list[object] = []
    caller = threading.Thread(target=lambda: (chosen.append(waiting.next_to_run(job_id)), connection.close()))
    caller.start()
    holder_pid = claim.backend_pid
    assert holder_pid is not None
    wait_until(lambda: blocked_by(holder_pid), "the caller to wait for the job's row")
    claim.release.set()
    claim.join(10)
    caller.join(10)
    assert chosen == [None]
    r = row(waiting_id)
    assert r.status == Status.RUNNING and r.lease_until > db_now() + dt.timedelta(seconds=30), r.lease_until
