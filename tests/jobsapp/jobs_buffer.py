"""Test jobs for buffered slots and the reconciler's backlog (imported by tests/jobsapp/tasks.py)."""

from __future__ import annotations

import datetime as dt
import os
import time

from cron_celery import Run, cron_task
from cron_celery.schedules import every


def _note(run: Run, label: str) -> None:
    """A line ``label slot attempt pid start end`` in CRON_TEST_MARKER, written when the body ends."""
    path = os.environ.get("CRON_TEST_MARKER")
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(f"{label} {run.slot.isoformat()} {run.attempt} {os.getpid()}\n")


def _gate() -> None:
    """With CRON_TEST_GATE set, wait until that file exists (the test opens the gate); two minutes at most."""
    gate = os.environ.get("CRON_TEST_GATE")
    deadline = time.monotonic() + 120
    while gate and not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.05)


@cron_task(name="hourly-exclusive", code="W001", schedule=every(hours=1), overlap="skip", catch_up="all")
def hourly_exclusive(run: Run) -> str:
    """An hourly overlap-``skip`` job whose body takes CRON_TEST_SLEEP seconds (default 0.2), after
    waiting for the gate file CRON_TEST_GATE when it is set."""
    _gate()
    time.sleep(float(os.environ.get("CRON_TEST_SLEEP", "0.2")))
    _note(run, "hourly-exclusive")
    return f"slot {run.slot:%H:%M}"


@cron_task(name="hourly-exclusive-limited", code="W011", schedule=every(hours=1), overlap="skip", catch_up="all",
           max_retries=0, time_limit=8)
def hourly_exclusive_limited(run: Run) -> str:
    """An hourly overlap-``skip`` job with a hard time limit of 8 s: slot 01:00 sleeps 30 s (the limit
    kills it), any other slot ends at once."""
    if run.slot.hour == 1:
        time.sleep(30)
    _note(run, "hourly-exclusive-limited")
    return f"slot {run.slot:%H:%M}"


@cron_task(name="hourly-window", code="W012", schedule=every(hours=1), overlap="allow", catch_up="all",
           catch_up_window=dt.timedelta(hours=6))
def hourly_window(run: Run) -> str:
    """An hourly catch-up ``all`` job with a six-hour catch-up window; its body ends at once."""
    _note(run, "hourly-window")
    return f"slot {run.slot:%d %H:%M}"


@cron_task(name="retry-meets-next", code="W002", overlap="skip", max_retries=1, retry_backoff=2,
           retry_jitter=False, retry_on=(ConnectionError,))
def retry_meets_next(run: Run) -> str:
    """Slot 01:00 fails its first attempt (retried 2 s later); slot 02:00 runs for CRON_TEST_SLEEP seconds;
    with CRON_TEST_FAIL_ALWAYS every attempt of 01:00 fails."""
    _note(run, "retry-meets-next-start")
    if run.slot.hour == 1 and (run.attempt == 1 or os.environ.get("CRON_TEST_FAIL_ALWAYS")):
        raise ConnectionError(f"partner unreachable (attempt {run.attempt})")
    if run.slot.hour == 2:
        time.sleep(float(os.environ.get("CRON_TEST_SLEEP", "4")))
    _note(run, "retry-meets-next-end")
    return f"slot {run.slot:%H:%M} attempt {run.attempt}"


@cron_task(name="backlog-none", code="W003", pattern="always", overlap="allow", catch_up="none")
def backlog_none(run: Run) -> str:
    """Takes CRON_TEST_SLEEP seconds (default 1): a queue of them is a backlog."""
    time.sleep(float(os.environ.get("CRON_TEST_SLEEP", "1")))
    _note(run, "backlog-none")
    return "ok"


@cron_task(name="backlog-all", code="W004", pattern="always", overlap="allow", catch_up="all")
def backlog_all(run: Run) -> str:
    time.sleep(float(os.environ.get("CRON_TEST_SLEEP", "1")))
    _note(run, "backlog-all")
    return "ok"


@cron_task(name="delayed-now", code="W005", pattern="standard", overlap="allow")
def delayed_now(run: Run) -> str:
    _note(run, "delayed-now")
    return run.slot.isoformat()


def _timed(run: Run, label: str) -> str:
    """Take CRON_TEST_SLEEP seconds (default 1.5); write ``LABEL SLOT START END PID`` (its own clock)
    when it ends."""
    began = time.time()
    time.sleep(float(os.environ.get("CRON_TEST_SLEEP", "1.5")))
    path = os.environ.get("CRON_TEST_MARKER")
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(f"{label} {run.slot.isoformat()} {began:.6f} {time.time():.6f} {os.getpid()}\n")
    return "ok"


@cron_task(name="three-at-once", code="W006", pattern="always", overlap="allow", max_concurrency=3)
def three_at_once(run: Run) -> str:
    """At most three at once (``max_concurrency=3``)."""
    return _timed(run, "three-at-once")


@cron_task(name="warehouse-load", code="W007", pattern="always", overlap="allow", concurrency_group="warehouse")
def warehouse_load(run: Run) -> str:
    """Any number at once on its own, but it shares the ``warehouse`` group's two places."""
    return _timed(run, "warehouse-load")


@cron_task(name="warehouse-vacuum", code="W008", pattern="always", overlap="skip", concurrency_group="warehouse")
def warehouse_vacuum(run: Run) -> str:
    """One at a time (overlap ``skip``), and one of the ``warehouse`` group's two places."""
    return _timed(run, "warehouse-vacuum")


# django-celery-beat's one_off meeting a live run (tests/faults/test_pause_holds.py): a two-second
# overlap-``skip`` job that waits for the gate CRON_TEST_GATE, declared when CRON_TEST_ONE_OFF_WAITS is set.
if os.environ.get("CRON_TEST_ONE_OFF_WAITS") == "1":
    @cron_task(name="once-waits", code="W010", schedule=every(seconds=2), pattern="always", overlap="skip")
    def once_waits(run: Run) -> str:
        _gate()
        _note(run, "once-waits")
        return "ok"
