"""Test jobs for runs inside other work (imported by tests/jobsapp/tasks.py).

- ``txn-held``: called in-process by the test inside a transaction of its own while a real beat
  runs (tests/faults/test_in_transaction.py). The beat's process (CRON_TEST_IN_TRANSACTION=1)
  declares it on a one-second schedule, next to ``txn-other``; the test's process declares it
  unscheduled, so no other test's beat sends it.
- ``ident-long``: a long run on two workers whose pool processes share a hostname and a pid
  (tests/faults/test_worker_identity.py); unscheduled.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from cron_celery import Run, cron_task
from cron_celery.schedules import every

_TICKING = os.environ.get("CRON_TEST_IN_TRANSACTION") == "1"
#: Set by the test: the in-process run of ``txn-held`` waits for it (at most a minute).
RELEASE = threading.Event()
#: What the in-process body saw: whether its run was told to stop.
SEEN: dict[str, bool] = {}


@cron_task(name="txn-held", code="X701", pattern="always", overlap="allow", catch_up="none",
           schedule=every(seconds=1) if _TICKING else None)
def txn_held(run: Run) -> str:
    """In the beat's process, a one-second job. Called in-process by the test, it holds on until
    the test releases it (or its run is told to stop)."""
    if _TICKING:
        return "tick"
    deadline = time.monotonic() + 60
    while not RELEASE.is_set() and time.monotonic() < deadline:
        if run.cancelled.wait(0.05):
            SEEN["cancelled"] = True
            break
    return "released"


if _TICKING:

    @cron_task(name="txn-other", code="X702", pattern="always", overlap="allow", catch_up="none",
               schedule=every(seconds=1))
    def txn_other(run: Run) -> str:
        """Another one-second job: its slots must not wait for ``txn-held``'s row."""
        return "tick"


def _note(line: str) -> None:
    path = os.environ.get("CRON_TEST_MARKER")
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(f"{line}\n")


@cron_task(name="ident-long", code="X801", pattern="standard", overlap="allow", max_retries=1)
def ident_long(run: Run) -> str:
    """Notes ``started <execution> <worker tag> <pid>``, then runs until the file ``release`` beside
    CRON_TEST_MARKER exists (at most two minutes); notes ``cancelled`` if its run was told to stop,
    and ``done`` at the end."""
    tag = os.environ.get("CRON_TEST_WORKER_TAG", "?")
    _note(f"started {run.execution_id} {tag} {os.getpid()}")
    release = Path(os.environ.get("CRON_TEST_MARKER", "/nonexistent")).parent / "release"
    deadline = time.monotonic() + 120
    while not release.exists() and time.monotonic() < deadline:
        if run.cancelled.wait(0.1):
            _note(f"cancelled {run.execution_id} {tag}")
            break
    _note(f"done {run.execution_id} {tag}")
    return f"ran on {tag}"
