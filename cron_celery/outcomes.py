"""Writing an execution's final outcome, with what follows from it.

Every writer of a final status — the worker (``runs``), the worker's parent (``parent``)
and the reconciler — goes through here, so that each outcome gets the same treatment:

1. the status and the alert rows in one transaction (``alerts.record``); when no channel
   could hear of the outcome this is the bare statement, as fast as before;
2. after the commit, the Django signals (``cron_celery.signals``) and Sentry's final
   check-in (``ok``/``error``), neither of which can change what was recorded.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from django.db import transaction

from cron_celery import alerts, claims, models, registry, sentry, signals

logger = logging.getLogger(__name__)
S = models.Status


def finish(job: registry.Job, job_id: int, execution_id: int, slot: dt.datetime, *, fence: int, status: str,
           message: str, error_code: str, traceback: str, result: Any, check_in_id: str = "",
           history: bool = True) -> bool:
    """``claims.finish`` with alerts, signals and the check-in; False when fenced."""
    kwargs = {"job_id": job_id, "execution_id": execution_id, "fence": fence, "status": status,
              "message": message, "error_code": error_code, "traceback": traceback, "result": result,
              "history": history}
    if alerts.wanted_for(job, status):
        with transaction.atomic():
            recorded = alerts.record(job=job, job_id=job_id, execution_id=execution_id, status=status, counted=False)
            before = claims.finish_counting(**kwargs)
            if before is None:
                transaction.set_rollback(True)
    else:
        before = claims.finish_counting(**kwargs)
        recorded = alerts.NOTHING
    if before is None:
        return False
    recovered = status == S.SUCCEEDED and (before > 0 or recorded.recovered)
    announce(job, execution_id, slot, status, error_code, message, recovered=recovered, check_in_id=check_in_id)
    return True


def dead(job: registry.Job | None, **kwargs: Any) -> claims.Ended | None:
    """``claims.end_dead_attempts`` with alerts (when final, or for any lost worker), signals and
    the check-in."""
    with transaction.atomic():
        ended = claims.end_dead_attempts(**kwargs)
        lost = kwargs.get("status") == S.LOST
        if ended is not None and (ended.status != S.RETRYING or lost) and alerts.wanted_for(job, kwargs["status"]):
            alerts.record(job=job, job_id=ended.job_id, execution_id=ended.execution_id, status=kwargs["status"],
                          counted=True, lost_attempt=ended.status == S.RETRYING)
    if ended is not None and ended.status != S.RETRYING:
        announce(job, ended.execution_id, ended.slot, ended.status, str(kwargs.get("error_code", "")),
                 str(kwargs.get("message", "")))
    return ended


def unstarted(job: registry.Job | None, *, job_id: int, execution_id: int, slot: dt.datetime, status: str,
              error_code: str, message: str, running_too: bool = False) -> bool:
    """``claims.close_unstarted`` (MISSED or LOST) with alerts, signals and the check-in."""
    with transaction.atomic():
        closed = claims.close_unstarted(job_id=job_id, execution_id=execution_id, status=status,
                                        error_code=error_code, message=message, running_too=running_too)
        if closed and alerts.wanted_for(job, status):
            alerts.record(job=job, job_id=job_id, execution_id=execution_id, status=status, counted=True)
    if closed:
        announce(job, execution_id, slot, status, error_code, message)
    return closed


def given_up(job: registry.Job | None, *, job_id: int, execution_id: int, note: str) -> claims.GivenUp | None:
    """``claims.give_up`` (an attempted execution that reached a paused job) with alerts, signals
    and the check-in: it ends with its own failure, counted and alerted like any final failure."""
    with transaction.atomic():
        ended = claims.give_up(job_id=job_id, execution_id=execution_id, note=note)
        if ended is not None and alerts.wanted_for(job, ended.status):
            alerts.record(job=job, job_id=job_id, execution_id=execution_id, status=ended.status, counted=True)
    if ended is not None:
        announce(job, execution_id, ended.slot, ended.status, ended.error_code, ended.message)
    return ended


def revoked(job: registry.Job | None, **kwargs: Any) -> claims.Revoked | None:
    """``claims.revoke`` with the signals and the check-in. A revoked run alerts nobody: somebody
    stopped it on purpose, and the history shows it."""
    ended = claims.revoke(**kwargs)
    if ended is not None and ended.started:
        announce(job, ended.execution_id, ended.slot, S.REVOKED, "REVOKED", str(kwargs.get("message", "")))
    return ended


def missed(rows: list[tuple[int, int]]) -> int:
    """Alerts for slots recorded MISSED in bulk (beat back after an outage, the reconciler):
    ``rows`` are (job id, the newest MISSED execution id of the job) — one alert per job
    and outage, not one per slot. Returns the alert rows written."""
    written = 0
    if not rows:
        return 0
    from cron_celery import runs

    by_id = runs.jobs_by_row_id()
    for job_id, execution_id in rows:
        job = by_id.get(job_id) or runs.job_for_row(job_id)
        if alerts.wanted_for(job, S.MISSED):
            with transaction.atomic():
                written += len(alerts.record(job=job, job_id=job_id, execution_id=execution_id, status=S.MISSED,
                                             counted=True).alert_ids)
    return written


def announce(job: registry.Job | None, execution_id: int, slot: dt.datetime, status: str, error_code: str,
             message: str, *, recovered: bool = False, check_in_id: str = "") -> None:
    """After the commit: signals, and Sentry's final check-in for a final outcome."""
    name = job.name if job is not None else ""
    code = job.code if job is not None else ""
    try:
        signals.send(job=name, code=code, execution_id=execution_id, slot=slot, status=status,
                     error_code=error_code, message=message, recovered=recovered)
    except Exception:  # receivers are isolated by send_robust; this guards the rest
        logger.exception("sending the signals of execution %s failed", execution_id)
    if job is not None and status in S.terminal() and status not in (S.SKIPPED, S.MISSED) and sentry.crons_enabled(job):
        sentry.checkin_finished(job, check_in_id or claims.checkin_of(execution_id), status == S.SUCCEEDED, None)
