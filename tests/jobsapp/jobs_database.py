"""Test jobs for the database faults (imported by tests/jobsapp/tasks.py): a lost connection, a
restarted server, clocks off the database's. None has a schedule in code: each test gives its
job's row one in the database, so no beat of another test dispatches them."""

from __future__ import annotations

import os
import time
from pathlib import Path

from cron_celery import Run, cron_task


def note(run: Run, label: str) -> None:
    """A line ``label key fence pid`` in CRON_TEST_MARKER: proof that (part of) a body ran."""
    path = os.environ.get("CRON_TEST_MARKER")
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(f"{label} {run.key} {run.fence} {os.getpid()}\n")


@cron_task(name="db-clock-tick", code="DB01", overlap="allow", catch_up="all")
def db_clock_tick(run: Run) -> str:
    """Does nothing but say it ran: the clock tests look at when its slots were dispatched."""
    note(run, "db-clock-tick")
    return "ran"


@cron_task(name="db-gated", code="DB02", max_retries=1, retry_backoff=False)
def db_gated(run: Run) -> str:
    """Says it started, then waits until the file CRON_TEST_GATE exists (the test cuts the
    worker's database connection meanwhile), then says it ended."""
    note(run, "db-gated-start")
    gate = Path(os.environ.get("CRON_TEST_GATE", "/nonexistent"))
    deadline = time.monotonic() + 120  # only a guard: the test opens the gate within seconds
    while not gate.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    note(run, "db-gated-end")
    return "passed the gate"


@cron_task(name="db-steady", code="DB03", overlap="allow", catch_up="all", max_retries=1, retry_backoff=False)
def db_steady(run: Run) -> str:
    """Runs for CRON_TEST_SLEEP seconds, so that some runs are in flight when the database goes."""
    note(run, "db-steady-start")
    time.sleep(float(os.environ.get("CRON_TEST_SLEEP", "0")))
    note(run, "db-steady-end")
    return "steady"


@cron_task(name="db-clock-retry", code="DB04", pattern="always", max_retries=1, retry_backoff=5, retry_jitter=False,
           retry_on=(ConnectionError,))
def db_clock_retry(run: Run) -> str:
    """Its first attempt waits for the file CRON_TEST_GATE (the test begins the worker's warm
    shutdown meanwhile), then fails with a retryable error: the retry is due five seconds later on
    the database's clock (tests/faults/test_clock_messages.py). The second attempt succeeds."""
    note(run, f"db-clock-retry-{run.attempt}")
    if run.attempt == 1:
        gate = Path(os.environ.get("CRON_TEST_GATE", "/nonexistent"))
        deadline = time.monotonic() + 60  # only a guard: the test opens the gate within seconds
        while not gate.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        raise ConnectionError("the first attempt fails")
    return "ran on its retry"
