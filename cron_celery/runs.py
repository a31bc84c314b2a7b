"""The path of one run: claim the slot, call the job with a ``Run``, record the outcome."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import inspect
import json
import logging
import os
import socket
import threading
import traceback as tb
from collections.abc import Callable
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from django.db import DatabaseError

from cron_celery import (
    claims,
    conf,
    exceptions,
    leases,
    locks,
    models,
    outcomes,
    registry,
    retries,
    schedules,
    sentry,
    shutdown,
)

logger = logging.getLogger(__name__)
S = models.Status
HOSTNAME = socket.gethostname()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Run:
    """What a job receives: which slot it runs, and the tokens to run it safely.

    ``fence`` grows with every claim of the job: pass it to your own downstream writes
    (``UPDATE ... WHERE fence < %s``) so a stale run can never overwrite a newer one.
    ``key`` is the idempotency key ``"{code}:{slot}"`` for external calls.
    """

    job: str
    code: str
    slot: dt.datetime
    execution_date: dt.date
    attempt: int
    fence: int
    key: str
    execution_id: int
    run_number: int
    trigger: str
    logger: logging.LoggerAdapter[logging.Logger]
    cancelled: threading.Event

    def check(self) -> None:
        """Call it between units of work: raises ``Interrupted`` when the worker is shutting
        down (the run is tried again if attempts remain) and ``LeaseLost`` when another
        worker took this run over."""
        if self.cancelled.is_set():
            if shutdown.requested.is_set():
                raise exceptions.Interrupted(job=self.job)
            raise exceptions.LeaseLost(job=self.job)

    def shutdown_requested(self) -> bool:
        """True once the worker began a warm shutdown (SIGTERM): stop early if you can."""
        return shutdown.requested.is_set()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Outcome:
    """What happened to one call; ``status`` is a ``Status`` value, or ``DUPLICATE``/``FENCED``."""

    job: str
    slot: dt.datetime
    status: str
    execution_id: int | None
    run_number: int = 0
    skip_reason: str = ""
    message: str = ""
    error_code: str = ""
    result: Any = None
    exc: BaseException | None = None
    countdown: float | None = None  # RETRYING: seconds until the next attempt

    @property
    def ok(self) -> bool:
        return self.status == S.SUCCEEDED


FENCED = "FENCED"
_job_ids: dict[registry.Job, int] = {}


def refresh_job_ids(jobs: list[registry.Job]) -> dict[str, int]:
    """Create or refresh many jobs' rows at once (a beat starting with thousands of jobs)."""
    ids = claims.ensure_jobs(jobs)
    for job in jobs:
        _job_ids[job] = ids[job.code]
    return ids


def job_for_row(row_id: int) -> registry.Job | None:
    """The declaration of the job with this row id (None: not declared in this process)."""
    for job, known in _job_ids.items():
        if known == row_id:
            return job
    code = claims.job_code(row_id)
    if code is None:
        return None
    try:
        return registry.get(code)
    except exceptions.UnknownJob:
        return None


def jobs_by_row_id() -> dict[int, registry.Job]:
    """The declarations this process knows, by row id."""
    return {row_id: job for job, row_id in _job_ids.items()}


def job_id(job: registry.Job, *, refresh: bool = False) -> int:
    """The job's row id, creating or refreshing the row once per process."""
    if refresh or job not in _job_ids:
        _job_ids[job] = claims.ensure_job(job)
    return _job_ids[job]


def _clean(text: str, limit: int) -> str:
    """PostgreSQL text cannot hold NUL; long text is cut with a visible marker."""
    text = text.replace("\x00", "\ufffd")
    if len(text) > limit:
        cut = len(text) - limit
        text = f"{text[:limit]}\n… [truncated {cut} characters]"
    return text


def _jsonable(value: Any) -> tuple[Any, str]:
    """(value to store in ``result``, error message if it cannot be stored as JSON)."""
    try:
        encoded = json.dumps(value)
    except (TypeError, ValueError) as exc:
        preview = _clean(repr(value), 200)
        return None, (
            f"The job returned a value that is not JSON-serialisable "
            f"({type(value).__name__}: {preview}); return str, int, float, bool, None, "
            f"or lists and dicts of them. ({exc})"
        )
    limit = conf.settings.RESULT_MAX_CHARS
    if len(encoded) > limit or "\\u0000" in encoded:
        return {"truncated": True, "preview": _clean(encoded, limit)[:limit]}, ""
    return value, ""


def interpret(value: Any) -> tuple[str, str, str, Any]:
    """(status, message, error_code, stored result) from a job's return value."""
    stored, problem = _jsonable(value)
    limit = conf.settings.MESSAGE_MAX_CHARS
    if problem:
        return S.FAILED, _clean(problem, limit), "NOT_JSON", None
    if isinstance(value, dict) and "error" in value:
        message = _clean(str(value.get("message", "")), limit)
        code = _clean(str(value.get("error_code", "") or ""), 50)[:50]
        if value.get("error"):
            return S.FAILED, message, code or "JOB_ERROR", stored
        return S.SUCCEEDED, message, code, stored
    message = value if isinstance(value, str) else ""
    return S.SUCCEEDED, _clean(message, limit), "", stored


def describe_exception(exc: BaseException) -> tuple[str, str, str, str]:
    """(status, message, error_code, traceback) for an exception raised by a job."""
    settings = conf.settings
    try:
        text = str(exc)
    except Exception:  # a broken __str__ must not hide the failure
        text = "<unprintable exception>"
    if isinstance(exc, exceptions.JobFailed):
        label = text
    else:
        label = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    message = _clean(label, settings.MESSAGE_MAX_CHARS)
    # Format the traceback from the frames, then the (possibly huge) message once, cut.
    frames = "".join(tb.format_tb(exc.__traceback__))
    trace = _clean(f"Traceback (most recent call last):\n{frames}{message}",
                   settings.TRACEBACK_MAX_CHARS)
    if isinstance(exc, SoftTimeLimitExceeded):
        return S.TIMED_OUT, message, "TIME_LIMIT", trace
    code = getattr(exc, "error_code", "") or type(exc).__name__
    return S.FAILED, message, str(code)[:50], trace


def call_job(func: Callable[..., Any], *args: Any) -> Any:
    """Call a job function; coroutine functions are run to completion."""
    value = func(*args)
    if inspect.isawaitable(value):
        async def _await() -> Any:
            return await value

        return asyncio.run(_await())
    return value


def _begin(
    job: registry.Job, slot: dt.datetime, execution_date: dt.date, **options: Any
) -> claims.Claim:
    for refresh in (False, True):
        try:
            return claims.begin(job=job, job_id=job_id(job, refresh=refresh), slot=slot,
                                execution_date=execution_date, worker=HOSTNAME, pid=os.getpid(),
                                **options)
        except claims.JobRowMissing:  # a flushed database: recreate the row once
            if refresh:
                raise
    raise AssertionError("unreachable")


def execute(
    job: registry.Job,
    slot: dt.datetime,
    call: Callable[[Run], Any],
    *,
    trigger: str,
    execution_id: int | None = None,
    force: bool = False,
    rerun: bool = False,
    celery_task_id: str = "",
    allow_retry: bool = False,
) -> Outcome:
    """Run one slot of a job through the claim, the call and the fenced finish.

    With ``allow_retry`` (a run on a worker) a failed attempt that the job's retry policy
    retries ends as RETRYING (``Outcome.countdown`` says when); the caller sends it again.
    """
    tz = job.tzinfo
    execution_date = schedules.execution_date(slot, tz)
    lease = conf.settings.LEASE_SECONDS
    extra: dict[str, object] = {"job": job.code, "slot": schedules.iso(slot),
                                "execution": execution_id}
    job_lock = locks.for_job(job)
    lock_state = job_lock.acquire(extra) if job_lock is not None else ""
    try:
        claim = _begin(job, slot, execution_date, trigger=trigger, execution_id=execution_id,
                       force=force, rerun=rerun, celery_task_id=celery_task_id,
                       lease_seconds=lease, lock_busy=lock_state == locks.BUSY)
    except BaseException:
        if job_lock is not None:
            job_lock.release()
        raise
    if not claim.claimed and job_lock is not None:
        job_lock.release()
        job_lock = None
    extra["execution"] = claim.execution_id
    if claim.outcome == claims.DUPLICATE and claim.status_seen == claims.CAPPED:
        assert claim.execution_id is not None
        outcomes.dead(job, job_id=job_id(job), execution_id=claim.execution_id, status=S.LOST,
                      error_code="LEASE_EXPIRED", message="Its worker vanished on the last allowed attempt "
                      "(the lease expired); not taken over.")
        logger.warning("execution %s: its worker vanished on the last attempt; recorded LOST", claim.execution_id,
                       extra=extra)
        return Outcome(job=job.name, slot=slot, status=claims.DUPLICATE, execution_id=claim.execution_id,
                       message=S.LOST)
    if claim.outcome == claims.DUPLICATE:
        logger.info("execution %s already %s; this delivery does nothing",
                    claim.execution_id, claim.status_seen, extra=extra)
        return Outcome(job=job.name, slot=slot, status=claims.DUPLICATE,
                       execution_id=claim.execution_id, message=claim.status_seen)
    if not claim.claimed:
        logger.info("%s %s skipped: %s", job.name, schedules.iso(slot), claim.skip_reason,
                    extra=extra)
        if claim.execution_id is not None:
            outcomes.announce(job, claim.execution_id, slot, S.SKIPPED, claim.skip_reason,
                              claims.SKIP_MESSAGES[claim.skip_reason])
        return Outcome(job=job.name, slot=slot, status=S.SKIPPED,
                       execution_id=claim.execution_id, run_number=claim.run_number,
                       skip_reason=claim.skip_reason,
                       message=claims.SKIP_MESSAGES[claim.skip_reason])
    assert claim.execution_id is not None and claim.fence is not None
    cancelled = threading.Event()
    run = Run(
        job=job.name, code=job.code, slot=slot, execution_date=execution_date,
        attempt=claim.retry_count + 1, fence=claim.fence, key=schedules.run_key(job.code, slot),
        execution_id=claim.execution_id, run_number=claim.run_number, trigger=trigger,
        logger=logging.LoggerAdapter(logging.getLogger(f"cron_celery.jobs.{job.name}"), extra),
        cancelled=cancelled,
    )
    check_in_id = ""
    if claim.retry_count == 0 and sentry.crons_enabled(job):  # the execution's first attempt
        check_in_id = sentry.checkin_started(job)
        if check_in_id:
            claims.set_checkin(claim.execution_id, check_in_id)
    leases.track(claim.execution_id, claim.fence, lease, cancelled, extra,
                 job_lock if lock_state == locks.HELD else None)
    if shutdown.requested.is_set():
        cancelled.set()
    error: BaseException | None = None
    trace = ""
    try:
        try:
            value = call(run)
        except BaseException as exc:  # recorded, then re-raised by the caller
            error = exc
            status, message, code, trace = describe_exception(exc)
            stored = None
        else:
            status, message, code, stored = interpret(value)
    finally:
        leases.untrack(claim.execution_id)
    countdown: float | None = None
    try:
        if allow_retry and retries.wanted(job, status, error, claim.retry_count):
            countdown = retries.countdown(job, claim.retry_count)
            if claims.retry(job_id=job_id(job), execution_id=claim.execution_id, fence=claim.fence,
                            status=status, message=message, error_code=code, traceback=trace,
                            countdown=countdown):
                logger.warning("%s %s attempt %d %s, retrying in %.1f s: %s", job.name, schedules.iso(slot),
                               run.attempt, status, countdown, message[:200], extra=extra)
                return Outcome(job=job.name, slot=slot, status=S.RETRYING, execution_id=claim.execution_id,
                               run_number=claim.run_number, message=message, error_code=code,
                               exc=error, countdown=countdown)
        written = outcomes.finish(
            job, job_id(job), claim.execution_id, slot, fence=claim.fence, status=status, message=message,
            error_code=code, traceback=trace, result=stored, check_in_id=check_in_id,
            history=claim.retry_count > 0,  # a first attempt has no history to close
        )
    except DatabaseError:
        logger.exception("could not record the outcome of execution %s", claim.execution_id,
                         extra=extra)
        raise
    finally:
        # Released only after the outcome is written, so nobody starts before it is.
        if job_lock is not None:
            job_lock.release()
    if not written:
        claims.count_fenced(job_id(job))
        logger.warning("execution %s was fenced: its outcome (%s) is not recorded",
                       claim.execution_id, status, extra=extra)
        status = FENCED
    else:
        log = logger.info if status == S.SUCCEEDED else logger.warning
        log("%s %s %s: %s", job.name, schedules.iso(slot), status, message[:200], extra=extra)
    return Outcome(job=job.name, slot=slot, status=status, execution_id=claim.execution_id,
                   run_number=claim.run_number, message=message, error_code=code,
                   result=stored, exc=error)
