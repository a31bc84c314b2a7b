"""Writing an execution's final outcome, and announcing it.

Every writer of a final status — the worker (``runs``), the worker's parent (``parent``),
the reconciler and the admin — goes through here, so that each outcome gets the same
treatment:

1. the status, and what the listeners record with it (the alert outbox), in one transaction
   (``events.record``); when no listener records anything this is the bare statement;
2. after the commit, the announcement (``events.ended``): the Django signals and Sentry's
   final check-in, neither of which can change what was recorded.

The run's start is announced here too (``started``). The listeners are subscribed at app
start; this module knows none of them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from django.db import transaction

from cron_celery import enums, events, finishes, jobs, registry, repairs

S = enums.Status


def started(job: registry.Job, execution_id: int, slot: dt.datetime, attempt: int) -> None:
    """After a committed claim: the run's body is about to start."""
    events.started(events.Started(job=job, execution_id=execution_id, slot=slot, attempt=attempt))


def finish(job: registry.Job, job_id: int, execution_id: int, slot: dt.datetime, *, fence: int, status: str,
           message: str, error_code: str, traceback: str, result: Any, history: bool = True) -> bool:
    """``finishes.finish_counting`` with what the listeners record, then the announcement;
    False when fenced."""
    kwargs = {"job_id": job_id, "execution_id": execution_id, "fence": fence, "status": status,
              "message": message, "error_code": error_code, "traceback": traceback, "result": result,
              "history": history}
    event = events.Ended(job=job, job_id=job_id, execution_id=execution_id, slot=slot, status=status,
                         error_code=error_code, message=message, counted=False)
    if events.records(event):
        with transaction.atomic():
            events.record(event)  # before the write: what it reads is the job as it was
            before = finishes.finish_counting(**kwargs)
            if before is None:
                transaction.set_rollback(True)
    else:
        before = finishes.finish_counting(**kwargs)
    if before is None:
        return False
    events.ended(dataclasses.replace(event, recovered=status == S.SUCCEEDED and before > 0))
    return True


def dead(job: registry.Job | None, **kwargs: Any) -> repairs.Ended | None:
    """``repairs.end_dead_attempts``, recorded by the listeners when final or when its worker was
    lost (a lost worker is news even when the execution is retried), then announced when final."""
    status = str(kwargs["status"])
    with transaction.atomic():
        ended = repairs.end_dead_attempts(**kwargs)
        if ended is not None:
            event = events.Ended(job=job, job_id=ended.job_id, execution_id=ended.execution_id, slot=ended.slot,
                                 status=status, error_code=str(kwargs.get("error_code", "")),
                                 message=str(kwargs.get("message", "")), final=ended.status != S.RETRYING,
                                 lost_attempt=ended.status == S.RETRYING and status == S.LOST)
            if event.final or event.lost_attempt:
                events.record(event)
    if ended is not None and ended.status != S.RETRYING:
        events.ended(event)
    return ended


def unstarted(job: registry.Job | None, *, job_id: int, execution_id: int, slot: dt.datetime, status: str,
              error_code: str, message: str, running_too: bool = False) -> bool:
    """``repairs.close_unstarted`` (MISSED or LOST), recorded and announced."""
    event = events.Ended(job=job, job_id=job_id, execution_id=execution_id, slot=slot, status=status,
                         error_code=error_code, message=message)
    with transaction.atomic():
        closed = repairs.close_unstarted(job_id=job_id, execution_id=execution_id, status=status,
                                         error_code=error_code, message=message, running_too=running_too)
        if closed:
            events.record(event)
    if closed:
        events.ended(event)
    return closed


def given_up(job: registry.Job | None, *, job_id: int, execution_id: int, note: str) -> finishes.GivenUp | None:
    """``finishes.give_up`` (an attempted execution that reached a paused job): it ends with its
    own failure, counted, recorded and announced like any final failure."""
    with transaction.atomic():
        ended = finishes.give_up(job_id=job_id, execution_id=execution_id, note=note)
        if ended is not None:
            event = events.Ended(job=job, job_id=job_id, execution_id=execution_id, slot=ended.slot,
                                 status=ended.status, error_code=ended.error_code, message=ended.message)
            events.record(event)
    if ended is not None:
        events.ended(event)
    return ended


def revoked(job: registry.Job | None, **kwargs: Any) -> finishes.Revoked | None:
    """``finishes.revoke``, announced. A revoked run is recorded by nobody else (no alert):
    somebody stopped it on purpose, and the history shows it."""
    ended = finishes.revoke(**kwargs)
    if ended is not None and ended.started:
        announce(job, int(kwargs["job_id"]), ended.execution_id, ended.slot, S.REVOKED, "REVOKED",
                 str(kwargs.get("message", "")))
    return ended


def missed(rows: list[tuple[int, int, dt.datetime]]) -> int:
    """Record slots written MISSED in bulk (beat back after an outage, the reconciler): ``rows``
    are (job id, the newest MISSED execution id of the job, its slot) — the alert outbox writes
    one alert per job and outage, not one per slot. Returns how many jobs' MISSED slots a
    listener recorded (in a transaction of the job's own)."""
    recorded = 0
    if not rows:
        return 0
    by_id = jobs.jobs_by_row_id()
    for job_id, execution_id, slot in rows:
        job = by_id.get(job_id) or jobs.job_for_row(job_id)
        event = events.Ended(job=job, job_id=job_id, execution_id=execution_id, slot=slot, status=S.MISSED)
        if events.records(event):
            with transaction.atomic():
                events.record(event)
            recorded += 1
    return recorded


def announce(job: registry.Job | None, job_id: int, execution_id: int, slot: dt.datetime, status: str,
             error_code: str, message: str) -> None:
    """After the commit of an outcome written elsewhere (a skip at the claim; a final write whose
    answer was lost with the connection): the announcement alone."""
    events.ended(events.Ended(job=job, job_id=job_id, execution_id=execution_id, slot=slot, status=status,
                              error_code=error_code, message=message))


