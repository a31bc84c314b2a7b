"""Test jobs with parameters (imported by tests/jobsapp/tasks.py): each body writes what it received,
with each value's Python type, as one JSON line in CRON_TEST_MARKER (tests/test_params_runs.py,
tests/browser/test_params_browser.py). Neither has a schedule: no beat of another test sends them."""

from __future__ import annotations

import datetime as dt
import json
import os
from typing import Literal

from cron_celery import Run, TrackedTask, cron_task, register_task


def received(label: str, run: Run | None, values: dict[str, object]) -> None:
    """One line: the job, the execution, ``run.params`` and the keyword arguments with their types
    (a class-style job's ``execute`` has no ``Run``)."""
    path = os.environ.get("CRON_TEST_MARKER")
    if path:
        line = {"job": label, "execution": run.execution_id if run else None, "attempt": run.attempt if run else None,
                "run_params": sorted(run.params) if run else None,
                "kwargs": {name: [type(value).__name__, value if isinstance(value, str | int | float | bool)
                                  or value is None else value.isoformat()] for name, value in values.items()}}
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(line) + "\n")


@cron_task(name="param-report", code="P001", pattern="standard", overlap="skip", max_retries=1, retry_backoff=1,
           retry_jitter=False)
def param_report(run: Run, *, region: Literal["eu", "us"] = "eu", day: dt.date | None = None,
                 dry_run: bool = False, limit: int = 100, ratio: float = 0.5,
                 since: dt.datetime | None = None, note: str = "") -> str:
    """A report by region: the issue's example, with a parameter of every kind. ``note="fail"`` fails
    every attempt, ``"fail-once"`` the first (the retry runs with the same values)."""
    received("param-report", run, {"region": region, "day": day, "dry_run": dry_run, "limit": limit,
                                   "ratio": ratio, "since": since, "note": note})
    if note == "fail" or (note == "fail-once" and run.attempt == 1):
        raise RuntimeError(f"report for {region} failed on purpose (attempt {run.attempt})")
    return f"report {region}{' (dry run)' if dry_run else ''}"


@register_task("param-sync", "P002", execution_pattern="rerun_on_failure")
class ParamSync(TrackedTask):
    """A class-style job whose ``execute`` declares a required parameter."""

    def execute(self, date: dt.date, *, partner: str, full: bool = False) -> str:  # type: ignore[override]
        received("param-sync", None, {"partner": partner, "full": full, "date": date})
        return f"synced {partner} for {date}{' (full)' if full else ''}"
