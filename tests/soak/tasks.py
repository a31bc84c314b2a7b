"""The soak's jobs: one per ``spec.SPECS`` entry, each body writing a start and an end line
(job, slot, attempt, fence, execution, pid, time) to a marker file of its own process."""

from __future__ import annotations

import datetime as dt
import json
import os
import time
import zlib
from typing import Any, Literal

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded

from cron_celery import Run, cron_task, exceptions
from cron_celery.run import tasks
from cron_celery.schedules import every
from tests.soak import spec as specs


class DesignedFailure(Exception):
    """A failure the job's spec asks for at this slot and attempt."""


def _now() -> float:
    """Wall-clock time corrected by the clock shift the soak gave this process (faketime)."""
    return time.time() - float(os.environ.get("CRON_SOAK_CLOCK_SHIFT", "0") or 0)


def write_line(prefix: str, line: dict[str, Any]) -> None:
    """One JSON line appended to this process's marker file ``prefix-<pid>.jsonl`` (two workers in
    pid namespaces of their own may share a pid: an appended line is still whole)."""
    directory = os.environ["CRON_SOAK_MARKERS"]
    fd = os.open(os.path.join(directory, f"{prefix}-{os.getpid()}.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


def _mark(event: str, spec: specs.JobSpec, run: Run, **extra: Any) -> None:
    write_line("bodies", {"ev": event, "job": spec.code, "slot": int(run.slot.timestamp()), "attempt": run.attempt,
                          "fence": run.fence, "exec": run.execution_id, "pid": os.getpid(), "t": _now(), **extra})


def body(spec: specs.JobSpec, run: Run) -> Any:
    slot = int(run.slot.timestamp())
    # What the claim told the run of the job's history (run.previous, run.last_success): execution ids.
    told = {"previous": run.previous and run.previous.execution_id,
            "last_success": run.last_success and run.last_success.execution_id}
    _mark("start", spec, run, **told, **({"params": dict(run.params)} if spec.params else {}))
    outcome = "error"
    try:
        seconds = specs.duration(spec, slot, run.attempt)
        if spec.cooperative:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                run.check()
                run.cancelled.wait(min(0.1, max(0.0, deadline - time.monotonic())))
            run.check()
        else:
            time.sleep(seconds)
        if specs.fails(spec, slot, run.attempt):
            outcome = "fail"
            if spec.reported:
                return {"error": True, "message": f"designed failure fence={run.fence}", "error_code": "DESIGNED"}
            raise DesignedFailure(f"designed failure fence={run.fence}")
        outcome = "ok"
        return f"ok fence={run.fence}"
    except exceptions.LeaseLost:
        outcome = "leaselost"
        raise
    except exceptions.Interrupted:
        outcome = "interrupted"
        raise
    except SoftTimeLimitExceeded:
        outcome = "timeout"
        raise
    finally:
        _mark("end", spec, run, outcome=outcome)


def window() -> tuple[dt.datetime, dt.datetime]:
    """The windowed job's window: CRON_SOAK_WINDOW's two epoch seconds (the soak sets them)."""
    opens, closes = (float(value) for value in os.environ["CRON_SOAK_WINDOW"].split(","))
    return dt.datetime.fromtimestamp(opens, dt.UTC), dt.datetime.fromtimestamp(closes, dt.UTC)


def _declare(spec: specs.JobSpec) -> Any:
    if spec.params:
        def job(run: Run, *, region: Literal["eu", "us"] = "eu", n: int = 0) -> Any:
            return body(spec, run)
    else:
        def job(run: Run) -> Any:  # type: ignore[misc]
            return body(spec, run)

    job.__name__ = job.__qualname__ = spec.name.replace("-", "_")
    options: dict[str, Any] = {"jitter": spec.jitter} if spec.jitter else {}
    if spec.after:
        options["after"] = [specs.BY_CODE[code].name for code in spec.after]
    else:
        options["schedule"] = every(seconds=spec.every)
    if spec.group:
        options["concurrency_group"] = spec.group
    if spec.windowed:
        options["active_from"], options["active_until"] = window()
    if spec.pause_after_failures:
        options["pause_after_failures"] = spec.pause_after_failures
    return cron_task(
        name=spec.name, code=spec.code, task_name=f"tests.soak.tasks.{job.__name__}", pattern=spec.pattern,
        overlap=spec.overlap, catch_up=spec.catch_up, max_retries=spec.max_retries, retry_backoff=1,
        retry_backoff_max=2, retry_on_failure=False, soft_time_limit=spec.soft_time_limit,
        time_limit=spec.time_limit, alert_after=spec.alert_after, **options,
    )(job)


#: Every job but the tracked plain task's (and the windowed one, in a process the soak did not give a window).
JOBS = {spec.code: _declare(spec) for spec in specs.SPECS
        if not spec.tracked and (os.environ.get("CRON_SOAK_WINDOW") or not spec.windowed)}


@shared_task(bind=True, name=specs.TRACKED_TASK_NAME)
def plain_tick(self: Any) -> str:
    """A plain periodic task, written with no thought of cron_celery: tracked, its message carries the
    execution's headers, which its lines name (a body run untracked names none)."""
    spec = specs.BY_CODE["PT"]
    execution = self.request.get(tasks.HEADER_EXECUTION)
    slot = self.request.get(tasks.HEADER_SLOT)
    line = {"job": "PT", "exec": execution, "slot": slot, "pid": os.getpid(), "t": _now()}
    write_line("tracked", {"ev": "start", **line})
    time.sleep(spec.shortest + (spec.longest - spec.shortest) * (zlib.crc32(f"{execution}".encode()) % 100) / 100)
    write_line("tracked", {"ev": "end", **line})
    return "ok"
