"""A dead or revoked pool process is identified by the execution it ran and by its worker's boot,
never by hostname and pid alone: two real prefork workers, each in a pid namespace of its own
(``unshare --pid --fork``), on the same host (so the same hostname), concurrency 1 each, so that
their pool processes get the same pid. What happens to one worker's child must never end the
other worker's live run of the same job."""

from __future__ import annotations

import datetime as dt
import os
import signal
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cron_celery.models import CronExecution, Status
from tests.celery_app import app
from tests.conftest import marked, wait_for
from tests.faults import test_retries
from tests.faults.test_retries import attempt_log, enqueue
from tests.faults.test_revoke import control, ended
from tests.jobsapp import jobs_ident
from tests.redis_servers import RedisServer
from tests.workers import Worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
broker = test_retries.broker  # the fixture

SLOT_A = dt.datetime(2026, 11, 30, 2, 0, tzinfo=dt.UTC)
SLOT_B = dt.datetime(2026, 11, 30, 2, 1, tzinfo=dt.UTC)


@pytest.fixture
def namespaced(tmp_path: Path, marker: Path, broker: RedisServer) -> Iterator[Any]:
    """``namespaced(tag)`` starts a prefork worker (concurrency 1) in a pid namespace of its own on the
    test's broker; its jobs note ``tag``. All are stopped after."""
    workers: list[Worker] = []

    def start(tag: str) -> Worker:
        env = {"REDIS_URL": broker.url, "CRON_TEST_MARKER": str(marker), "CRON_TEST_LOG_LEVEL": "INFO",
               "CRON_TEST_WORKER_TAG": tag}
        worker = Worker(tmp_path, env, pool="prefork", concurrency=1, broker_url=broker.url)
        worker.args = ["unshare", "--pid", "--fork", "--mount-proc", *worker.args]
        workers.append(worker)
        return worker.start()

    yield start
    for worker in workers:
        worker.stop()


def notes(marker: Path, word: str, execution_id: int) -> list[str]:
    return [line for line in marked(marker) if line.split()[:2] == [word, str(execution_id)]]


def pool_process(worker: Worker, inner_pid: int) -> int:
    """The host's pid of the worker's pool process whose pid inside its namespace is ``inner_pid``."""
    assert worker.proc is not None
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            session = os.getsid(int(entry.name))
        except (OSError, ProcessLookupError):
            continue
        nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
        if session == worker.proc.pid and len(nspid) == 2 and int(nspid[1]) == inner_pid:
            found.append(int(entry.name))
    assert len(found) == 1, f"pool process {inner_pid} of {worker.name}: {found}"
    return found[0]


def two_runs_on_one_pid(namespaced: Any, marker: Path, send: Any) -> tuple[Worker, Worker, int, int]:
    """Worker A runs one execution of ident-long, then worker B another: both pool processes have
    the same pid (in their own namespaces) on the same host."""
    worker_a = namespaced("A")
    first = send(SLOT_A)
    wait_for(lambda: bool(notes(marker, "started", first)), timeout=60, what="A's run to start")
    worker_b = namespaced("B")
    second = send(SLOT_B)
    wait_for(lambda: bool(notes(marker, "started", second)), timeout=60, what="B's run to start")
    assert [notes(marker, "started", run)[0].split()[2] for run in (first, second)] == ["A", "B"]
    a, b = CronExecution.objects.get(id=first), CronExecution.objects.get(id=second)
    assert a.status == b.status == Status.RUNNING
    assert a.pid == b.pid, f"the pool processes' pids differ ({a.pid}, {b.pid}): no collision to test"
    host = socket.gethostname()
    assert a.worker.startswith(host) and b.worker.startswith(host), (a.worker, b.worker)  # a readable host
    return worker_a, worker_b, first, second


def test_a_killed_pool_process_never_ends_another_workers_run_on_the_same_host_and_pid(namespaced, broker, marker):
    """Issue 35 item 8: SIGKILL worker A's child while worker B's child, with the same pid and
    hostname, runs the same job. A's parent records its own run LOST (the requeued message runs it
    again); B's run goes on, is never told to stop, and its slot runs once."""
    worker_a, _, first, second = two_runs_on_one_pid(namespaced, marker, lambda slot: enqueue(
        jobs_ident.ident_long, broker, slot))
    inner = CronExecution.objects.get(id=first).pid
    assert inner is not None
    os.kill(pool_process(worker_a, inner), signal.SIGKILL)
    wait_for(lambda: CronExecution.objects.get(id=first).retry_count == 1, timeout=30,
             what="A's parent to record its child's death")
    other = CronExecution.objects.get(id=second)
    assert (other.status, other.retry_count, other.error_code) == (Status.RUNNING, 0, ""), \
        f"A's dead child ended B's live run: {other.status} {other.error_code} {other.message!r}"
    wait_for(lambda: len(notes(marker, "started", first)) == 2, timeout=60, what="A's run to start again")
    (marker.parent / "release").touch()
    a, b = ended(first, timeout=60), ended(second, timeout=60)
    assert (b.status, b.retry_count, attempt_log(b)) == (Status.SUCCEEDED, 0, []), (b.status, b.message)
    assert len(notes(marker, "started", second)) == 1 and not notes(marker, "cancelled", second), \
        "B's run was told to stop or ran twice"
    assert a.status == Status.SUCCEEDED and attempt_log(a) == [(Status.LOST, "WORKER_LOST"), (Status.SUCCEEDED, "")]
    assert a.attempts[0]["worker"] != b.worker  # the same host, another boot
    assert CronExecution.objects.filter(task_code="X801").count() == 2  # one execution per slot


def test_a_revoke_ends_the_run_of_the_revoked_task_only_on_the_same_host_and_pid(namespaced, broker, marker):
    """The same pair of runs, sent without the cron headers (``delay()``: each claim inserts its
    execution under the message's task id); worker B's task is revoked with terminate. Only B's run
    ends REVOKED; A's run goes on and succeeds."""
    sent: dict[int, str] = {}

    def send(slot: dt.datetime) -> int:
        task_id = str(uuid.uuid4())
        with app.connection_for_write(broker.url) as conn:
            app.send_task(jobs_ident.ident_long.name, task_id=task_id, kwargs={"slot": slot.isoformat()},
                          connection=conn)
        wait_for(lambda: CronExecution.objects.filter(celery_task_id=task_id).exists(), timeout=60,
                 what="the run's execution")
        execution_id = CronExecution.objects.get(celery_task_id=task_id).id
        sent[execution_id] = task_id
        return execution_id

    _, _, first, second = two_runs_on_one_pid(namespaced, marker, send)
    control(broker, "terminate", "SIGKILL", sent[second])
    b = ended(second, timeout=30)
    assert (b.status, b.error_code) == (Status.REVOKED, "REVOKED"), (b.status, b.message)
    other = CronExecution.objects.get(id=first)
    assert (other.status, other.error_code) == (Status.RUNNING, ""), \
        f"revoking B's task ended A's live run: {other.status} {other.error_code} {other.message!r}"
    (marker.parent / "release").touch()
    a = ended(first, timeout=60)
    assert (a.status, a.retry_count) == (Status.SUCCEEDED, 0), (a.status, a.message)
    assert len(notes(marker, "started", first)) == 1 and not notes(marker, "cancelled", first)
