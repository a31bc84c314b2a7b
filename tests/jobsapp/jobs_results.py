"""Test jobs for results (imported by tests/jobsapp/tasks.py): values and error texts that
PostgreSQL refuses as they are, a soft time limit that lands during the outcome write, and
revoked runs (tests/faults/test_results.py, tests/faults/test_revoke.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from cron_celery import LockLost, Run, cron_task
from cron_celery.notifiers.base import Channel, Message

#: A file name that is not UTF-8, as the OS hands it to Python (a lone surrogate).
ODD_NAME = os.fsdecode(b"/data/report-\xff.csv")


def _stamp(run: Run, label: str) -> None:
    path = os.environ.get("CRON_TEST_MARKER")
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(f"{label} attempt={run.attempt} pid={os.getpid()}\n")


class Quiet(Channel):
    """A channel that hears every outcome and sends nothing: its job's outcome is written in
    a transaction with its alert rows (the path a job with channels takes)."""

    def send(self, message: Message, timeout: float) -> None:
        return None


QUIET = "tests.jobsapp.jobs_results.Quiet"


@cron_task(name="results-nan", code="R001", max_retries=1, retry_backoff=1, retry_jitter=False)
def results_nan(run: Run) -> dict[str, object]:
    """Returns NaN, which JSON allows and PostgreSQL's jsonb does not."""
    _stamp(run, "results-nan")
    return {"ratio": float("nan"), "rows": 3}


@cron_task(name="results-infinity", code="R002", max_retries=1, retry_backoff=1, retry_jitter=False)
def results_infinity(run: Run) -> dict[str, object]:
    """Returns infinities nested in a list."""
    _stamp(run, "results-infinity")
    return {"bounds": [0.5, float("inf"), [float("-inf")]], ODD_NAME: "key and value: " + ODD_NAME}


@cron_task(name="results-odd-error", code="R003", max_retries=1, retry_backoff=1, retry_jitter=False,
           retry_on=(ConnectionError,))
def results_odd_error(run: Run) -> None:
    """Fails (not retried) with a non-UTF-8 file name in the error text."""
    _stamp(run, "results-odd-error")
    raise FileNotFoundError(f"cannot open {ODD_NAME}")


@cron_task(name="results-odd-retry", code="R004", max_retries=1, retry_backoff=1, retry_jitter=False,
           retry_on=(ConnectionError,))
def results_odd_retry(run: Run) -> str:
    """Fails its first attempt (retried) with a non-UTF-8 name in the error; then succeeds."""
    _stamp(run, "results-odd-retry")
    if run.attempt == 1:
        raise ConnectionError(f"share {ODD_NAME} went away")
    return f"copied {ODD_NAME} on attempt {run.attempt}"


@cron_task(name="results-refused", code="R005", max_retries=1, retry_backoff=1, retry_jitter=False)
def results_refused(run: Run) -> dict[str, object]:
    """Returns a result that a database trigger of the test refuses (as PostgreSQL refuses data)."""
    _stamp(run, "results-refused")
    return {"refuse_me": True, "rows": 3}


def _wait_for_file(name: str, limit: float = 30.0) -> bool:
    path = Path(os.environ.get("CRON_TEST_MARKER", "/nonexistent")).with_name(name)
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(0.02)
    return False


@cron_task(name="results-soft-write", code="R010", pattern="always", soft_time_limit=3, time_limit=30,
           max_retries=1, retry_backoff=1, retry_jitter=False, notify={"on_success": [QUIET]})
def results_soft_write(run: Run) -> str:
    """Ends before its soft limit, once the test holds the job's row so that the outcome write
    waits past the limit."""
    _stamp(run, "soft-write-started")
    _wait_for_file("row-locked")
    _stamp(run, "soft-write-body-done")
    return "finished before the soft limit"


@cron_task(name="results-soft-retry", code="R011", pattern="always", soft_time_limit=3, time_limit=30,
           max_retries=1, retry_backoff=1, retry_jitter=False, retry_on=(ConnectionError,))
def results_soft_retry(run: Run) -> str:
    """Like R010 for the retry write: attempt 1 fails (retried) once the test holds the row."""
    _stamp(run, "soft-retry-started")
    if run.attempt == 1:
        _wait_for_file("row-locked")
        _stamp(run, "soft-retry-body-done")
        raise ConnectionError("attempt 1 fails before the soft limit")
    return f"attempt {run.attempt} done"


@cron_task(name="results-runaway", code="R020", max_retries=2, retry_backoff=1, retry_jitter=False)
def results_runaway(run: Run) -> str:
    """Runs far too long (until somebody revokes it)."""
    _stamp(run, "runaway")
    time.sleep(120)
    return "ran to the end"


@cron_task(name="results-lock-lost", code="R030", pattern="always")
def results_lock_lost(run: Run) -> None:
    """Lets a LockLost escape, as a job whose own lock was lost mid-work does."""
    _stamp(run, "lock-lost")
    raise LockLost(name="nightly-export")
