"""Test jobs for leader (imported by tests/jobsapp/tasks.py): clocks, leadership, poolers."""

from __future__ import annotations

import os

from cron_celery import Run, cron_task


@cron_task(name="clock-probe", code="B001", catch_up="none")
def clock_probe(run: Run) -> str:
    """No schedule in code: the clock test gives its row one in the database, so no beat of
    another test dispatches it."""
    path = os.environ.get("CRON_TEST_MARKER")
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(f"clock-probe {run.key} {os.getpid()}\n")
    return "ran"
