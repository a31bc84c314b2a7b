"""Test jobs for routing and alert accounting (imported by tests/jobsapp/tasks.py).

Their queues carry the session's queue name, so concurrent test sessions never share them;
``tests/settings.py`` routes ``routed_by_settings`` with ``CELERY_TASK_ROUTES``.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from pathlib import Path

from celery import current_task

from cron_celery import Run, TrackedTask, cron_task
from cron_celery.schedules import every

SESSION_QUEUE = os.environ.get("CRON_CELERY_TEST_QUEUE", "cron-celery-test")
#: The queue the ``queue=`` job (and the ``base=`` class) names.
OWN_QUEUE = f"{SESSION_QUEUE}-q-own"
#: The queue ``CELERY_TASK_ROUTES`` sends ``routed_by_settings`` to (tests/settings.py).
ROUTED_QUEUE = f"{SESSION_QUEUE}-q-routed"
ROUTED_TASK = "tests.jobsapp.jobs_routing.routed_by_settings"
ROUTED_PRIORITY = 3
OWN_PRIORITY = 7
#: Slots of this day misbehave on their first attempt, by minute (see ``_routed_body``).
TRIAL_DAY = dt.date(2026, 11, 30)
FAILS_THEN_RETRIES, KILLED_BY_HARD_LIMIT = 1, 2

# Only the beat of tests/faults/test_routing.py schedules them (other tests' beats must not).
_beat = {"schedule": every(seconds=2), "catch_up": "none"} if os.environ.get("CRON_TEST_ROUTING_BEAT") else {}
_policy = {"pattern": "always", "overlap": "allow", "max_retries": 1, "retry_backoff": 1, "retry_jitter": False,
           "time_limit": 3}


def _note(run: Run, label: str) -> None:
    """A line ``label trigger slot attempt=N queue=Q priority=P`` in CRON_TEST_MARKER: where the
    message that started this attempt was delivered from."""
    info = current_task.request.delivery_info or {}
    path = os.environ.get("CRON_TEST_MARKER")
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(f"{label} {run.trigger} {run.slot.isoformat()} attempt={run.attempt}"
                         f" queue={info.get('routing_key')} priority={info.get('priority')}\n")


def _routed_body(run: Run, label: str) -> str:
    _note(run, label)
    if run.slot.date() == TRIAL_DAY and run.attempt == 1:
        if run.slot.minute == FAILS_THEN_RETRIES:
            raise ConnectionError("first attempt fails: the retry is sent")
        if run.slot.minute == KILLED_BY_HARD_LIMIT:
            time.sleep(30)  # the hard limit (3 s) kills the child: the parent sends the retry
    return f"{label} ran"


@cron_task(name="own-queue", code="Q001", queue=OWN_QUEUE, priority=OWN_PRIORITY, **_policy, **_beat)
def own_queue(run: Run) -> str:
    """Declared with ``queue=`` and ``priority=``."""
    return _routed_body(run, "own-queue")


@cron_task(name="routed-by-settings", code="Q002", task_name=ROUTED_TASK, **_policy, **_beat)
def routed_by_settings(run: Run) -> str:
    """Routed (queue and priority) by ``CELERY_TASK_ROUTES`` only."""
    return _routed_body(run, "routed-by-settings")


class QueuedTrackedTask(TrackedTask):
    """A project's own base class: its class attributes route every job declared on it."""

    queue = OWN_QUEUE
    priority = 5
    greeting = "from the base class"


@cron_task(name="own-base", code="Q003", base=QueuedTrackedTask, pattern="always", overlap="allow")
def own_base(run: Run) -> str:
    """Declared with ``base=`` a ``TrackedTask`` subclass."""
    _note(run, "own-base")
    return str(current_task.greeting)


@cron_task(name="always-lost", code="Q010", pattern="always", max_retries=1, retry_backoff=1, retry_jitter=False)
def always_lost(run: Run) -> None:
    """Kills its own process on every attempt. The second attempt first waits for the file
    CRON_TEST_GO (the test creates it once the first attempt's alert was delivered)."""
    _note(run, "always-lost")
    go = os.environ.get("CRON_TEST_GO")
    if run.attempt > 1 and go:
        deadline = time.monotonic() + 60
        while not Path(go).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    os.kill(os.getpid(), 9)
