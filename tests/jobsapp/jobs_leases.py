"""Test jobs for leases (imported by tests/jobsapp/tasks.py)."""

from __future__ import annotations

import os
import time

from cron_celery import Run, cron_task
from cron_celery.run import leases


def _note(run: Run, label: str) -> None:
    """A line ``label execution pid`` in CRON_TEST_MARKER."""
    path = os.environ.get("CRON_TEST_MARKER")
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(f"{label} {run.execution_id} {os.getpid()}\n")


@cron_task(name="holds-lease-registry", code="L001", pattern="always")
def holds_lease_registry(run: Run) -> str:
    """Holds the lease registry's lock until its worker is told to shut down, so that the shutdown
    signal lands while the lock is held; then waits for ``run.cancelled`` and stops at ``run.check()``."""
    _note(run, "holding")
    deadline = time.monotonic() + 120  # only a guard: the shutdown comes within seconds
    with leases._lock:
        while not run.shutdown_requested() and time.monotonic() < deadline:
            time.sleep(0.01)
    _note(run, f"cancelled={run.cancelled.wait(30)}")
    run.check()
    return "ran to the end"
