"""The shutdown signal never deadlocks a process that holds the lease registry's lock.

A signal handler runs in the main thread between two bytecodes, wherever that thread is,
including inside ``with leases._lock``. These tests deliver SIGUSR2 (a prefork child) and
SIGTERM (a solo worker) exactly there, in real processes, and check that the process goes
on, that the run is told to stop (``run.cancelled``) and that the attempt is recorded.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cron_celery.models import CronExecution, Status
from tests.conftest import ROOT, marked, subprocess_env, wait_for
from tests.faults.test_retries import broker, enqueue, settled, started  # noqa: F401  (fixtures)
from tests.jobsapp import jobs_leases

# What a prefork child does: install the SIGUSR2 handler, run a job that is being renewed,
# and be interrupted while it holds the registry's lock.
CHILD = """
import json, threading, time
import django
django.setup()
from cron_celery.run import leases, shutdown
shutdown._child_started()
cancelled = threading.Event()
leases.track(1, 1, 3600, cancelled, {})  # a long lease: nothing is renewed during the test
with leases._lock:
    print("holding", flush=True)
    deadline = time.monotonic() + 120
    while not shutdown.requested.is_set() and time.monotonic() < deadline:
        time.sleep(0.01)  # the handler runs here, in this thread, with the lock held
print(json.dumps({"requested": shutdown.requested.is_set(), "cancelled": cancelled.wait(30)}), flush=True)
"""


def test_sigusr2_while_the_lease_registry_lock_is_held_does_not_deadlock():
    child = subprocess.Popen([sys.executable, "-c", CHILD], cwd=ROOT, env=subprocess_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "holding", child.stderr.read() if child.stderr else ""
        child.send_signal(signal.SIGUSR2)
        try:
            out, err = child.communicate(timeout=30)  # liveness: a deadlocked child never exits
        except subprocess.TimeoutExpired:
            pytest.fail("the child deadlocked in the SIGUSR2 handler (it holds the lease registry's lock)")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1]) == {"requested": True, "cancelled": True}


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("pool", ["prefork", "solo"])
def test_a_warm_shutdown_that_lands_while_the_lease_registry_lock_is_held_stops_the_job(
        pool, started, broker, marker: Path):  # noqa: F811
    """prefork: the parent's SIGUSR2 reaches the child inside the lock; solo: Celery's SIGTERM
    handler runs in the job's own thread inside the lock. Either way the job is told to stop,
    raises ``Interrupted`` at ``run.check()``, the attempt is recorded and the worker exits."""
    worker = started(pool=pool)
    execution_id = enqueue(jobs_leases.holds_lease_registry, broker)
    wait_for(lambda: any(line.startswith("holding ") for line in marked(marker)), what="the job to hold the lock")
    assert worker.proc is not None
    worker.proc.send_signal(signal.SIGTERM)  # to the main process only, as docker stop does
    try:
        worker.proc.wait(timeout=30)  # liveness: a deadlocked job keeps its worker alive
    except subprocess.TimeoutExpired:
        pytest.fail(f"the worker did not stop: its job deadlocked in the shutdown handler\n{worker.output()[-2000:]}")
    row, _ = settled(execution_id, timeout=10)
    assert (row.status, row.error_code) == (Status.FAILED, "INTERRUPTED")
    assert f"cancelled=True {execution_id} {row.pid}" in marked(marker)
    assert CronExecution.objects.filter(task_code="L001").count() == 1
