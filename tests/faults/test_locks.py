"""Breaking the world around the job lock: Redis masters stopped or flushed, a lock holder
paused past its TTL and lease, a long run renewing many times. Real redis-server and
celery worker processes; the assertions are on the execution rows."""

from __future__ import annotations

import datetime as dt
import itertools
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.test import override_settings

from cron_celery import models, slots
from cron_celery.decisions import dispatch
from cron_celery.decisions import jobs as job_rows
from cron_celery.models import CronExecution, SkipReason, Status, Trigger
from cron_celery.run import locks, runs, tasks
from tests.celery_app import app
from tests.conftest import marked, wait_for
from tests.jobsapp import tasks as jobs
from tests.redis_servers import RedisServer
from tests.workers import Worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

BASE = dt.datetime(2026, 11, 29, 0, 0, tzinfo=dt.UTC)
JOB = "exclusive"


@pytest.fixture
def masters(tmp_path: Path) -> Iterator[list[RedisServer]]:
    servers = [RedisServer(tmp_path).start() for _ in range(3)]
    yield servers
    for server in servers:
        server.stop()


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.stop()


def spawn(workers: list[Worker], tmp_path: Path, urls: list[str], **env: str) -> Worker:
    defaults = {"CRON_TEST_LOCK_MASTERS": ",".join(urls), "CRON_TEST_LOCK_TTL": "5",
                "CRON_TEST_LEASE_SECONDS": "15"}
    worker = Worker(tmp_path, {**defaults, **env})
    workers.append(worker)
    return worker.start()


def slot(i: int) -> dt.datetime:
    return BASE + dt.timedelta(minutes=i)


def send(i: int) -> None:
    jobs.exclusive.apply_async(kwargs={"slot": slots.iso(slot(i))})


def done() -> int:
    return CronExecution.objects.filter(task_name=JOB, completed=True).count()


def assert_never_two_running(rows: list[CronExecution]) -> None:
    ran = sorted((r for r in rows if r.status == Status.SUCCEEDED), key=lambda r: r.started or BASE)
    for before, after in itertools.pairwise(ran):
        assert before.ended <= after.started, (
            f"two runs overlapped: #{before.id} {before.started}..{before.ended} and "
            f"#{after.id} {after.started}..{after.ended}")


def test_one_master_down_locks_stay_exclusive_across_two_workers(masters, workers, tmp_path, marker):
    masters[2].stop()
    urls = [m.url for m in masters]
    for _ in range(2):
        spawn(workers, tmp_path, urls, CRON_TEST_SLEEP="0.15")
    for wave in range(25):  # two slots at a time, so that the two workers overlap
        send(2 * wave)
        send(2 * wave + 1)
        wait_for(lambda: done() == 2 * wave + 2, what=f"wave {wave}")  # noqa: B023
        # The lock is released just after the outcome is written: let it go before the next
        # wave, so that each wave starts with a free lock however slow the machine is.
        wait_for(lambda: not any(m.client().keys("redlock:cron_celery:*:job:*") for m in masters[:2]),
                 timeout=10, what="the job lock to be released")
    rows = list(CronExecution.objects.filter(task_name=JOB))
    statuses = [r.status for r in rows]
    assert len(rows) == 50 and set(statuses) <= {Status.SUCCEEDED, Status.SKIPPED}
    # Two workers racing for a lock with one of three masters down can split the two live
    # masters between them: neither gets a quorum and both skip (LOCK_UNAVAILABLE). About
    # half the waves run a slot; the point is that runs happened and never overlapped.
    assert statuses.count(Status.SUCCEEDED) >= 5
    assert {r.skip_reason for r in rows if r.status == Status.SKIPPED} <= {
        SkipReason.LOCK_UNAVAILABLE, SkipReason.OVERLAP}
    assert_never_two_running(rows)
    assert len(marked(marker)) == statuses.count(Status.SUCCEEDED)
    assert len({r.worker + str(r.pid) for r in rows if r.status == Status.SUCCEEDED}) >= 1


def test_no_quorum_runs_go_on_exactly_once_through_the_database(masters, workers, tmp_path, marker):
    masters[1].stop()
    masters[2].stop()
    urls = [m.url for m in masters]
    for _ in range(2):
        spawn(workers, tmp_path, urls, CRON_TEST_SLEEP="0.3")
    for i in range(6):
        # The same slot twice at once, as two beats or a redelivery would send it.
        execution_id, _ = dispatch.enqueue(job=jobs.exclusive.job, job_id=job_rows.job_id(jobs.exclusive.job),
                                         slot=slot(i), execution_date=slot(i).date(), trigger=Trigger.ENQUEUE)
        headers = {tasks.HEADER_SLOT: slots.iso(slot(i)), tasks.HEADER_EXECUTION: execution_id}
        for _ in range(2):
            app.send_task(jobs.exclusive.name, headers=headers)
        wait_for(lambda: CronExecution.objects.filter(id=execution_id, completed=True).exists(),  # noqa: B023
                 what=f"slot {i}")
    time.sleep(1)  # let the second copies finish being handled
    rows = list(CronExecution.objects.filter(task_name=JOB))
    assert len(rows) == 6 and all(r.status == Status.SUCCEEDED for r in rows)
    assert len(marked(marker)) == 6
    assert_never_two_running(rows)
    logs = "".join(worker.output() for worker in workers)
    assert "lock degraded" in logs


def test_a_paused_lock_holder_is_fenced_and_the_takeover_wins(masters, workers, tmp_path, marker):
    urls = [masters[0].url]
    timing = {"CRON_TEST_LOCK_TTL": "1.5", "CRON_TEST_LEASE_SECONDS": "3"}
    first = spawn(workers, tmp_path, urls, CRON_TEST_SLEEP="6", **timing)
    job = jobs.exclusive.job
    execution_id, _ = dispatch.enqueue(job=job, job_id=job_rows.job_id(job), slot=slot(0),
                                     execution_date=slot(0).date(), trigger=Trigger.ENQUEUE)
    headers = {tasks.HEADER_SLOT: slots.iso(slot(0)), tasks.HEADER_EXECUTION: execution_id}
    app.send_task(jobs.exclusive.name, headers=headers)
    wait_for(lambda: CronExecution.objects.filter(id=execution_id, status=Status.RUNNING).exists(),
             what="the first worker to claim")
    first_fence = CronExecution.objects.get(id=execution_id).fence
    first.signal(signal.SIGSTOP)
    time.sleep(4.5)  # past the lock TTL (1.5 s) and the database lease (3 s)
    spawn(workers, tmp_path, urls, CRON_TEST_SLEEP="0.2", **timing)
    app.send_task(jobs.exclusive.name, headers=headers)  # the message comes round again
    wait_for(lambda: CronExecution.objects.filter(id=execution_id, status=Status.SUCCEEDED).exists(),
             what="the second worker to take over and finish")
    taken = CronExecution.objects.get(id=execution_id)
    first.signal(signal.SIGCONT)
    wait_for(lambda: "was fenced" in first.output(), timeout=30, what="the first worker to notice")
    time.sleep(1)
    row = CronExecution.objects.get(id=execution_id)
    assert row.status == Status.SUCCEEDED and row.fence > first_fence
    assert (row.fence, row.message, row.ended) == (taken.fence, taken.message, taken.ended)
    assert row.retry_count == 1
    assert CronExecution.objects.filter(task_name=JOB).count() == 1
    assert f"pid={workers[1].proc.pid}" in row.message


def test_flushing_the_lock_redis_does_not_let_a_second_run_start(masters, workers, tmp_path, marker):
    lock_redis = masters[0]
    spawn(workers, tmp_path, [lock_redis.url], CRON_TEST_SLEEP="6")
    send(0)
    wait_for(lambda: CronExecution.objects.filter(task_name=JOB, status=Status.RUNNING).exists(),
             what="the first run to start")
    # The second worker is up before the lock is lost, so slot 1 reaches it while slot 0 runs
    # (the first worker, solo and busy, reserves nothing more).
    spawn(workers, tmp_path, [lock_redis.url], CRON_TEST_SLEEP="1")
    lock_redis.client().flushall()
    send(1)
    wait_for(lambda: done() == 2, what="both slots to be handled")
    first = CronExecution.objects.get(task_name=JOB, slot=slot(0))
    second = CronExecution.objects.get(task_name=JOB, slot=slot(1))
    assert first.status == Status.SUCCEEDED
    assert second.created_at < first.ended, "slot 1 was handled after slot 0 ended: nothing was tested"
    assert (second.status, second.skip_reason) == (Status.SKIPPED, SkipReason.OVERLAP)
    assert len(marked(marker)) == 1


def test_a_long_run_keeps_its_lock_through_many_renewals(masters):
    urls = [masters[0].url]
    job = jobs.exclusive.job
    seen: dict[str, object] = {"busy": 0, "checks": 0}

    def body(run):
        deadline = time.monotonic() + 8  # about 16 lock TTLs and 8 leases
        while time.monotonic() < deadline:
            time.sleep(0.5)
            probe = locks.JobLock(job.code, ttl=0.5)
            seen["checks"] += 1
            if probe.acquire() == locks.BUSY:
                seen["busy"] += 1
            else:
                probe.release()
        seen["cancelled"] = run.cancelled.is_set()
        return "long run"

    with override_settings(CRON_CELERY={"LEASE_SECONDS": 1, "LOCK": {"MASTERS": urls, "TTL": 0.5}}):
        outcome = runs.execute(job, slot(0), body, trigger=Trigger.MANUAL)
        other = runs.execute(job, slot(1), lambda run: "after", trigger=Trigger.MANUAL)
    assert outcome.status == Status.SUCCEEDED
    assert seen["cancelled"] is False and seen["busy"] == seen["checks"] >= 10
    assert other.status == Status.SUCCEEDED  # released at the end
    assert outcome.execution_id is not None
    row = models.CronExecution.objects.get(id=outcome.execution_id)
    assert row.ended - row.started >= dt.timedelta(seconds=8)
