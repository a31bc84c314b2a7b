"""The soak's jobs: one per ``spec.SPECS`` entry, each body writing a start and an end line
(job, slot, attempt, fence, execution, pid, time) to a marker file of its own process."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded

from cron_celery import Run, cron_task, exceptions
from cron_celery.schedules import every
from tests.soak import spec as specs


class DesignedFailure(Exception):
    """A failure the job's spec asks for at this slot and attempt."""


def _now() -> float:
    """Wall-clock time corrected by the clock shift the soak gave this process (faketime)."""
    return time.time() - float(os.environ.get("CRON_SOAK_CLOCK_SHIFT", "0") or 0)


def _mark(event: str, spec: specs.JobSpec, run: Run, **extra: Any) -> None:
    line = json.dumps({"ev": event, "job": spec.code, "slot": int(run.slot.timestamp()), "attempt": run.attempt,
                       "fence": run.fence, "exec": run.execution_id, "pid": os.getpid(), "t": _now(), **extra})
    directory = os.environ["CRON_SOAK_MARKERS"]
    fd = os.open(os.path.join(directory, f"bodies-{os.getpid()}.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def body(spec: specs.JobSpec, run: Run) -> Any:
    slot = int(run.slot.timestamp())
    _mark("start", spec, run)
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


def _declare(spec: specs.JobSpec) -> Any:
    def job(run: Run) -> Any:
        return body(spec, run)

    job.__name__ = job.__qualname__ = spec.name.replace("-", "_")
    return cron_task(
        name=spec.name, code=spec.code, task_name=f"tests.soak.tasks.{job.__name__}", pattern=spec.pattern,
        overlap=spec.overlap, catch_up=spec.catch_up, schedule=every(seconds=spec.every),
        max_retries=spec.max_retries, retry_backoff=1, retry_backoff_max=2, retry_on_failure=False,
        soft_time_limit=spec.soft_time_limit, time_limit=spec.time_limit, alert_after=spec.alert_after,
    )(job)


JOBS = {spec.code: _declare(spec) for spec in specs.SPECS}
