"""The reconciler when the broker cannot answer where a message is (issue 35, items 3 and 4).

* A broker that cannot be asked (Redis stopped) is not a broker that lost the message: a pass
  leaves the stranded executions alone, says so in its log and in ``/cron/metrics/``, and once the
  broker is back (its queues kept on disk) every slot runs once.
* A broker that cannot tell (a RabbitMQ queue with a backlog nobody consumes) gets each stranded
  execution sent again a bounded number of times, with growing gaps, counted in the metrics.

Real processes: a ``redis-server`` of the test's own with persistence, the machine's RabbitMQ,
real ``celery worker`` processes and ``manage.py reconcile_cron`` passes, real PostgreSQL.
"""

from __future__ import annotations

import datetime as dt
import itertools
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.db.models.functions import Now
from prometheus_client.parser import text_string_to_metric_families

from cron_celery.decisions import dispatch, waiting
from cron_celery.decisions import jobs as job_rows
from cron_celery.models import CronExecution, Status, Trigger
from cron_celery.run import tasks
from cron_celery.web import metrics
from tests.celery_app import app
from tests.conftest import manage, marked, subprocess_env, wait_for
from tests.jobsapp import jobs_buffer as jobs
from tests.redis_servers import RedisServer
from tests.workers import Worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

START = dt.datetime(2026, 12, 1, 4, 0, tzinfo=dt.UTC)


@pytest.fixture
def workers(tmp_path: Path, marker: Path) -> Iterator[Any]:
    started: list[Worker] = []

    def start(broker_url: str, queues: list[str] | None = None, **env: str) -> Worker:
        values = {"CRON_TEST_MARKER": str(marker), "CRON_TEST_BROKER_URL": broker_url, "CRON_TEST_LOG_LEVEL": "INFO",
                  **env}
        worker = Worker(tmp_path, values, pool="prefork", concurrency=1, broker_url=broker_url,
                        queues=queues).start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


def queued_slots(task: Any, broker_url: str, count: int) -> list[int]:
    """``count`` beat slots of the job recorded PENDING and their messages sent to ``broker_url``
    (under each row's task id, as beat sends them), with no worker to take them: a backlog."""
    job = task.job
    slots = [START + dt.timedelta(minutes=minute) for minute in range(count)]
    dispatched = dispatch.dispatch(job=job, job_id=job_rows.job_id(job), expected_next_run_at=None,
                                   next_run_at=slots[-1] + dt.timedelta(minutes=1), run=slots, missed=[])
    with app.connection_for_write(broker_url) as conn:
        for execution_id, slot in dispatched.to_publish:
            trigger = Trigger.CATCH_UP if execution_id in dispatched.catch_up_ids else Trigger.BEAT
            row = CronExecution.objects.get(id=execution_id)
            app.send_task(job.task_name, task_id=row.celery_task_id, connection=conn,
                          headers=tasks.headers(execution_id, slot, trigger))
    return sorted(execution_id for execution_id, _ in dispatched.to_publish)


def scraped() -> dict[str, list[Any]]:
    """The samples ``/cron/metrics/`` serves now, by name."""
    text, _ = metrics.render()
    found: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample)
    return found


def test_a_pass_while_the_broker_is_down_leaves_queued_slots_alone_and_they_run_once_it_is_back(
        tmp_path, marker, workers):
    """Five slots of a catch-up ``none`` job wait in a backlog on a Redis broker that keeps its data on
    disk. The broker stops; a reconciler pass (grace 1 s, long past) cannot ask it where the messages
    are: it records nothing (no MISSED, no LOST, no send counted), logs that it could not ask, and the
    metrics say when. The broker starts again with its queue, a real worker takes the backlog, and
    every slot runs exactly once."""
    broker = RedisServer(tmp_path, persistent=True).start()
    try:
        ids = queued_slots(jobs.backlog_none, broker.url, 5)
        assert broker.client().llen(settings.CELERY_TASK_DEFAULT_QUEUE) == 5
        env = subprocess_env(CRON_TEST_BROKER_URL=broker.url, CRON_TEST_PENDING_GRACE="1",
                             CRON_TEST_LOG_LEVEL="INFO")
        wait_for(lambda: manage("reconcile_cron", env=env).returncode == 0 and all(
            CronExecution.objects.get(id=i).lease_until is not None for i in ids), timeout=60,
            what="a pass that finds the queued messages (and restarts their grace)")
        broker.stop()
        # The grace that pass restarted runs out (by the database's clock) before the next pass.
        wait_for(lambda: not CronExecution.objects.filter(
            id__in=ids, lease_until__gt=Now() - dt.timedelta(seconds=1.5)).exists(), timeout=30,
            what="the restarted grace to run out")
        done = manage("reconcile_cron", env=env, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        found = list(CronExecution.objects.filter(id__in=ids).order_by("slot"))
        assert [(row.status, row.error_code, row.republished) for row in found] == [
            (Status.PENDING, "", 0)] * 5, [(row.slot, row.status, row.error_code, row.message) for row in found]
        assert "could not ask the broker" in done.stderr, done.stderr
        assert "unanswered 5" in done.stdout, done.stdout
        [when] = scraped()["cron_reconciler_broker_unanswered_timestamp_seconds"]
        assert when.value > 0

        broker.start()  # the same port and directory: the queue is read back from the append-only file
        assert broker.client().llen(settings.CELERY_TASK_DEFAULT_QUEUE) == 5
        workers(broker.url, CRON_TEST_RECONCILE_INTERVAL="1", CRON_TEST_PENDING_GRACE="1", CRON_TEST_SLEEP="0.5")
        wait_for(lambda: all(row.completed for row in CronExecution.objects.filter(id__in=ids)), timeout=90,
                 what="the five slots to run")
        found = list(CronExecution.objects.filter(id__in=ids).order_by("slot"))
        assert [(row.status, row.run_number) for row in found] == [(Status.SUCCEEDED, 1)] * 5, [
            (row.slot, row.status, row.error_code, row.message) for row in found]
        ran = sorted(line.split()[1] for line in marked(marker) if line.startswith("backlog-none"))
        assert ran == [row.slot.isoformat() for row in found], "each slot's body runs exactly once"
    finally:
        broker.stop()


@pytest.fixture
def rabbitmq_url() -> Iterator[str]:
    url = os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//")
    yield url
    # The session's queues on the shared RabbitMQ go with the test.
    from kombu import Connection, Queue

    with Connection(url) as conn:
        for name in (settings.CELERY_TASK_DEFAULT_QUEUE, f"{settings.CELERY_TASK_DEFAULT_QUEUE}-idle"):
            Queue(name, channel=conn.channel()).delete()


def ready_messages(url: str) -> int:
    from kombu import Connection

    with Connection(url) as conn:
        _, count, _ = conn.channel().queue_declare(queue=settings.CELERY_TASK_DEFAULT_QUEUE, passive=True)
        return int(count)


def test_sends_the_broker_cannot_tell_about_are_bounded_with_growing_gaps_and_counted(workers, rabbitmq_url):
    """Two stranded executions on a RabbitMQ queue that nobody consumes (a backlog: ``inflight`` answers
    "cannot tell"): a beat slot, and a run of a ``max_concurrency`` job that waited its turn. A real
    worker that consumes another queue runs the reconciler (grace 1 s, REPUBLISH_LIMIT 3): each is
    sent again three times, each gap twice the one before, then left waiting, never LOST or MISSED;
    the queue holds exactly the six copies more, and ``cron_reconciler_resent`` counts three each."""
    grace = 1.0
    [slot_id] = queued_slots(jobs.backlog_none, rabbitmq_url, 1)
    [waiter_id] = queued_slots(jobs.three_at_once, rabbitmq_url, 1)
    with connection.cursor() as cursor:  # what the claim records when the job is full
        waiting.mark(cursor, waiter_id, None, limit=3)
    ids = (slot_id, waiter_id)
    assert ready_messages(rabbitmq_url) == 2
    worker = workers(rabbitmq_url, queues=[f"{settings.CELERY_TASK_DEFAULT_QUEUE}-idle"],
            CRON_TEST_RECONCILE_INTERVAL="0.5", CRON_TEST_PENDING_GRACE=str(grace))
    seen: dict[int, list[tuple[int, float, dt.datetime | None]]] = {i: [] for i in ids}

    def watch() -> bool:
        """Note each change of (times sent again, next look); true once both are held at the cap."""
        for row in CronExecution.objects.filter(id__in=ids):
            if not seen[row.id] or seen[row.id][-1][2] != row.lease_until:
                seen[row.id].append((row.republished, time.monotonic(), row.lease_until))
        return all(sum(1 for sent, *_ in seen[i] if sent == 3) >= 2 for i in ids)

    try:
        wait_for(watch, timeout=60, what="three sends of each, then a pass that leaves them waiting")
    except AssertionError as error:
        raise AssertionError(f"{error}: (times sent again, when seen) of each: "
                             f"{ {i: [c[:2] for c in seen[i]] for i in ids} }; "
                             f"{ready_messages(rabbitmq_url)} messages in the queue") from None
    for execution_id in ids:
        changes = seen[execution_id]
        sends = [(sent, at) for (before, *_), (sent, at, _) in itertools.pairwise(changes) if sent == before + 1]
        assert [sent for sent, _ in sends] == [1, 2, 3], changes
        gaps = [b - a for (_, a), (_, b) in itertools.pairwise(sends)]
        # After the k-th send the next comes no sooner than grace * 2**k (less a poll's slack).
        assert gaps[0] >= 2 * grace - 0.3 and gaps[1] >= 4 * grace - 0.3, gaps
        row = CronExecution.objects.get(id=execution_id)
        assert (row.status, row.error_code, row.republished) == (Status.PENDING, "", 3), row.message
    assert ready_messages(rabbitmq_url) == 2 + 2 * 3
    resent = {sample.labels["cron_job"]: sample.value for sample in scraped()["cron_reconciler_resent"]
              if sample.value}
    assert resent == {"backlog-none": 3, "three-at-once": 3}
    assert "sent 3 times already while the broker cannot tell" in worker.output()
