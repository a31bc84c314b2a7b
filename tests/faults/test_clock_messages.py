"""Messages are due on the database's clock, not on the sender's (issue 35, item 15): a retry sent
by a real worker whose clock runs two hours ahead (Debian's ``faketime``), and a ``delay()`` without
a slot from a process two hours ahead. The messages are read in a Redis broker of the test's own.

Before, the retry's countdown became an ETA on the sending worker's clock (every worker with a true
clock held the retry two hours), and the ``delay()`` named a slot two hours ahead.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cron_celery import slots
from cron_celery.decisions import dispatch
from cron_celery.decisions import jobs as job_rows
from cron_celery.models import CronExecution, Status, Trigger
from cron_celery.run import tasks
from tests.celery_app import app
from tests.conftest import ROOT, debian_tool, marked, subprocess_env, wait_for
from tests.faults.test_clock import FAKETIME
from tests.jobsapp.jobs_database import db_clock_retry
from tests.redis_servers import RedisServer
from tests.workers import Worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

QUEUE = str(os.environ["CRON_CELERY_TEST_QUEUE"])
SLOT = dt.datetime(2031, 6, 1, 3, 0, tzinfo=dt.UTC)


@pytest.fixture(scope="session")
def faketime() -> str:
    return debian_tool(FAKETIME, "faketime", "the message clock tests")


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path).start()
    yield server
    server.stop()


def database_clock() -> dt.datetime:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        row = cursor.fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def queued(broker: RedisServer) -> list[dict[str, Any]]:
    """The messages waiting in the job queue of the test's broker (kombu's JSON envelopes)."""
    return [json.loads(raw) for raw in broker.client().lrange(QUEUE, 0, -1)]


def worker(tmp_path: Path, broker: RedisServer, env: dict[str, str], clock: list[str]) -> Worker:
    """A real solo worker on the test's broker; ``clock``: the command that moves its clock, if any."""
    started = Worker(tmp_path, {"REDIS_URL": broker.url, **env}, pool="solo", broker_url=broker.url)
    started.args = [*clock, *started.args]
    return started.start()


def test_a_retry_sent_by_a_worker_two_hours_ahead_is_due_when_the_database_says(faketime, tmp_path, marker, broker):
    gate = tmp_path / "gate"
    env = {"CRON_TEST_MARKER": str(marker), "CRON_TEST_LOG_LEVEL": "INFO", "CRON_TEST_GATE": str(gate)}
    skewed = worker(tmp_path, broker, env, [faketime, "-f", "+2h"])
    honest: Worker | None = None
    try:
        job = db_clock_retry.job
        execution_id, _ = dispatch.enqueue(job=job, job_id=job_rows.job_id(job), slot=SLOT,
                                           execution_date=SLOT.date(), trigger=Trigger.ENQUEUE)
        with app.connection_for_write(broker.url) as conn:
            app.send_task(job.task_name, headers=tasks.headers(execution_id, SLOT, Trigger.ENQUEUE), connection=conn)
        wait_for(lambda: bool(marked(marker)), timeout=60, what="the skewed worker's first attempt to start")
        # Its warm shutdown stops it taking messages; the attempt then fails and sends its retry, which
        # stays in the queue for the next worker.
        skewed.signal(signal.SIGTERM)
        gate.touch()
        wait_for(lambda: CronExecution.objects.get(id=execution_id).status == Status.RETRYING, timeout=60,
                 what="the skewed worker's first attempt to fail and be retried")
        wait_for(lambda: len(queued(broker)) == 1 and skewed.proc is not None and skewed.proc.poll() is not None,
                 timeout=60, what="the retry's message in the queue, and the skewed worker gone")
        (message,) = queued(broker)
        due = CronExecution.objects.get(id=execution_id).lease_until  # the database's due time
        assert due is not None
        eta = dt.datetime.fromisoformat(message["headers"]["eta"])
        assert abs((eta - due).total_seconds()) < 60, f"the retry's ETA {eta} is not its due time {due}"
        # A worker whose clock is right runs it when it is due (not two hours later).
        honest = worker(tmp_path, broker, env, [])
        wait_for(lambda: CronExecution.objects.get(id=execution_id).completed, timeout=60,
                 what="the retry to run on the worker with a true clock")
    finally:
        skewed.stop()
        if honest is not None:
            honest.stop()
    row = CronExecution.objects.get(id=execution_id)
    assert (row.status, row.retry_count) == (Status.SUCCEEDED, 1)
    assert [line.split()[0] for line in marked(marker)] == ["db-clock-retry-1", "db-clock-retry-2"]
    second_started = dt.datetime.fromisoformat(row.attempts[-1]["started"])
    assert second_started >= due - dt.timedelta(seconds=1)  # not before it was due


def test_a_delay_without_a_slot_from_a_process_two_hours_ahead_names_the_database_minute(faketime, broker):
    before = database_clock()
    script = ("import django; django.setup(); import tests.celery_app; "
              "from tests.jobsapp.jobs_database import db_clock_tick; "
              "db_clock_tick.delay(); db_clock_tick.apply_async(countdown=120)")
    result = subprocess.run([faketime, "-f", "+2h", sys.executable, "-c", script], cwd=ROOT,
                            env=subprocess_env(REDIS_URL=broker.url), capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    after = database_clock()
    now_sent, later_sent = sorted(queued(broker), key=lambda message: message["headers"].get("eta") or "")
    slot = dt.datetime.fromisoformat(now_sent["headers"][tasks.HEADER_SLOT])
    assert slots.floor_minute(before) <= slot <= slots.floor_minute(after), (before, slot, after)
    # A countdown is an ETA on the database's clock too, and names the minute it is due.
    eta = dt.datetime.fromisoformat(later_sent["headers"]["eta"])
    assert before + dt.timedelta(seconds=119) <= eta <= after + dt.timedelta(seconds=121), (before, eta, after)
    assert dt.datetime.fromisoformat(later_sent["headers"][tasks.HEADER_SLOT]) == slots.floor_minute(eta)
