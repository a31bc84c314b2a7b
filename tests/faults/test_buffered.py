"""Slots that a person or the catch-up policy asked for wait for the job's live run instead of
being skipped; a retry that meets the next slot keeps its failure; a backlog is not a loss.

Real ``celery worker`` processes (prefork, several children) on the session's Redis broker or on
the machine's RabbitMQ, real PostgreSQL and a lock Redis of the test's own.
"""

from __future__ import annotations

import datetime as dt
import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from cron_celery import reconciler, slots
from cron_celery.decisions import dispatch, executions
from cron_celery.decisions import jobs as job_rows
from cron_celery.models import Alert, CronExecution, CronJob, Status, Trigger
from cron_celery.run import backfill, tasks
from tests.celery_app import app
from tests.conftest import marked, wait_for
from tests.jobsapp import jobs_buffer as jobs
from tests.redis_servers import RedisServer
from tests.servers import HttpServer
from tests.workers import Worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

DAY = dt.date(2026, 11, 20)


@pytest.fixture
def lock_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path).start()
    yield server
    server.stop()


@pytest.fixture
def workers(tmp_path: Path, marker: Path, lock_redis: RedisServer) -> Iterator[Any]:
    started: list[Worker] = []

    def start(concurrency: int = 3, broker_url: str | None = None, **env: str) -> Worker:
        values = {"CRON_TEST_MARKER": str(marker), "CRON_TEST_LOCK_MASTERS": lock_redis.url,
                  "CRON_TEST_LOG_LEVEL": "INFO", **env}
        if broker_url is not None:
            values["CRON_TEST_BROKER_URL"] = broker_url
        worker = Worker(tmp_path, values, pool="prefork", concurrency=concurrency, broker_url=broker_url).start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


def rows(code: str) -> list[CronExecution]:
    return list(CronExecution.objects.filter(task_code=code).order_by("slot", "run_number"))


def all_final(code: str, count: int) -> bool:
    found = rows(code)
    return len(found) >= count and all(row.completed for row in found)


def never_overlapping(found: list[CronExecution]) -> None:
    spans = sorted((row.started, row.ended) for row in found if row.status == Status.SUCCEEDED)
    for (_, ended), (started, _) in itertools.pairwise(spans):
        assert ended <= started, f"two runs of an overlap-skip job overlapped: {spans}"


def test_a_backfill_of_an_overlap_skip_job_runs_every_slot_one_at_a_time(workers, marker):
    """24 hourly slots sent at once to a worker running three at a time: every slot runs, never two at
    once, none is SKIPPED; a second backfill of the same day finds nothing left to do."""
    workers(concurrency=3)
    job = jobs.hourly_exclusive.job
    planned = backfill.plan(job, DAY, DAY)
    assert len(planned.slots) == 24
    backfill.send(job, planned)
    wait_for(lambda: all_final("W001", 24), timeout=120, what="24 backfilled slots to finish")
    found = rows("W001")
    assert [row.status for row in found] == [Status.SUCCEEDED] * 24, [
        (row.slot, row.status, row.skip_reason) for row in found]
    assert sorted(row.slot for row in found) == planned.slots
    assert len([line for line in marked(marker) if line.startswith("hourly-exclusive")]) == 24
    never_overlapping(found)
    assert backfill.plan(job, DAY, DAY).slots == []


def test_catch_up_all_and_bulk_reruns_wait_for_the_live_run(workers, marker):
    """Slots the catch-up policy runs late (CATCH_UP) and a bulk re-run from the admin (ADMIN, rerun)
    meet each other's live runs: each waits its turn."""
    workers(concurrency=3)
    job = jobs.hourly_exclusive.job
    job_id = job_rows.job_id(job)
    start = dt.datetime.combine(DAY, dt.time(0), tzinfo=dt.UTC)
    late = [start + dt.timedelta(hours=hour) for hour in range(6)]
    dispatched = dispatch.dispatch(job=job, job_id=job_id, expected_next_run_at=None,
                                 next_run_at=late[-1] + dt.timedelta(hours=1), run=late, missed=[])
    for execution_id, slot in dispatched.to_publish:
        trigger = Trigger.CATCH_UP if execution_id in dispatched.catch_up_ids else Trigger.BEAT
        row = CronExecution.objects.get(id=execution_id)
        app.send_task(job.task_name, task_id=row.celery_task_id, headers=tasks.headers(execution_id, slot, trigger))
    reruns = [start + dt.timedelta(hours=hour) for hour in range(12, 18)]
    for slot in reruns:
        tasks.send_run(job, slot, Trigger.ADMIN, rerun=True)
    wait_for(lambda: all_final("W001", 12), timeout=120, what="12 slots to finish")
    found = rows("W001")
    # Every slot the policy promised runs, the newest of the catch-up too (it was BEAT, and so
    # SKIPPED OVERLAP when it met a running catch-up slot).
    assert [(row.trigger, row.status) for row in found] == \
        [(Trigger.CATCH_UP, Status.SUCCEEDED)] * 6 + [(Trigger.ADMIN, Status.SUCCEEDED)] * 6, [
        (row.slot, row.trigger, row.status, row.skip_reason) for row in found]
    assert sorted(line.split()[1] for line in marked(marker) if line.startswith("hourly-exclusive")) == \
        sorted(row.slot.isoformat() for row in found)
    never_overlapping(found)


def test_a_lost_beat_slot_of_a_catch_up_all_job_sent_again_during_a_live_run_waits_and_runs_once(
        workers, marker, tmp_path):
    """Catch-up ``all``: a beat slot whose message the broker lost (a PENDING BEAT row, no message) is sent
    again by a reconciler pass while another run of the overlap-skip job is live (held at a gate). Late,
    it is a catch-up: it waits for that run, then runs (never SKIPPED OVERLAP); its original message
    turning up as well does not run it a second time."""
    gate = tmp_path / "gate"
    workers(concurrency=2, CRON_TEST_GATE=str(gate))
    job = jobs.hourly_exclusive.job
    live_slot = dt.datetime(2026, 11, 21, 5, 0, tzinfo=dt.UTC)
    live = tasks.send_run(job, live_slot, Trigger.ENQUEUE)
    wait_for(lambda: CronExecution.objects.get(id=live.execution_id).status == Status.RUNNING,
             what="the live run to start")
    lost_slot = live_slot + dt.timedelta(hours=1)
    dispatched = dispatch.dispatch(job=job, job_id=job_rows.job_id(job), expected_next_run_at=None,
                                   next_run_at=lost_slot + dt.timedelta(hours=1), run=[lost_slot], missed=[])
    ((lost_id, _),) = dispatched.to_publish  # as beat wrote it, on time (BEAT); its message never arrives
    with connection.cursor() as cursor:  # dispatched an hour ago: past PENDING_GRACE
        cursor.execute(f"UPDATE {executions.EXE} SET created_at = now() - interval '1 hour' WHERE id = %s",
                       [lost_id])
    assert reconciler.run_pass().resent == 1
    original = CronExecution.objects.get(id=lost_id)  # the original message turns up after all
    app.send_task(job.task_name, task_id=original.celery_task_id,
                  headers=tasks.headers(lost_id, lost_slot, Trigger.BEAT))

    def met_the_live_run() -> bool:
        found = CronExecution.objects.get(id=lost_id)
        return found.waiting_since is not None or found.completed

    wait_for(met_the_live_run, what="the slot sent again to meet the live run")
    gate.touch()  # the live run ends
    wait_for(lambda: all_final("W001", 2), timeout=90, what="both runs to finish")
    resent, ran = CronExecution.objects.get(id=lost_id), CronExecution.objects.get(id=live.execution_id)
    assert (resent.status, resent.skip_reason, resent.trigger) == (Status.SUCCEEDED, "", Trigger.CATCH_UP), (
        resent.status, resent.skip_reason, resent.trigger, resent.message)
    assert ran.status == Status.SUCCEEDED and resent.started >= ran.ended
    assert [line.split()[1] for line in marked(marker) if line.startswith("hourly-exclusive")] == [
        live_slot.isoformat(), lost_slot.isoformat()]  # each slot's body once


def _retry_meets_next_slot(workers, marker, **env: str) -> tuple[CronExecution, CronExecution]:
    workers(concurrency=3, **env)
    job = jobs.retry_meets_next.job
    one = dt.datetime(2026, 11, 30, 1, 0, tzinfo=dt.UTC)
    first = tasks.send_run(job, one, Trigger.ENQUEUE)
    wait_for(lambda: CronExecution.objects.get(id=first.execution_id).status == Status.RETRYING,
             what="attempt 1 of 01:00 to fail and wait for its retry")
    second = tasks.send_run(job, one + dt.timedelta(hours=1), Trigger.ENQUEUE)
    wait_for(lambda: CronExecution.objects.get(id=second.execution_id).status == Status.RUNNING,
             what="slot 02:00 to start")
    wait_for(lambda: all_final("W002", 2), timeout=90, what="both slots to finish")
    return CronExecution.objects.get(id=first.execution_id), CronExecution.objects.get(id=second.execution_id)


def test_a_retry_that_meets_the_next_slot_waits_for_it_and_keeps_its_history(workers, marker):
    """01:00 fails attempt 1; its retry comes due while 02:00 runs (4 s): it waits, then runs after 02:00
    ended, and succeeds — never SKIPPED."""
    retried, other = _retry_meets_next_slot(workers, marker, CRON_TEST_SLEEP="4")
    assert other.status == Status.SUCCEEDED
    assert retried.status == Status.SUCCEEDED, (retried.status, retried.skip_reason, retried.message)
    assert [(a["status"], a.get("error_code")) for a in retried.attempts] == [
        (Status.FAILED, "ConnectionError"), (Status.SUCCEEDED, "")]
    assert dt.datetime.fromisoformat(retried.attempts[1]["started"]) >= other.ended, "attempt 2 overlapped 02:00"


def test_a_retry_that_meets_the_next_slot_and_fails_again_is_failed_counted_and_alerted(workers, marker):
    hook = HttpServer().start()
    try:
        retried, other = _retry_meets_next_slot(workers, marker, CRON_TEST_SLEEP="4", CRON_TEST_FAIL_ALWAYS="1",
                                                CRON_TEST_WEBHOOK_URL=hook.url)
    finally:
        hook.stop()
    assert retried.status == Status.FAILED and retried.success is False, (retried.status, retried.skip_reason)
    assert "attempt 2" in retried.message
    assert [a["status"] for a in retried.attempts] == [Status.FAILED, Status.FAILED]
    assert Alert.objects.filter(execution_id=retried.id, event="FAILED").exists()
    assert other.status == Status.SUCCEEDED
    assert dt.datetime.fromisoformat(retried.attempts[1]["started"]) >= other.ended, "attempt 2 overlapped 02:00"
    job_row = CronJob.objects.get(code="W002")
    assert (job_row.consecutive_failures, job_row.last_status) == (1, Status.FAILED)


def test_a_retry_of_a_paused_job_ends_failed_with_its_failure_counted_and_alerted(workers, marker):
    hook = HttpServer().start()
    try:
        workers(concurrency=1, CRON_TEST_WEBHOOK_URL=hook.url)
        job = jobs.retry_meets_next.job
        one = dt.datetime(2026, 11, 30, 1, 0, tzinfo=dt.UTC)
        sent = tasks.send_run(job, one, Trigger.ENQUEUE)
        wait_for(lambda: CronExecution.objects.get(id=sent.execution_id).status == Status.RETRYING,
                 what="attempt 1 to fail and wait for its retry")
        CronJob.objects.filter(code="W002").update(paused=True)
        wait_for(lambda: CronExecution.objects.get(id=sent.execution_id).completed, timeout=60,
                 what="the retry to reach the paused job")
    finally:
        hook.stop()
    row = CronExecution.objects.get(id=sent.execution_id)
    assert row.status == Status.FAILED and row.success is False, (row.status, row.skip_reason, row.message)
    assert row.error_code == "ConnectionError" and "attempt 1" in row.message and "paused" in row.message
    job_row = CronJob.objects.get(code="W002")
    assert job_row.consecutive_failures == 1 and job_row.last_status == Status.FAILED
    assert Alert.objects.filter(execution_id=row.id, event="FAILED").exists()
    assert [line.split()[0] for line in marked(marker)] == ["retry-meets-next-start"], "attempt 2 must not run"


def _backlog(workers, marker, code: str, task: Any, broker_url: str | None, **env: str) -> list[CronExecution]:
    """Ten beat slots of a one-second job queued at once for one worker process, with a reconciler every
    second and a PENDING_GRACE of two: the last slot waits about five graces."""
    workers(concurrency=1, broker_url=broker_url, CRON_TEST_RECONCILE_INTERVAL="1", CRON_TEST_PENDING_GRACE="2",
            CRON_TEST_SLEEP="1", **env)
    job = task.job
    job_id = job_rows.job_id(job)
    start = dt.datetime(2026, 11, 30, 3, 0, tzinfo=dt.UTC)
    slots = [start + dt.timedelta(minutes=minute) for minute in range(10)]
    dispatched = dispatch.dispatch(job=job, job_id=job_id, expected_next_run_at=None,
                                 next_run_at=slots[-1] + dt.timedelta(minutes=1), run=slots, missed=[])
    with app.connection_for_write(broker_url) if broker_url else app.connection_for_write() as conn:
        for execution_id, slot in dispatched.to_publish:
            trigger = Trigger.CATCH_UP if execution_id in dispatched.catch_up_ids else Trigger.BEAT
            row = CronExecution.objects.get(id=execution_id)
            app.send_task(job.task_name, task_id=row.celery_task_id, connection=conn,
                          headers=tasks.headers(execution_id, slot, trigger))
    wait_for(lambda: all_final(code, 10), timeout=120, what="the backlog to drain")
    found = rows(code)
    assert [(row.status, row.error_code) for row in found] == [(Status.SUCCEEDED, "")] * 10, [
        (row.slot, row.status, row.error_code, row.message) for row in found]
    assert len([line for line in marked(marker) if line.startswith(task.job.name)]) == 10
    return found


def test_a_backlog_longer_than_the_pending_grace_is_not_missed_or_lost_on_redis(workers, marker):
    _backlog(workers, marker, "W003", jobs.backlog_none, None)


def test_a_backlog_longer_than_the_pending_grace_is_not_lost_on_redis_under_catch_up_all(workers, marker):
    _backlog(workers, marker, "W004", jobs.backlog_all, None)


@pytest.fixture
def rabbitmq_url() -> Iterator[str]:
    url = os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//")
    yield url
    # The session's queue on the shared RabbitMQ goes with the test.
    from kombu import Connection, Queue

    with Connection(url) as conn:
        Queue(settings.CELERY_TASK_DEFAULT_QUEUE, channel=conn.channel()).delete()


def test_a_backlog_longer_than_the_pending_grace_is_not_missed_or_lost_on_rabbitmq(workers, marker, rabbitmq_url):
    _backlog(workers, marker, "W003", jobs.backlog_none, rabbitmq_url)


def test_a_delay_without_a_slot_fixes_its_slot_when_sent(queue):
    """``task.delay()`` names the current minute in its message, so a redelivery minutes later (a worker
    died) is the same slot, not a second one."""
    before = slots.floor_minute(dt.datetime.now(dt.UTC))
    result = jobs.delayed_now.delay()
    after = slots.floor_minute(dt.datetime.now(dt.UTC))
    [headers] = queue.headers()
    assert headers["id"] == result.id
    assert headers.get(tasks.HEADER_SLOT) in {slots.iso(before), slots.iso(after)}, headers
