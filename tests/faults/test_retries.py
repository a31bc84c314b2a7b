"""Retries, time limits, dying workers, a stopped broker and a warm shutdown, on real
``celery worker`` and ``celery beat`` processes with a Redis broker of the test's own (so it
can be stopped, and its unacknowledged messages inspected)."""

from __future__ import annotations

import datetime as dt
import itertools
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cron_celery.decisions import dispatch
from cron_celery.decisions import jobs as job_rows
from cron_celery.models import Alert, AlertStatus, CronExecution, CronJob, Status, Trigger
from cron_celery.run import tasks
from tests.celery_app import app
from tests.conftest import marked, wait_for
from tests.faults.test_beat import start_beat, stop
from tests.jobsapp import tasks as jobs
from tests.redis_servers import RedisServer
from tests.servers import HttpServer
from tests.workers import Worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SLOT = dt.datetime(2026, 11, 30, 1, 0, tzinfo=dt.UTC)
QUEUE = str(os.environ["CRON_CELERY_TEST_QUEUE"])


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path).start()
    yield server
    server.stop()


@pytest.fixture
def started(tmp_path: Path, marker: Path, broker: RedisServer) -> Iterator[Any]:
    """``started(**env)`` starts a real worker on the test's broker; all are stopped after."""
    workers: list[Worker] = []

    def start(pool: str = "prefork", **env: str) -> Worker:
        values = {"REDIS_URL": broker.url, "CRON_TEST_MARKER": str(marker), "CRON_TEST_LOG_LEVEL": "INFO", **env}
        worker = Worker(tmp_path, values, pool=pool, concurrency=1, broker_url=broker.url).start()
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.stop()


def enqueue(task: Any, broker: RedisServer, slot: dt.datetime = SLOT) -> int:
    """What ``run_cron_task --enqueue`` does: a PENDING row, then its message."""
    job = task.job
    execution_id, _ = dispatch.enqueue(job=job, job_id=job_rows.job_id(job), slot=slot, execution_date=slot.date(),
                                     trigger=Trigger.ENQUEUE)
    with app.connection_for_write(broker.url) as conn:
        app.send_task(job.task_name, headers=tasks.headers(execution_id, slot, Trigger.ENQUEUE), connection=conn)
    return execution_id


def settled(execution_id: int, timeout: float = 60) -> tuple[CronExecution, float]:
    """Wait until the execution is final; returns it and how long that took."""
    began = time.monotonic()
    wait_for(lambda: CronExecution.objects.get(id=execution_id).completed, timeout=timeout,
             what=f"execution {execution_id} to finish")
    return CronExecution.objects.get(id=execution_id), time.monotonic() - began


def stamps(marker: Path, label: str) -> list[tuple[int, float]]:
    """(attempt, time) of each line ``label attempt=N t=T`` the job bodies wrote."""
    found = []
    for line in marked(marker):
        parts = line.split()
        if parts[0] == label:
            found.append((int(parts[1].split("=")[1]), float(parts[2].split("=")[1])))
    return found


def attempt_log(row: CronExecution) -> list[tuple[str, str]]:
    return [(attempt.get("status", ""), attempt.get("error_code", "")) for attempt in row.attempts]


def test_a_worker_child_killed_mid_run_is_recorded_lost_and_run_again_with_a_new_fence(started, broker, marker):
    """Issue test 1: SIGKILL the child; its parent records the loss at once, the requeued
    message runs attempt 2 with the next fence, and the slot has one SUCCEEDED execution.
    The loss is alerted once (a webhook the worker delivers to)."""
    hook = HttpServer().start()
    started(CRON_TEST_WEBHOOK_URL=hook.url)
    execution_id = enqueue(jobs.dies_once, broker)
    wait_for(lambda: bool(stamps(marker, "dies-once")), what="the first attempt to start")
    child = CronExecution.objects.get(id=execution_id).pid
    assert child
    os.kill(child, signal.SIGKILL)
    row, took = settled(execution_id)
    print(f"settled {took:.1f} s after the kill")
    assert row.status == Status.SUCCEEDED and row.retry_count == 1
    assert attempt_log(row) == [(Status.LOST, "WORKER_LOST"), (Status.SUCCEEDED, "")]
    first, second = row.attempts
    assert second["fence"] == first["fence"] + 1 == row.fence
    assert second["pid"] != child
    assert [attempt for attempt, _ in stamps(marker, "dies-once")] == [1, 2]
    assert CronExecution.objects.filter(task_code="T121").count() == 1
    assert CronJob.objects.get(code="T121").consecutive_failures == 0
    wait_for(lambda: Alert.objects.filter(execution_id=execution_id, status=AlertStatus.SENT).exists(), timeout=30,
             what="the LOST alert to be delivered")
    hook.stop()
    alerts = list(Alert.objects.filter(execution_id=execution_id))
    assert [(alert.event, alert.channel) for alert in alerts] == [("LOST", "webhook")]
    sent = hook.received()
    assert len(sent) == 1 and sent[0].json()["event"] == "LOST" and sent[0].json()["execution_id"] == execution_id


def test_a_worker_killed_after_the_commit_but_before_the_ack_does_not_run_the_job_twice(
        started, broker, marker, tmp_path):
    """Issue test 2: the message comes back after the visibility timeout and does nothing."""
    dying = started(pool="solo", CRON_TEST_DIE_AFTER_COMMIT="1", CRON_TEST_VISIBILITY_TIMEOUT="3")
    execution_id = enqueue(jobs.commit_then_die, broker)
    assert dying.proc is not None
    dying.proc.wait(timeout=60)
    row = CronExecution.objects.get(id=execution_id)
    assert row.status == Status.SUCCEEDED
    assert broker.client().hlen("unacked") == 1, "the worker died holding the message unacknowledged"
    killed_at = time.monotonic()
    second = started(CRON_TEST_VISIBILITY_TIMEOUT="3")
    wait_for(lambda: "already SUCCEEDED; this delivery does nothing" in second.output(), timeout=60,
             what="the redelivered message to reach the second worker")
    print(f"redelivery handled {time.monotonic() - killed_at:.1f} s after the kill")
    wait_for(lambda: broker.client().hlen("unacked") == 0, timeout=20, what="the redelivery to be acknowledged")
    again = CronExecution.objects.get(id=execution_id)
    assert (again.status, again.ended, again.fence, again.retry_count) == (row.status, row.ended, row.fence, 0)
    assert len(stamps(marker, "commit-then-die")) == 1, "the job body ran twice"


def test_the_soft_time_limit_is_recorded_timed_out_and_retried_by_the_policy(started, broker, marker):
    """Issue test 3 (soft): SoftTimeLimitExceeded in both attempts of a job with one retry."""
    started()
    row, took = settled(enqueue(jobs.soft_limited, broker))
    print(f"settled in {took:.1f} s")
    assert row.status == Status.TIMED_OUT and row.error_code == "TIME_LIMIT" and row.retry_count == 1
    assert attempt_log(row) == [(Status.TIMED_OUT, "TIME_LIMIT")] * 2
    assert [attempt for attempt, _ in stamps(marker, "soft-limited")] == [1, 2]
    # The retry came after the first attempt had ended (an order of recorded events, not a time).
    first, second = (row.attempts[0], row.attempts[1])
    assert dt.datetime.fromisoformat(first["ended"]) <= dt.datetime.fromisoformat(second["started"])


def test_the_hard_time_limit_kill_is_recorded_by_the_parent_and_the_next_slot_runs(started, broker, marker):
    """Issue test 3 (hard): the parent records TIMED_OUT at once (the lease is 60 s and no
    reconciler runs), and the next slot runs although the killed child's lock was never released."""
    started(CRON_TEST_LEASE_SECONDS="60", CRON_TEST_LOCK_TTL="60")
    row, took = settled(enqueue(jobs.hard_limited, broker), timeout=30)
    print(f"recorded {took:.1f} s after enqueue (time limit 2 s)")
    assert row.status == Status.TIMED_OUT and row.error_code == "TIME_LIMIT"
    assert "hard time limit" in row.message and row.retry_count == 0
    assert attempt_log(row) == [(Status.TIMED_OUT, "TIME_LIMIT")]
    following, _ = settled(enqueue(jobs.hard_limited, broker, SLOT + dt.timedelta(minutes=1)), timeout=30)
    assert following.status == Status.SUCCEEDED, (following.status, following.skip_reason)


def test_a_job_that_kills_its_process_every_time_stops_at_the_attempt_cap(started, broker, marker):
    """Issue test 4: three deliveries (max_retries=2), final LOST, the message is gone."""
    started()
    row, took = settled(enqueue(jobs.poison, broker))
    print(f"settled in {took:.1f} s")
    assert row.status == Status.LOST and row.retry_count == 2
    assert attempt_log(row) == [(Status.LOST, "WORKER_LOST")] * 3
    time.sleep(3)  # a loop would show more deliveries by now
    assert [attempt for attempt, _ in stamps(marker, "poison")] == [1, 2, 3]
    client = broker.client()
    assert client.llen(QUEUE) == 0 and client.hlen("unacked") == 0
    job = CronJob.objects.get(code="T122")
    assert job.last_status == Status.LOST and job.consecutive_failures == 1


def test_retries_follow_the_backoff_and_end_in_one_succeeded_row_without_a_failure(started, broker, marker):
    """Issue test 6: fails twice (retryable), succeeds on attempt 3; waits of at least 1 s then 2 s."""
    started()
    row, took = settled(enqueue(jobs.flaky_twice, broker))
    print(f"settled in {took:.1f} s")
    assert row.status == Status.SUCCEEDED and row.retry_count == 2 and row.success is True
    assert attempt_log(row) == [(Status.FAILED, "ConnectionError")] * 2 + [(Status.SUCCEEDED, "")]
    assert "attempt 1" in row.attempts[0]["message"] and "attempt 2" in row.attempts[1]["message"]
    times = stamps(marker, "flaky-twice")
    assert [attempt for attempt, _ in times] == [1, 2, 3]
    (_, t1), (_, t2), (_, t3) = times
    assert t2 - t1 >= 1.0 and t3 - t2 >= 2.0, (t2 - t1, t3 - t2)
    assert CronExecution.objects.filter(task_code="T120").count() == 1
    assert CronJob.objects.get(code="T120").consecutive_failures == 0


def test_sigterm_stops_a_cooperative_job_early_and_its_retry_finishes_it(started, broker, marker):
    """Issue test 7: the job sees the shutdown, the attempt is recorded INTERRUPTED and
    retried, the worker exits long before the job would have ended (60 s)."""
    worker = started()
    execution_id = enqueue(jobs.cooperative, broker)
    wait_for(lambda: bool(stamps(marker, "cooperative")), what="the job to start")
    assert worker.proc is not None
    asked = time.monotonic()
    worker.proc.send_signal(signal.SIGTERM)  # to the main process only, as docker stop does
    worker.proc.wait(timeout=30)
    print(f"worker exited {time.monotonic() - asked:.1f} s after SIGTERM")
    assert stamps(marker, "cooperative-saw-shutdown")
    row = CronExecution.objects.get(id=execution_id)
    assert row.status == Status.RETRYING and attempt_log(row) == [(Status.FAILED, "INTERRUPTED")]
    started()
    row, _ = settled(execution_id)
    assert row.status == Status.SUCCEEDED and row.retry_count == 1
    assert row.message == "finished on the second attempt"


def test_a_broker_down_for_two_slots_leaves_nothing_silently_missing(started, broker, marker, tmp_path):
    """Issue test 5: beat keeps inserting slots while the broker is down; once it is back the
    reconciler sends the stranded ones again (catch-up 'all') or records them MISSED
    (catch-up 'latest', newer slots ran); every slot has exactly one final row."""
    env = {"REDIS_URL": broker.url, "CRON_TEST_MARKER": str(marker), "CRON_CELERY_BEAT_ALWAYS_LEAD": "1",
           "CRON_TEST_RECONCILE_INTERVAL": "1", "CRON_TEST_PENDING_GRACE": "3"}
    started(CRON_TEST_RECONCILE_INTERVAL="1", CRON_TEST_PENDING_GRACE="3")
    beat = start_beat(tmp_path, env, 0)
    names = ("catch-up-latest", "catch-up-all")
    try:
        wait_for(lambda: all(CronExecution.objects.filter(task_name=name, status=Status.SUCCEEDED).count() >= 2
                             for name in names), timeout=60, what="the first slots")
        broker.stop()
        down = time.time()
        time.sleep(5)
        broker.start()
        up = time.time()
        wait_for(lambda: all(CronExecution.objects.filter(task_name=name, status=Status.SUCCEEDED,
                                                          slot__gt=dt.datetime.fromtimestamp(up + 2, dt.UTC)).exists()
                             for name in names), timeout=60, what="slots after the broker is back")
    finally:
        stop(beat)
    began = time.monotonic()
    wait_for(lambda: not CronExecution.objects.filter(task_name__in=names, completed=False).exists(), timeout=60,
             what="every stranded slot to be settled by the reconciler")
    print(f"settled {time.time() - up:.1f} s after the broker came back "
          f"({time.monotonic() - began:.1f} s after beat stopped)")
    for name in names:
        rows = list(CronExecution.objects.filter(task_name=name).order_by("slot"))
        slots = [row.slot.timestamp() for row in rows]
        assert {b - a for a, b in itertools.pairwise(slots)} == {2.0}, f"{name}: a slot is missing or doubled"
        assert {row.run_number for row in rows} == {1}
        outage = [row for row in rows if down < row.slot.timestamp() < up]
        assert len(outage) >= 2, f"{name}: {len(outage)} slots during the outage"
        if name == "catch-up-all":
            assert all(row.status == Status.SUCCEEDED for row in rows), [(r.slot, r.status) for r in rows]
            assert any(row.republished >= 1 for row in outage)
        else:
            assert {row.status for row in rows} <= {Status.SUCCEEDED, Status.MISSED}
            missed = [row for row in rows if row.status == Status.MISSED]
            assert missed and all(row.error_code == "NOT_DELIVERED" for row in missed)
            # (a message sent just before the kill is lost with the broker's memory too)
            assert all(down - 4 < row.slot.timestamp() < up + 2 for row in missed)
