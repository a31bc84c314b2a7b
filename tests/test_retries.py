"""Retries, dead attempts and the reconciler, step by step, against real PostgreSQL and Redis.

The declaration rules and the retry policy are pure; everything else asserts on the rows
that ``claims`` and ``reconciler`` write, and on the messages that really reach the
session's own Redis queue (or a real in-thread Celery worker).
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
from celery.contrib.testing.worker import start_worker
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import connection
from django.test import override_settings

from cron_celery import checks, conf, exceptions, reconciler, slots
from cron_celery.decisions import claims, dispatch, executions, finishes, leadership, repairs
from cron_celery.decisions import jobs as job_rows
from cron_celery.declaring import registry
from cron_celery.models import CronExecution, CronJob, Status, Trigger
from cron_celery.run import decorators, retries, tasks
from tests.celery_app import app
from tests.conftest import db_now, make_job, wait_for
from tests.jobsapp import tasks as jobs

pytestmark = pytest.mark.django_db

SLOT = dt.datetime(2026, 11, 29, 1, 0, tzinfo=dt.UTC)
#: The reconciler's clock for undispatched slots: with MISSED_GRACE 120 the cutoff is 12:30,
#: half an hour after the last hourly slot, so no slot counts as on time.
NOW = dt.datetime(2026, 11, 29, 12, 32, tzinfo=dt.UTC)
HOURLY = "0 * * * *"
RECONCILE = {"INTERVAL": 0, "PENDING_GRACE": 60, "MISSED_GRACE": 120, "REPUBLISH_LIMIT": 2, "BATCH": 100}
reconcile_settings = override_settings(CRON_CELERY={"RECONCILE": RECONCILE})


# --- helpers ------------------------------------------------------------------------------

def begin(job, job_id, slot=SLOT, **kw):
    return claims.begin(job=job, job_id=job_id, slot=slot, execution_date=slot.date(),
                        trigger=kw.pop("trigger", Trigger.MANUAL), lease_seconds=60, **kw)


def enqueue(job, job_id, slot=SLOT, trigger=Trigger.BEAT):
    execution_id, _ = dispatch.enqueue(job=job, job_id=job_id, slot=slot, execution_date=slot.date(),
                                     trigger=trigger)
    return execution_id


def retry(job_id, claim, countdown=30.0, **kw):
    return finishes.retry(job_id=job_id, execution_id=claim.execution_id, fence=kw.pop("fence", claim.fence),
                        status=kw.pop("status", Status.FAILED), message=kw.pop("message", "boom"),
                        error_code=kw.pop("error_code", "E1"), traceback=kw.pop("traceback", "tb"),
                        countdown=countdown)


def sql(statement: str, params: list[Any]) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def expire(execution_id: int) -> None:
    sql(f"UPDATE {executions.EXE} SET lease_until = now() - interval '5 minutes' WHERE id = %s", [execution_id])


def backdate(execution_id: int, minutes: int = 60) -> None:
    """A row created long ago (beyond PENDING_GRACE), so the reconciler sees it as stranded."""
    sql(f"UPDATE {executions.EXE} SET created_at = now() - make_interval(mins => %s) WHERE id = %s",
        [minutes, execution_id])


def row(execution_id):
    return CronExecution.objects.get(id=execution_id)


def snapshot():
    return (list(CronExecution.objects.order_by("id").values()), list(CronJob.objects.order_by("id").values()))


def report(**counts):
    """A pass that ran and did exactly this."""
    return reconciler.Report(ran=True, **counts)




# --- 1. declarations ------------------------------------------------------------------------

def declare(**options):
    return registry.declare(name="retry-decl", code="RD1", task_name="tests.retry_decl", **options)


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"max_retries": -1}, "max_retries"),
        ({"max_retries": 1.5}, "max_retries"),
        ({"max_retries": True}, "max_retries"),
        ({"max_retries": "3"}, "max_retries"),
        ({"retry_backoff_max": -5}, "retry_backoff_max"),
        ({"retry_backoff": "fast"}, "retry_backoff"),
        ({"soft_time_limit": 10, "time_limit": 10}, "soft_time_limit (10 s) must be shorter than time_limit"),
        ({"soft_time_limit": 20, "time_limit": 10}, "soft_time_limit (20 s) must be shorter than time_limit"),
        ({"time_limit": 0}, "time_limit must be a number of seconds greater than 0"),
        ({"soft_time_limit": 0}, "soft_time_limit must be a number of seconds greater than 0"),
        ({"retry_on": ValueError()}, "retry_on"),
        ({"retry_on": "ValueError"}, "retry_on"),
        ({"retry_on": (ValueError, int)}, "retry_on"),
    ],
)
def test_a_bad_retry_or_time_limit_option_is_refused_naming_the_job_and_the_option(options, option):
    with pytest.raises(exceptions.ImproperlyDeclared) as caught:
        declare(**options)
    message = str(caught.value)
    assert message.startswith("Job 'retry-decl' is declared incorrectly:")
    assert option in message


def test_a_valid_policy_is_kept_and_defaults_come_from_the_settings():
    job = declare(max_retries=3, retry_backoff=5, retry_backoff_max=30, retry_jitter=False,
                  retry_on=[ConnectionError, TimeoutError], retry_on_failure=True, soft_time_limit=5, time_limit=10)
    assert (job.max_retries, job.retry_backoff, job.retry_backoff_max, job.retry_jitter) == (3, 5, 30, False)
    assert job.retry_on == (ConnectionError, TimeoutError) and job.retry_on_failure is True
    assert (job.soft_time_limit, job.time_limit) == (5, 10)
    plain = declare()
    assert (plain.max_retries, plain.retry_on, plain.soft_time_limit, plain.time_limit) == (0, (Exception,), None, None)
    with override_settings(CRON_CELERY={"DEFAULT_MAX_RETRIES": 4, "DEFAULT_SOFT_TIME_LIMIT": 30,
                                        "DEFAULT_TIME_LIMIT": 60}):
        defaulted = declare()
        assert (defaulted.max_retries, defaulted.soft_time_limit, defaulted.time_limit) == (4, 30, 60)
        with pytest.raises(exceptions.ImproperlyDeclared, match="soft_time_limit"):
            declare(time_limit=20)  # the default soft limit (30 s) is not below it


@pytest.mark.parametrize(("option", "hint"), [("autoretry_for", "retry_on"), ("acks_late", "acknowledge late"),
                                               ("reject_on_worker_lost", "acknowledge late"),
                                               ("acks_on_failure_or_timeout", "acknowledge late"),
                                               ("default_retry_delay", "retry_backoff="),  # retries never read it
                                               ("Request", "request class")])
def test_celery_options_that_would_bypass_the_database_cap_are_refused(option, hint):
    with pytest.raises(exceptions.ImproperlyDeclared) as caught:
        decorators._split_options("some-job", {option: True, "queue": "q"})
    assert "'some-job'" in str(caught.value) and f"{option}=" in str(caught.value) and hint in str(caught.value)
    with pytest.raises(exceptions.ImproperlyDeclared):
        decorators.cron_task(name="refused-job", code="RJ1", **{option: True})(lambda run: None)
    with pytest.raises(exceptions.UnknownJob):  # refused before anything was registered
        registry.get("refused-job")


def test_split_options_separates_the_policy_from_celery_options():
    rest, policy = decorators._split_options("j", {"queue": "q", "max_retries": 3, "time_limit": 9, "priority": 1})
    assert rest == {"queue": "q", "priority": 1}
    assert policy == {"max_retries": 3, "time_limit": 9}


# --- 2. the retry policy ---------------------------------------------------------------------

def test_countdown_doubles_up_to_the_cap_without_jitter():
    job = declare(max_retries=5, retry_backoff=5, retry_backoff_max=30, retry_jitter=False)
    assert [retries.countdown(job, done) for done in range(5)] == [5, 10, 20, 30, 30]
    unit = declare(max_retries=5, retry_jitter=False)  # retry_backoff=True: a factor of 1 s
    assert [retries.countdown(unit, done) for done in range(4)] == [1, 2, 4, 8]
    assert retries.countdown(unit, 60) == 600  # the default cap, however many retries


def test_countdown_with_jitter_stays_within_the_cap():
    job = declare(max_retries=5, retry_backoff=5, retry_backoff_max=30, retry_jitter=True)
    for done, cap in ((0, 5.0), (3, 30.0)):
        waits = [retries.countdown(job, done) for _ in range(200)]
        assert all(0 <= wait <= cap for wait in waits)
        assert len(set(waits)) > 100 and max(waits) > cap / 2  # really random, across the range


def test_countdown_without_backoff_is_celerys_fixed_delay():
    job = declare(max_retries=2, retry_backoff=False, retry_jitter=True)
    assert [retries.countdown(job, done) for done in range(3)] == [retries.FIXED_DELAY] * 3 == [180.0] * 3


@pytest.mark.parametrize(
    ("status", "error", "retry_count", "on_failure", "expected"),
    [
        (Status.FAILED, ConnectionError("down"), 0, False, True),  # one of retry_on
        (Status.FAILED, ConnectionError("down"), 1, False, True),
        (Status.FAILED, ValueError("bug"), 0, False, False),  # not one of retry_on
        (Status.FAILED, None, 0, False, False),  # {"error": True} without retry_on_failure
        (Status.FAILED, None, 0, True, True),  # ... and with it
        (Status.FAILED, exceptions.JobFailed("no"), 0, False, False),
        (Status.FAILED, exceptions.JobFailed("no"), 0, True, True),
        (Status.FAILED, exceptions.Interrupted(job="j"), 0, False, True),  # always, not in retry_on
        (Status.FAILED, exceptions.Interrupted(job="j"), 2, False, False),  # but not past the cap
        (Status.FAILED, ConnectionError("down"), 2, False, False),  # cap reached
        (Status.FAILED, None, 2, True, False),
        (Status.TIMED_OUT, SoftTimeLimitExceeded(), 0, False, False),  # not one of (ConnectionError,)
        (Status.SUCCEEDED, None, 0, True, False),  # a success is never retried
        (Status.SUCCEEDED, ConnectionError("down"), 0, True, False),
        (Status.LOST, ConnectionError("down"), 0, True, False),
    ],
)
def test_wanted_decision_table(status, error, retry_count, on_failure, expected):
    job = declare(max_retries=2, retry_on=(ConnectionError,), retry_on_failure=on_failure)
    assert retries.wanted(job, status, error, retry_count) is expected


def test_the_soft_time_limit_retries_by_default_and_so_does_a_hard_kill():
    default = declare(max_retries=1)
    assert retries.wanted(default, Status.TIMED_OUT, SoftTimeLimitExceeded(), 0) is True
    assert retries.wanted(default, Status.FAILED, ValueError("any exception"), 0) is True
    assert retries.wanted_after_kill(default) is True
    assert retries.wanted_after_kill(declare(max_retries=1, retry_on=ConnectionError)) is False
    assert retries.wanted_after_kill(declare(max_retries=1, retry_on=SoftTimeLimitExceeded)) is True


# --- 3. finishes.retry -------------------------------------------------------------------------

def test_retry_ends_the_attempt_and_schedules_the_next_without_counting_a_failure():
    job, job_id = make_job(max_retries=2)
    claim = begin(job, job_id, worker="host-a", pid=4242)
    assert retry(job_id, claim, countdown=30, message="partner down", error_code="HTTP_503", traceback="tb!")
    r = row(claim.execution_id)
    assert (r.status, r.retry_count, r.completed, r.success, r.ended, r.pid) == (
        Status.RETRYING, 1, False, None, None, None)
    assert (r.message, r.error_code, r.traceback) == ("partner down", "HTTP_503", "tb!")
    assert r.lease_until == db_now() + dt.timedelta(seconds=30)
    (attempt,) = r.attempts
    assert (attempt["attempt"], attempt["fence"], attempt["worker"], attempt["pid"]) == (1, claim.fence, "host-a", 4242)
    assert (attempt["status"], attempt["error_code"], attempt["message"]) == ("FAILED", "HTTP_503", "partner down")
    assert attempt["ended"] is not None and attempt["ended"] >= attempt["started"]
    job_row = CronJob.objects.get(id=job_id)
    assert (job_row.consecutive_failures, job_row.last_status, job_row.last_run_at) == (0, "", None)


def test_retry_with_a_negative_countdown_is_due_now_and_keeps_the_status_given():
    job, job_id = make_job(max_retries=1)
    claim = begin(job, job_id)
    assert retry(job_id, claim, countdown=-5, status=Status.TIMED_OUT, error_code="TIME_LIMIT")
    r = row(claim.execution_id)
    assert r.lease_until == db_now() and r.attempts[-1]["status"] == "TIMED_OUT"


def test_retry_with_a_stale_fence_or_after_the_finish_writes_nothing():
    job, job_id = make_job(max_retries=2)
    claim = begin(job, job_id)
    before = snapshot()
    assert retry(job_id, claim, fence=claim.fence - 1) is False
    assert snapshot() == before
    assert finishes.finish(job_id=job_id, execution_id=claim.execution_id, fence=claim.fence, status=Status.FAILED)
    finished = snapshot()
    assert retry(job_id, claim) is False
    assert snapshot() == finished and row(claim.execution_id).status == Status.FAILED


def test_every_attempt_is_one_entry_with_a_growing_fence_until_the_cap_refuses():
    job, job_id = make_job(max_retries=2)
    execution_id = enqueue(job, job_id, trigger=Trigger.ENQUEUE)
    assert row(execution_id).attempts == []
    fences = []
    for attempt in (1, 2, 3):
        claim = begin(job, job_id, execution_id=execution_id, worker=f"w{attempt}", pid=attempt)
        assert claim.claimed and claim.retry_count == attempt - 1
        fences.append(claim.fence)
        r = row(execution_id)
        # The first attempt gets its entry when it ends (the row's columns describe it until
        # then); later attempts open theirs at the claim.
        assert isinstance(r.attempts, list) and len(r.attempts) == (attempt if attempt > 1 else 0)
        if attempt > 1:
            assert r.attempts[-1]["attempt"] == attempt and "ended" not in r.attempts[-1]
        if attempt < 3:
            assert retry(job_id, claim, message=f"fail {attempt}")
    assert fences == sorted(fences) and len(set(fences)) == 3
    before = snapshot()
    assert retry(job_id, claim) is False  # retry_count == max_retries: the database says no
    assert snapshot() == before
    r = row(execution_id)
    assert (r.status, r.retry_count) == (Status.RUNNING, 2)
    assert [a["fence"] for a in r.attempts] == fences
    assert [a.get("status") for a in r.attempts] == ["FAILED", "FAILED", None]
    assert [a.get("message") for a in r.attempts] == ["fail 1", "fail 2", None]
    assert [(a["worker"], a["pid"]) for a in r.attempts] == [("w1", 1), ("w2", 2), ("w3", 3)]
    assert finishes.finish(job_id=job_id, execution_id=execution_id, fence=claim.fence, status=Status.FAILED,
                         message="final", error_code="E9")
    r = row(execution_id)
    assert (r.status, r.completed, r.success, r.attempts[-1]["status"]) == (Status.FAILED, True, False, "FAILED")
    assert CronJob.objects.get(id=job_id).consecutive_failures == 1


def test_a_job_without_retries_is_never_retried():
    job, job_id = make_job()
    claim = begin(job, job_id)
    before = snapshot()
    assert retry(job_id, claim) is False
    assert snapshot() == before


# --- 4. repairs.end_dead_attempts --------------------------------------------------------------

def dead(job_id, status=Status.LOST, **kw):
    return repairs.end_dead_attempts(job_id=job_id, status=status, error_code=kw.pop("error_code", "WORKER_LOST"),
                                    message=kw.pop("message", "the child died"), **kw)


def test_a_dead_child_found_by_its_execution_worker_and_pid_is_retried_without_touching_the_job():
    """The worker's parent names the execution its child ran (the request's header, else its Celery
    task id), the worker (host and boot) and the pid: nothing less matches (issue 35 item 8)."""
    job, job_id = make_job(overlap="allow", max_retries=1)
    claim = begin(job, job_id, worker="host-a#b00t", pid=4242, celery_task_id="task-1")
    other = begin(job, job_id, slot=SLOT + dt.timedelta(minutes=1), worker="host-a#b00t", pid=4242)
    assert other.claimed  # a second RUNNING row of the same worker and pid (as two pid namespaces make)
    mine = {"worker": "host-a#b00t", "pid": 4242}
    assert dead(job_id, worker="host-b#b00t", pid=4242, execution_id=claim.execution_id) is None  # another host
    assert dead(job_id, worker="host-a#0ther", pid=4242, execution_id=claim.execution_id) is None  # another boot
    assert dead(job_id, worker="host-a#b00t", pid=4243, execution_id=claim.execution_id) is None  # another child
    assert dead(job_id, **mine) is None  # no execution named: never by host and pid alone
    assert dead(job_id, **mine, task_id="task-2") is None  # another message
    ended = dead(job_id, **mine, task_id="task-1")  # a message without the headers: its task id
    assert ended == repairs.Ended(execution_id=claim.execution_id, job_id=job_id, status=Status.RETRYING,
                                 retry_count=1, slot=SLOT, trigger=Trigger.MANUAL)
    r = row(claim.execution_id)
    assert (r.status, r.retry_count, r.completed, r.success, r.ended, r.pid) == (
        Status.RETRYING, 1, False, None, None, None)
    assert r.lease_until == db_now() and (r.message, r.error_code) == ("the child died", "WORKER_LOST")
    assert (r.attempts[-1]["status"], r.attempts[-1]["error_code"]) == ("LOST", "WORKER_LOST")
    job_row = CronJob.objects.get(id=job_id)
    assert (job_row.consecutive_failures, job_row.last_status, job_row.last_run_at) == (0, "", None)
    assert row(other.execution_id).status == Status.RUNNING  # the other run of the same worker and pid
    assert dead(job_id, **mine, execution_id=claim.execution_id) is None  # no longer RUNNING: nothing matches


def test_a_dead_attempt_at_the_cap_is_final_and_counted_on_the_job():
    job, job_id = make_job(max_retries=1)
    execution_id = enqueue(job, job_id, trigger=Trigger.ENQUEUE)
    first = begin(job, job_id, execution_id=execution_id, worker="h", pid=1)
    assert retry(job_id, first)
    begin(job, job_id, execution_id=execution_id, worker="h", pid=2)
    ended = dead(job_id, worker="h", pid=2, execution_id=execution_id)
    assert ended is not None and (ended.status, ended.retry_count) == (Status.LOST, 1)
    r = row(execution_id)
    assert (r.status, r.completed, r.success, r.lease_until) == (Status.LOST, True, False, None)
    assert r.ended is not None and [a["status"] for a in r.attempts] == ["FAILED", "LOST"]
    job_row = CronJob.objects.get(id=job_id)
    assert (job_row.consecutive_failures, job_row.last_status) == (1, Status.LOST)
    assert job_row.last_run_at is not None


def test_retry_false_makes_a_dead_attempt_final_even_with_attempts_left():
    job, job_id = make_job(max_retries=3)
    claim = begin(job, job_id, worker="h", pid=7)
    ended = dead(job_id, Status.TIMED_OUT, error_code="TIME_LIMIT", worker="h", pid=7, retry=False,
                 execution_id=claim.execution_id)
    assert ended is not None and (ended.status, ended.retry_count) == (Status.TIMED_OUT, 0)
    assert (row(claim.execution_id).status, row(claim.execution_id).success) == (Status.TIMED_OUT, False)
    assert CronJob.objects.get(id=job_id).last_status == Status.TIMED_OUT


def test_by_execution_id_only_an_expired_lease_is_ended():
    job, job_id = make_job(max_retries=2)
    claim = begin(job, job_id, worker="h", pid=9)
    before = snapshot()
    assert dead(job_id, execution_id=claim.execution_id, error_code="LEASE_EXPIRED") is None  # still live
    assert snapshot() == before
    _other, other_id = make_job(max_retries=2)
    expire(claim.execution_id)
    expired = snapshot()
    assert dead(other_id, execution_id=claim.execution_id) is None  # not that job's execution
    assert snapshot() == expired
    ended = dead(job_id, execution_id=claim.execution_id, error_code="LEASE_EXPIRED")
    assert ended is not None and (ended.status, ended.retry_count) == (Status.RETRYING, 1)
    r = row(claim.execution_id)
    assert (r.status, r.error_code, r.attempts[-1]["status"]) == (Status.RETRYING, "LEASE_EXPIRED", "LOST")
    assert CronJob.objects.get(id=job_id).consecutive_failures == 0


# --- 5. the reconciler ------------------------------------------------------------------------

@reconcile_settings
def test_an_expired_run_with_attempts_left_is_lost_retried_and_sent_again(queue):
    job, job_id = make_job(max_retries=2)
    execution_id = enqueue(job, job_id, trigger=Trigger.BEAT)
    claim = begin(job, job_id, execution_id=execution_id, worker="gone", pid=1)
    expire(execution_id)
    assert reconciler.run_pass(NOW) == report(lost=1, retried=1)
    r = row(execution_id)
    assert (r.status, r.retry_count, r.error_code, r.pid, r.lease_until) == (
        Status.RETRYING, 1, "LEASE_EXPIRED", None, db_now())
    assert (r.attempts[-1]["status"], r.attempts[-1]["fence"]) == ("LOST", claim.fence)
    (headers,) = queue.headers()
    assert headers["task"] == job.task_name
    assert (headers[tasks.HEADER_EXECUTION], headers[tasks.HEADER_SLOT], headers[tasks.HEADER_TRIGGER]) == (
        execution_id, slots.iso(SLOT), Trigger.BEAT)
    assert CronJob.objects.get(id=job_id).consecutive_failures == 0


@reconcile_settings
def test_the_retry_the_reconciler_sends_keeps_the_executions_task_id_so_a_queued_message_is_found(queue):
    """The retry of an expired run is sent under the execution's Celery task id: the stranded
    check looks a RETRYING execution's message up by that id, and one sent under a new id would
    look lost while it waits in a backlog (sent again, and finally given up as LOST)."""
    job, job_id = make_job(max_retries=2)
    execution_id = enqueue(job, job_id, trigger=Trigger.BEAT)
    begin(job, job_id, execution_id=execution_id, worker="gone", pid=1)
    dispatch.set_celery_task_id(execution_id, "the-first-message")
    expire(execution_id)
    assert reconciler.run_pass(NOW) == report(lost=1, retried=1)
    (headers,) = queue.headers()
    assert (headers["id"], row(execution_id).celery_task_id) == ("the-first-message", "the-first-message")


@reconcile_settings
def test_an_expired_run_without_attempts_left_is_lost_for_good_and_not_sent(queue):
    job, job_id = make_job()
    claim = begin(job, job_id, worker="gone", pid=1)
    expire(claim.execution_id)
    assert reconciler.run_pass(NOW) == report(lost=1)
    r = row(claim.execution_id)
    assert (r.status, r.completed, r.success, r.error_code) == (Status.LOST, True, False, "LEASE_EXPIRED")
    assert queue.headers() == []
    job_row = CronJob.objects.get(id=job_id)
    assert (job_row.consecutive_failures, job_row.last_status) == (1, Status.LOST)


@pytest.mark.django_db(transaction=True)
def test_a_retry_sent_by_the_reconciler_is_run_by_a_real_worker():
    job = jobs.dies_once.job  # max_retries=2; returns at once from its second attempt on
    assert job is not None
    job_id = job_rows.job_id(job)
    execution_id = enqueue(job, job_id, trigger=Trigger.BEAT)
    claim = begin(job, job_id, execution_id=execution_id, worker="vanished-host", pid=1)
    expire(execution_id)
    with start_worker(app, pool="threads", concurrency=1, perform_ping_check=False, loglevel="WARNING",
                      shutdown_timeout=30):
        assert reconciler.run_pass(NOW) == report(lost=1, retried=1)
        wait_for(lambda: row(execution_id).status == Status.SUCCEEDED, timeout=30, what="the retry to run")
    r = row(execution_id)
    assert (r.retry_count, r.message, r.completed, r.success) == (1, "done on attempt 2", True, True)
    assert [(a["status"], a.get("error_code")) for a in r.attempts] == [("LOST", "LEASE_EXPIRED"),
                                                                         ("SUCCEEDED", "")]
    assert r.fence is not None and r.fence > claim.fence
    job_row = CronJob.objects.get(id=job_id)
    assert (job_row.consecutive_failures, job_row.last_status) == (0, Status.SUCCEEDED)
    assert CronExecution.objects.count() == 1


@reconcile_settings
def test_stranded_beat_slots_follow_the_catch_up_policy(queue):
    none, none_id = make_job(catch_up="none")
    latest, latest_id = make_job(catch_up="latest")
    every, every_id = make_job(catch_up="all")
    later = SLOT + dt.timedelta(hours=1)
    # As beat writes it: a PENDING row with the Celery task id chosen at dispatch.
    dispatched = dispatch.dispatch(job=every, job_id=every_id, expected_next_run_at=None,
                                 next_run_at=dt.datetime(2099, 1, 1, tzinfo=dt.UTC), run=[later], missed=[])
    ((all_new, _slot),) = dispatched.to_publish
    stranded = {
        "none": enqueue(none, none_id),
        "latest-old": enqueue(latest, latest_id),
        "latest-new": enqueue(latest, latest_id, slot=later),  # newer: it is not run late
        "all-old": enqueue(every, every_id),
        "all-new": all_new,
    }
    for execution_id in stranded.values():
        backdate(execution_id)
    fresh = enqueue(every, every_id, slot=later + dt.timedelta(hours=1))  # within PENDING_GRACE: left alone
    assert reconciler.run_pass(NOW) == report(missed=2, resent=3)
    for key in ("none", "latest-old"):
        r = row(stranded[key])
        assert (r.status, r.error_code, r.completed, r.success, r.republished) == (
            Status.MISSED, "NOT_DELIVERED", True, None, 0)
    assert "catch-up policy is 'none'" in row(stranded["none"]).message
    assert "a newer slot was dispatched" in row(stranded["latest-old"]).message
    resent = [stranded[key] for key in ("latest-new", "all-old", "all-new")]
    for execution_id in resent:
        r = row(execution_id)
        assert (r.status, r.republished, r.lease_until) == (Status.PENDING, 1, db_now())
    sent = {h[tasks.HEADER_EXECUTION]: h for h in queue.headers()}
    assert sorted(sent) == sorted(resent) and len(queue.headers()) == 3
    task_id = row(all_new).celery_task_id
    assert task_id and sent[all_new]["id"] == task_id  # the same task id as beat's message
    assert {key: h["task"] for key, h in sent.items()} == {
        stranded["latest-new"]: latest.task_name, stranded["all-old"]: every.task_name, all_new: every.task_name}
    # Under 'all' a slot sent again runs late: a catch-up; under 'latest' it is sent as it was.
    assert {key: (row(key).trigger, h[tasks.HEADER_TRIGGER]) for key, h in sent.items()} == {
        stranded["latest-new"]: (Trigger.BEAT, Trigger.BEAT), stranded["all-old"]: (Trigger.CATCH_UP, Trigger.CATCH_UP),
        all_new: (Trigger.CATCH_UP, Trigger.CATCH_UP)}
    assert row(fresh).status == Status.PENDING and row(fresh).republished == 0
    assert set(CronJob.objects.filter(id__in=[none_id, latest_id, every_id]).values_list(
        "consecutive_failures", flat=True)) == {0}  # MISSED is not a failure


@reconcile_settings
def test_a_stranded_beat_slot_older_than_the_catch_up_window_is_missed_not_sent_again(queue):
    """The window is the scheduler's: a beat slot whose message never reached a worker is sent again
    only while it is inside the job's catch-up window (as a catch-up, under 'all'); older, it is
    recorded MISSED. A run somebody asked for (a backfill) is sent again whatever its age."""
    job, job_id = make_job(catch_up="all", schedule=HOURLY, catch_up_window=dt.timedelta(hours=6))
    recent = db_now().replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=1)
    rows = {"old": enqueue(job, job_id), "recent": enqueue(job, job_id, slot=recent),
            "backfill": enqueue(job, job_id, slot=SLOT + dt.timedelta(hours=1), trigger=Trigger.BACKFILL)}
    for execution_id in rows.values():
        backdate(execution_id)
    assert reconciler.run_pass(NOW) == report(missed=1, resent=2)
    old = row(rows["old"])
    assert (old.status, old.error_code, old.completed, old.republished) == (Status.MISSED, "NOT_DELIVERED", True, 0)
    assert "older than the job's catch_up_window" in old.message, old.message
    assert [(row(rows[key]).status, row(rows[key]).trigger, row(rows[key]).republished)
            for key in ("recent", "backfill")] == [(Status.PENDING, Trigger.CATCH_UP, 1),
                                                   (Status.PENDING, Trigger.BACKFILL, 1)]
    assert sorted(h[tasks.HEADER_EXECUTION] for h in queue.headers()) == sorted([rows["recent"], rows["backfill"]])


@reconcile_settings
def test_under_catch_up_all_a_stranded_beat_slot_is_sent_again_as_a_catch_up_and_waits_for_the_live_run(queue):
    """Only a PENDING beat slot of a job whose policy is 'all' now (the job's row: it may have changed
    since the slot was dispatched) becomes CATCH_UP, before it is sent; every other trigger, and a retry
    of a beat slot, is sent as it is. Both copies of the slot's message, the original (BEAT) turning up
    after all and the one sent again, then wait for the job's live run: neither is skipped."""
    every, every_id = make_job(catch_up="all", max_retries=1)
    retrying = begin(every, every_id, slot=SLOT + dt.timedelta(hours=1), trigger=Trigger.BEAT)
    assert retry(every_id, retrying, countdown=0)
    switched, switched_id = make_job(catch_up="none")
    rows = {
        "beat": enqueue(every, every_id),
        "switched": enqueue(switched, switched_id),
        "catch-up": enqueue(every, every_id, slot=SLOT + dt.timedelta(hours=2), trigger=Trigger.CATCH_UP),
        "backfill": enqueue(every, every_id, slot=SLOT + dt.timedelta(hours=3), trigger=Trigger.BACKFILL),
        "enqueued": enqueue(every, every_id, slot=SLOT + dt.timedelta(hours=4), trigger=Trigger.ENQUEUE),
        "one-off": enqueue(every, every_id, slot=SLOT + dt.timedelta(hours=5), trigger=Trigger.ONE_OFF),
    }
    sql(f"UPDATE {executions.EXE} SET celery_task_id = 'one-off-task' WHERE id = %s", [rows["one-off"]])
    CronJob.objects.filter(id=switched_id).update(catch_up="all")  # a deploy changed its policy since
    for execution_id in rows.values():
        backdate(execution_id)
    expire(retrying.execution_id)  # its retry was due five minutes ago and never came
    live = begin(every, every_id, slot=SLOT + dt.timedelta(hours=6))
    assert live.claimed
    assert reconciler.run_pass(NOW) == report(resent=7)
    expected = {"beat": Trigger.CATCH_UP, "switched": Trigger.CATCH_UP, "catch-up": Trigger.CATCH_UP,
                "backfill": Trigger.BACKFILL, "enqueued": Trigger.ENQUEUE, "one-off": Trigger.ONE_OFF}
    assert {key: row(execution_id).trigger for key, execution_id in rows.items()} == expected
    assert row(retrying.execution_id).trigger == Trigger.BEAT  # a retry waits for a live run anyway
    sent = {h[tasks.HEADER_EXECUTION]: h[tasks.HEADER_TRIGGER] for h in queue.headers()}
    assert sent == {**{rows[key]: trigger for key, trigger in expected.items()},
                    retrying.execution_id: Trigger.BEAT}
    for trigger in (Trigger.BEAT, Trigger.CATCH_UP):  # the original message, then the copy sent again
        claim = begin(every, every_id, execution_id=rows["beat"], trigger=trigger)
        assert (claim.outcome, claim.blocker) == (claims.WAITING, live.execution_id), claim
    assert (row(rows["beat"]).status, row(rows["beat"]).skip_reason) == (Status.PENDING, "")


@reconcile_settings
def test_enqueued_and_retrying_executions_are_always_sent_again(queue):
    job, job_id = make_job(catch_up="none", max_retries=1)
    enqueued = enqueue(job, job_id, trigger=Trigger.ENQUEUE)
    backdate(enqueued)
    retrying_claim = begin(job, job_id, slot=SLOT + dt.timedelta(hours=1), trigger=Trigger.BEAT)
    assert retry(job_id, retrying_claim, countdown=0)
    sql(f"UPDATE {executions.EXE} SET lease_until = now() - interval '2 minutes' WHERE id = %s",
        [retrying_claim.execution_id])  # its retry was due two minutes ago and never came
    assert reconciler.run_pass(NOW) == report(resent=2)
    assert (row(enqueued).status, row(enqueued).republished) == (Status.PENDING, 1)
    retrying = row(retrying_claim.execution_id)
    assert (retrying.status, retrying.republished, retrying.lease_until) == (Status.RETRYING, 1, db_now())
    sent = {h[tasks.HEADER_EXECUTION]: h for h in queue.headers()}
    assert set(sent) == {enqueued, retrying_claim.execution_id}
    assert sent[enqueued][tasks.HEADER_TRIGGER] == Trigger.ENQUEUE
    assert sent[retrying_claim.execution_id][tasks.HEADER_TRIGGER] == Trigger.BEAT


@reconcile_settings
def test_a_message_sent_republish_limit_times_is_given_up_as_lost(queue):
    job, job_id = make_job(catch_up="all")
    last_try = enqueue(job, job_id)
    given_up = enqueue(job, job_id, slot=SLOT + dt.timedelta(hours=1))
    for execution_id, republished in ((last_try, 1), (given_up, 2)):  # REPUBLISH_LIMIT is 2
        backdate(execution_id)
        sql(f"UPDATE {executions.EXE} SET republished = %s WHERE id = %s", [republished, execution_id])
    assert reconciler.run_pass(NOW) == report(resent=1, abandoned=1)
    assert (row(last_try).status, row(last_try).republished) == (Status.PENDING, 2)
    lost = row(given_up)
    assert (lost.status, lost.completed, lost.success, lost.error_code) == (Status.LOST, True, False, "NOT_DELIVERED")
    assert "sent 3 times" in lost.message and lost.republished == 2
    assert [h[tasks.HEADER_EXECUTION] for h in queue.headers()] == [last_try]
    job_row = CronJob.objects.get(id=job_id)
    assert (job_row.consecutive_failures, job_row.last_status) == (1, Status.LOST)


EIGHT = NOW.replace(hour=8, minute=0)


def overdue(catch_up, schedule=HOURLY, next_run_at=EIGHT):
    job, job_id = make_job(catch_up=catch_up)
    CronJob.objects.filter(id=job_id).update(schedule=schedule, schedule_timezone="UTC", next_run_at=next_run_at)
    return job, job_id


def slots_of(job_id, status):
    return list(CronExecution.objects.filter(job_id=job_id, status=status).order_by("slot")
                .values_list("slot", flat=True))


def hours(*values):
    return [NOW.replace(hour=h, minute=0) for h in values]


@reconcile_settings
def test_undispatched_slots_under_none_are_all_missed_and_the_job_advances():
    _job, job_id = overdue("none")
    assert reconciler.run_pass(NOW) == report(missed=5)
    assert slots_of(job_id, Status.MISSED) == hours(8, 9, 10, 11, 12)
    assert CronExecution.objects.filter(job_id=job_id).count() == 5
    r = CronExecution.objects.filter(job_id=job_id).first()
    assert r is not None and (r.trigger, r.run_number, r.completed, r.success) == (Trigger.BEAT, 1, True, None)
    next_run_at = CronJob.objects.get(id=job_id).next_run_at
    assert next_run_at == NOW.replace(hour=13, minute=0)
    assert next_run_at > NOW - dt.timedelta(seconds=RECONCILE["MISSED_GRACE"])


@reconcile_settings
def test_undispatched_slots_under_latest_leave_the_newest_for_beat():
    _job, job_id = overdue("latest")
    assert reconciler.run_pass(NOW) == report(missed=4)
    assert slots_of(job_id, Status.MISSED) == hours(8, 9, 10, 11)
    assert CronExecution.objects.filter(job_id=job_id).exclude(status=Status.MISSED).count() == 0
    assert CronJob.objects.get(id=job_id).next_run_at == NOW.replace(hour=12, minute=0)


@reconcile_settings
def test_undispatched_slots_under_all_wait_for_beat_and_fresh_or_paused_jobs_are_left_alone():
    _job, all_id = overdue("all")
    _job, paused_id = overdue("none")
    CronJob.objects.filter(id=paused_id).update(paused=True)
    _job, fresh_id = overdue("none", schedule="every 60s", next_run_at=NOW - dt.timedelta(seconds=90))
    before = snapshot()
    assert reconciler.run_pass(NOW) == report()
    assert snapshot() == before
    assert not CronExecution.objects.filter(job_id__in=[all_id, paused_id, fresh_id]).exists()


@reconcile_settings
def test_undispatched_slots_of_an_all_job_older_than_its_catch_up_window_are_missed_the_rest_wait_for_beat():
    """No beat runs: the slots that fell out of the window never run, whatever the policy, so the
    reconciler records them MISSED (cutoff 12:30, a two-hour window: before 10:30); 11:00 and 12:00
    are inside it and wait for the beat, which sends them late."""
    _job, job_id = make_job(catch_up="all", schedule=HOURLY, catch_up_window=dt.timedelta(hours=2))
    CronJob.objects.filter(id=job_id).update(schedule=HOURLY, schedule_timezone="UTC", next_run_at=EIGHT)
    assert reconciler.run_pass(NOW) == report(missed=3)
    assert slots_of(job_id, Status.MISSED) == hours(8, 9, 10)
    assert CronExecution.objects.filter(job_id=job_id).exclude(status=Status.MISSED).count() == 0
    assert CronJob.objects.get(id=job_id).next_run_at == NOW.replace(hour=11, minute=0)


@reconcile_settings
def test_an_interval_job_records_its_missed_slots_too():
    _job, job_id = overdue("none", schedule="every 600s", next_run_at=NOW.replace(hour=11, minute=0))
    # cutoff 12:30: 11:00 ... 12:30 is ten slots; the last is exactly at the cutoff, so on time
    # (within half an interval): it is left for beat and the nine before it are MISSED.
    report_ = reconciler.run_pass(NOW)
    missed = slots_of(job_id, Status.MISSED)
    assert report_ == report(missed=len(missed))
    assert missed == [NOW.replace(hour=11, minute=0) + dt.timedelta(minutes=10 * i) for i in range(9)]
    assert CronJob.objects.get(id=job_id).next_run_at == NOW.replace(hour=12, minute=30)


@contextlib.contextmanager
def pass_lease_held_elsewhere() -> Iterator[None]:
    """Another worker's pass holds the lease row. The row is all that counts, not the session
    that wrote it (that is what makes it work behind a pooler), so it is written here, under
    another token, inside the test's transaction."""
    assert leadership.hold(reconciler.PASS_LEASE, "another-worker", "elsewhere:1", 60)
    try:
        yield
    finally:
        assert leadership.release(reconciler.PASS_LEASE, "another-worker")


@reconcile_settings
def test_a_pass_is_skipped_while_another_holds_the_pass_lease_and_releases_its_own():
    job, job_id = make_job()
    claim = begin(job, job_id)
    expire(claim.execution_id)
    _job, overdue_id = overdue("none")
    before = snapshot()
    with pass_lease_held_elsewhere():
        skipped = reconciler.run_pass(NOW)
        assert skipped == reconciler.Report(ran=False)
        assert str(skipped) == "skipped (another pass is running)"
        assert snapshot() == before
        assert leadership.holder(reconciler.PASS_LEASE) == "elsewhere:1"  # the skipped pass left it alone
    assert leadership.holder(reconciler.PASS_LEASE) is None
    done = reconciler.run_pass(NOW)
    assert done == report(lost=1, missed=5) and str(done).startswith("lost 1, retried 0")
    assert row(claim.execution_id).status == Status.LOST
    assert leadership.holder(reconciler.PASS_LEASE) is None  # the pass released its lease
    assert CronExecution.objects.filter(job_id=overdue_id, status=Status.MISSED).count() == 5


@reconcile_settings
def test_a_second_pass_changes_nothing(queue):
    job, job_id = make_job(max_retries=1, catch_up="none")
    running = begin(job, job_id, worker="gone", pid=3)
    expire(running.execution_id)
    stranded = enqueue(job, job_id, slot=SLOT + dt.timedelta(hours=1))
    backdate(stranded)
    enqueued = enqueue(job, job_id, slot=SLOT + dt.timedelta(hours=2), trigger=Trigger.ENQUEUE)
    backdate(enqueued)
    _job, _latest_id = overdue("latest")
    _job, _none_id = overdue("none", schedule="every 60s")
    first = reconciler.run_pass(NOW)
    assert (first.lost, first.retried, first.resent, first.abandoned) == (1, 1, 1, 0)
    assert first.missed > 5
    after_first = snapshot()
    sent = len(queue.headers())
    assert sent == 2
    assert reconciler.run_pass(NOW) == report()
    assert snapshot() == after_first
    assert len(queue.headers()) == sent


# --- 6. the timing checks ---------------------------------------------------------------------

def ids(messages):
    return [message.id for message in messages]


def test_the_test_settings_pass_the_timing_checks():
    assert checks.check_timing() == []


@pytest.mark.parametrize(
    ("reconcile", "expected"),
    [
        ({"INTERVAL": -1}, ["'INTERVAL'"]),
        ({"PENDING_GRACE": 0}, ["'PENDING_GRACE'"]),
        ({"MISSED_GRACE": "soon"}, ["'MISSED_GRACE'"]),
        ({"REPUBLISH_LIMIT": 1.5}, ["'REPUBLISH_LIMIT'"]),
        ({"BATCH": 0}, ["'BATCH'"]),
        ({"INTERVAL": True}, ["'INTERVAL'"]),
        ({"INTERVALS": 5}, ["unknown keys ['INTERVALS']"]),
        ({"EXTRA": 1, "BATCH": None, "PENDING_GRACE": -3}, ["unknown keys ['EXTRA']", "'PENDING_GRACE'", "'BATCH'"]),
        ("fast", ["must be a dict"]),
    ],
)
def test_bad_reconciler_settings_are_e008(reconcile, expected):
    with override_settings(CRON_CELERY={"RECONCILE": reconcile}):
        errors = checks.check_timing()
    assert ids(errors) == ["cron_celery.E008"] * len(expected)
    for error, fragment in zip(errors, expected, strict=True):
        assert fragment in error.msg


def test_good_reconciler_settings_pass():
    with override_settings(CRON_CELERY={"RECONCILE": {**conf.RECONCILE_DEFAULTS, "INTERVAL": 0, "MISSED_GRACE": 0.5}}):
        assert checks.check_timing() == []


@contextlib.contextmanager
def visibility_timeout(seconds: float) -> Iterator[None]:
    previous = app.conf.broker_transport_options
    app.conf.broker_transport_options = {"visibility_timeout": seconds}
    try:
        assert conf.celery_visibility_timeout() == seconds
        yield
    finally:
        app.conf.broker_transport_options = previous


@contextlib.contextmanager
def registered(**options: Any) -> Iterator[registry.Job]:
    job = registry.register(registry.declare(name="timing-check", code="TC1", task_name="tests.timing_check",
                                             **options))
    try:
        yield job
    finally:
        registry.unregister(job.name)


def mine(errors):
    return [error for error in errors if "'timing-check'" in error.msg]


def test_a_time_limit_not_below_the_visibility_timeout_is_e009():
    with visibility_timeout(100), registered(time_limit=100):
        errors = mine(checks.check_timing())
    assert ids(errors) == ["cron_celery.E009"] and "visibility_timeout (100 s)" in errors[0].msg
    with visibility_timeout(100), registered(time_limit=99.5):
        assert mine(checks.check_timing()) == []
    with visibility_timeout(100), registered(time_limit=500):
        registry.unregister("timing-check")
        assert mine(checks.check_timing()) == []  # only registered jobs are checked


@pytest.mark.parametrize(
    ("options", "visibility", "expected"),
    [
        ({"max_retries": 1, "retry_backoff_max": 50}, 100, ["cron_celery.E010"]),
        ({"max_retries": 1, "retry_backoff_max": 49}, 100, []),
        ({"max_retries": 0, "retry_backoff_max": 500}, 100, []),  # never retried: no wait
        ({"max_retries": 1, "retry_backoff": False}, 300, ["cron_celery.E010"]),  # 180 s >= 150 s
        ({"max_retries": 1, "retry_backoff": False, "retry_backoff_max": 10}, 400, []),  # 180 s < 200 s
        ({"max_retries": 2, "retry_backoff_max": 60, "time_limit": 120}, 120, ["cron_celery.E009", "cron_celery.E010"]),
    ],
)
def test_a_retry_wait_not_below_half_the_visibility_timeout_is_e010(options, visibility, expected):
    original = conf.celery_visibility_timeout()
    with visibility_timeout(visibility), registered(**options):
        errors = mine(checks.check_timing())
    assert ids(errors) == expected
    if "cron_celery.E010" in expected:
        assert "delivered twice" in errors[-1].msg
    assert conf.celery_visibility_timeout() == original  # restored
    assert registry.by_task_name("tests.timing_check") is None


# --- found while writing these tests, fixed since --------------------------------------------

@pytest.mark.django_db(transaction=True)
@override_settings(CRON_CELERY={**settings.CRON_CELERY, "RECONCILE": RECONCILE})  # the worker checks them all
def test_a_lost_rerun_message_is_sent_again_as_a_rerun():
    job = jobs.calc_commission.job  # rerun_on_failure
    assert job is not None
    job_id = job_rows.job_id(job)
    first = begin(job, job_id, trigger=Trigger.ENQUEUE)
    assert finishes.finish(job_id=job_id, execution_id=first.execution_id, fence=first.fence, status=Status.SUCCEEDED)
    # ``run_cron_task --enqueue --rerun``: a forced PENDING row whose message the broker lost.
    execution_id, run_number = dispatch.enqueue(job=job, job_id=job_id, slot=SLOT, execution_date=SLOT.date(),
                                              trigger=Trigger.ENQUEUE, forced=True)
    assert run_number == 2
    backdate(execution_id)
    with start_worker(app, pool="threads", concurrency=1, perform_ping_check=False, loglevel="WARNING",
                      shutdown_timeout=30):
        assert reconciler.run_pass(NOW) == report(resent=1)
        wait_for(lambda: row(execution_id).completed, timeout=30, what="the re-sent rerun")
    r = row(execution_id)
    assert (r.status, r.skip_reason) == (Status.SUCCEEDED, "")


@override_settings(CRON_CELERY={"RECONCILE": {**RECONCILE, "BATCH": 1}})
def test_overdue_catch_up_all_jobs_do_not_starve_the_others_of_their_missed_slots():
    _job, _all_id = overdue("all", next_run_at=NOW.replace(hour=2, minute=0))  # older: first in line
    _job, none_id = overdue("none")
    for _ in range(3):
        reconciler.run_pass(NOW)
    assert slots_of(none_id, Status.MISSED) == hours(8, 9, 10, 11, 12)

