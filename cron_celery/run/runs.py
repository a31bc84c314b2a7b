"""The path of one run: claim the slot, call the job with a ``Run``, record the outcome."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import inspect
import logging
import os
import threading
import time
import types
from collections.abc import Callable, Mapping
from typing import Any

from django.db import DatabaseError, DataError, connection, transaction

from cron_celery import conf, enums, exceptions, slots
from cron_celery.decisions import claims, executions, finishes, heartbeats, jobs, room
from cron_celery.decisions import previous as previous_runs
from cron_celery.declaring import params, registry
from cron_celery.run import callers, identity, leases, limits, locks, outcomes, reconnect, retries, shutdown
from cron_celery.run.results import clean_text, describe_exception, interpret, interpret_plain

logger = logging.getLogger(__name__)
#: Marks the record of a run's outcome (``run_cron_task`` prints the outcome itself).
OUTCOME = "cron_outcome"
S = enums.Status


@dataclasses.dataclass(frozen=True, kw_only=True)
class Run:
    """What a job receives: which slot it runs, and the tokens to run it safely.

    ``fence`` grows with every claim of the job: pass it to your own downstream writes
    (``UPDATE ... WHERE fence < %s``) so a stale run can never overwrite a newer one.
    ``key`` is the idempotency key ``"{code}:{slot}"`` for external calls.
    ``params`` (read-only) holds the values of the job's parameters this run was given, as their
    annotated types, the defaults for the rest: what the body also receives as keyword arguments.
    ``previous``, ``last_success``: the job's run before this one by slot order, and its newest
    success, as the claim read them; None when there is none (``decisions.previous``).
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
    params: Mapping[str, Any] = dataclasses.field(default_factory=lambda: types.MappingProxyType({}))
    previous: previous_runs.PreviousRun | None = None
    last_success: previous_runs.PreviousRun | None = None

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
    """What happened to one call; ``status`` is a ``Status`` value, or ``DUPLICATE``/``FENCED``/``WAITING``."""

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
    frees_job: bool = False  # a run ended, a waiting one gave up or yielded to older ones: the oldest may start

    @property
    def ok(self) -> bool:
        return self.status == S.SUCCEEDED


FENCED = "FENCED"
#: The execution waits for the job's live run (``claims.WAITING``); it is sent again when that run ends.
WAITING = claims.WAITING
#: The error code of an outcome that could not be stored as it was (see ``_record``).
UNSTORABLE = "RESULT_NOT_STORABLE"


def _record(job: registry.Job, claim: claims.Claim, slot: dt.datetime, *, countdown: float | None,
            status: str, message: str, error_code: str, traceback: str,
            result: Any, runtime: float | None = None) -> str | bool:
    """Write the attempt's outcome: ``RETRYING`` if ``countdown`` is given and the job's row allows
    another attempt, else the final outcome (True; False when fenced). Inside a transaction (an
    in-process call in a test case's) it runs in a savepoint: a refused write leaves it usable."""
    assert claim.execution_id is not None and claim.fence is not None
    with transaction.atomic() if connection.in_atomic_block else contextlib.nullcontext():
        if countdown is not None and finishes.retry(
                job_id=jobs.job_id(job), execution_id=claim.execution_id, fence=claim.fence, status=status,
                message=message, error_code=error_code, traceback=traceback, countdown=countdown,
                capped=not job.tracked):
            return S.RETRYING
        return outcomes.finish(
            job, jobs.job_id(job), claim.execution_id, slot, fence=claim.fence, status=status, message=message,
            error_code=error_code, traceback=traceback, result=result,
            history=claim.retry_count > 0,  # a first attempt has no history to close
            runtime=runtime,
        )


def call_job(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call a job function (its parameters as keyword arguments: ``**run.params``); coroutine
    functions are run to completion."""
    value = func(*args, **kwargs)
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
            return claims.begin(job=job, job_id=jobs.job_id(job, refresh=refresh), slot=slot,
                                execution_date=execution_date, worker=identity.WORKER, pid=os.getpid(),
                                **options)
        except claims.JobRowMissing:  # a flushed database: recreate the row once
            if refresh:
                raise
    raise AssertionError("unreachable")


def _claim(job: registry.Job, slot: dt.datetime, execution_date: dt.date, execution_id: int | None,
           extra: dict[str, object], **options: Any) -> claims.Claim:
    """``_begin``, tried again on a new connection only for an existing execution: a claim that
    inserts one (``delay()``, an in-process run) is not repeated, since its commit may have landed.
    A repeated claim that finds the execution RUNNING by this very process (the first try committed,
    its answer was lost) takes that claim as its own instead of calling it a duplicate."""
    if execution_id is None:
        return _begin(job, slot, execution_date, execution_id=None, **options)
    claim, retried = reconnect.reconnecting(
        lambda: _begin(job, slot, execution_date, execution_id=execution_id, **options), "claiming the run", extra)
    if retried and claim.outcome == claims.DUPLICATE and claim.status_seen == S.RUNNING:
        mine = heartbeats.own_claim(execution_id, identity.WORKER, os.getpid())
        if mine is not None:
            return mine
    return claim


@dataclasses.dataclass(kw_only=True)
class _Attempt:
    """What one delivery of a slot carries through its steps: the job and slot, the claim it took, the
    job's lock (held until the outcome is written), and the log records' extra fields."""

    job: registry.Job
    slot: dt.datetime
    execution_date: dt.date
    lease_seconds: int
    trigger: str
    claim: claims.Claim
    job_lock: locks.JobLock | None
    lock_held: bool
    extra: dict[str, object]


@dataclasses.dataclass(kw_only=True)
class _Called:
    """What the body's call came to, as the final write records it."""

    run: Run
    status: str
    message: str
    code: str
    trace: str
    stored: Any
    error: BaseException | None
    runtime: float
    held: limits.Hold  # the soft time limit held off until the outcome is written (``limits.hold``)


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
    given: Mapping[str, params.Json] | None = None,
    params_given: bool = False,
) -> Outcome:
    """Run one slot of a job through the claim, the call and the fenced finish.

    With ``allow_retry`` (a run on a worker) a failed attempt that the job's retry policy
    retries ends as RETRYING (``Outcome.countdown`` says when); the caller sends it again.

    The body runs with the parameter values on the execution's row, as the claim read them: for
    a new execution, ``given`` (checked) over the job's scheduled ones; ``params_given`` makes it
    a run with parameters a person gave (its own execution; see ``claims.begin``). A value that no
    longer fits the job's parameters fails the run (``INVALID_PARAMS``), without calling the body.

    The steps: take the slot (lock and claim), end here if the claim says not to run, call the
    body, write the outcome (or the retry), and say what came of it.
    """
    callers.refuse_in_transaction(job.name)  # before anything is locked or written
    attempt = _take(job, slot, trigger, execution_id=execution_id, force=force, rerun=rerun,
                    celery_task_id=celery_task_id, given=given, params_given=params_given)
    not_run = _not_run(attempt, execution_id)
    if not_run is not None:
        return not_run
    called = _call(attempt, call)
    claim = attempt.claim
    if job.tracked:  # its task retries itself: its next message is already sent when Retry is raised
        countdown = retries.asked_for(called.error) if allow_retry else None
    else:
        countdown = retries.countdown(job, claim.retry_count) if (
            allow_retry and retries.wanted(job, called.status, called.error, claim.retry_count)) else None
    written = _write(attempt, called, countdown)
    return _reported(attempt, called, written, countdown)


def _take(job: registry.Job, slot: dt.datetime, trigger: str, *, execution_id: int | None, force: bool,
          rerun: bool, celery_task_id: str, given: Mapping[str, params.Json] | None,
          params_given: bool) -> _Attempt:
    """The job's lock (overlap-skip and rate-limited jobs), then the claim; the lock is kept only by a
    run that was claimed."""
    extra: dict[str, object] = {"job": job.code, "slot": slots.iso(slot), "execution": execution_id}
    execution_date, lease_seconds = slots.execution_date(slot, job.tzinfo), conf.settings.LEASE_SECONDS
    job_lock = locks.for_job(job)
    lock_state = job_lock.acquire(extra) if job_lock is not None else ""
    try:
        claim = _claim(job, slot, execution_date, execution_id, extra, trigger=trigger,
                       force=force, rerun=rerun, celery_task_id=celery_task_id,
                       lease_seconds=lease_seconds, lock_busy=lock_state == locks.BUSY,
                       given=dict(given) if given else None, params_given=params_given)
    except BaseException:
        if job_lock is not None:
            job_lock.release()
        raise
    if not claim.claimed and job_lock is not None:
        job_lock.release()
        job_lock = None
    extra["execution"] = claim.execution_id
    return _Attempt(job=job, slot=slot, execution_date=execution_date, lease_seconds=lease_seconds, trigger=trigger,
                    claim=claim, job_lock=job_lock,
                    lock_held=lock_state == locks.HELD, extra=extra)


def _not_run(attempt: _Attempt, execution_id: int | None) -> Outcome | None:
    """The outcome of a delivery the claim did not let run (a duplicate, a wait, a skip, a retry given up
    on a paused job), recorded and announced as the claim decided; None when the claim runs it."""
    job, slot, claim, extra = attempt.job, attempt.slot, attempt.claim, attempt.extra
    if claim.outcome == claims.DUPLICATE and claim.status_seen == claims.CAPPED:
        assert claim.execution_id is not None
        outcomes.dead(job, job_id=jobs.job_id(job), execution_id=claim.execution_id, status=S.LOST,
                      error_code="LEASE_EXPIRED", message="Its worker vanished on the last allowed attempt "
                      "(the lease expired); not taken over.")
        logger.warning("execution %s: its worker vanished on the last attempt; recorded LOST", claim.execution_id,
                       extra=extra)
        return Outcome(job=job.name, slot=slot, status=claims.DUPLICATE, execution_id=claim.execution_id,
                       message=S.LOST)
    if claim.outcome == claims.WAITING:
        what = "the job to be resumed" if claim.skip_reason == enums.SkipReason.PAUSED \
            else "the older runs of the job" if claim.behind else f"execution {claim.blocker} of the job to end"
        logger.info("%s %s waits for %s (%s)", job.name, slots.iso(slot), what, claim.skip_reason, extra=extra)
        return Outcome(job=job.name, slot=slot, status=WAITING, execution_id=claim.execution_id, frees_job=claim.behind,
                       run_number=claim.run_number, skip_reason=claim.skip_reason, message=f"waiting for {what}")
    if claim.outcome == claims.GIVE_UP:
        return _given_up(attempt)
    if claim.outcome == claims.DUPLICATE:
        logger.info("execution %s already %s; this delivery does nothing",
                    claim.execution_id, claim.status_seen, extra=extra)
        return Outcome(job=job.name, slot=slot, status=claims.DUPLICATE,
                       execution_id=claim.execution_id, message=claim.status_seen)
    if not claim.claimed:
        logger.info("%s %s skipped: %s", job.name, slots.iso(slot), claim.skip_reason, extra=extra)
        if claim.execution_id is not None:
            outcomes.announce(job, jobs.job_id(job), claim.execution_id, slot, S.SKIPPED, claim.skip_reason,
                              claim.message or room.SKIP_MESSAGES[claim.skip_reason])
        return Outcome(job=job.name, slot=slot, status=S.SKIPPED,
                       execution_id=claim.execution_id, run_number=claim.run_number,
                       skip_reason=claim.skip_reason,
                       message=claim.message or room.SKIP_MESSAGES[claim.skip_reason],
                       # A skip for the pause, or behind older waiting runs: the oldest that may go, goes now.
                       frees_job=claim.behind or (claim.skip_reason == enums.SkipReason.PAUSED and bool(execution_id)))
    return None


def _given_up(attempt: _Attempt) -> Outcome:
    """A retry that reached a paused job: it ends with its own failure, not retried."""
    job, slot, claim = attempt.job, attempt.slot, attempt.claim
    assert claim.execution_id is not None
    gave_up = outcomes.given_up(job, job_id=jobs.job_id(job), execution_id=claim.execution_id,
                                note="not retried: the job is paused")
    if gave_up is None:
        return Outcome(job=job.name, slot=slot, status=claims.DUPLICATE, execution_id=claim.execution_id,
                       message="CHANGED")
    logger.warning("%s %s %s: its job is paused, so it is not retried: %s", job.name, slots.iso(slot),
                   gave_up.status, gave_up.message[:200], extra=attempt.extra)
    return Outcome(job=job.name, slot=slot, status=gave_up.status, execution_id=claim.execution_id,
                   message=gave_up.message, error_code=gave_up.error_code, frees_job=True)


def _call(attempt: _Attempt, call: Callable[[Run], Any]) -> _Called:
    """The body, called with its ``Run`` while the lease thread renews the lease; what it returned or
    raised, as a status, message, error code, traceback and storable result."""
    job, slot, claim, extra = attempt.job, attempt.slot, attempt.claim, attempt.extra
    assert claim.execution_id is not None and claim.fence is not None
    cancelled = threading.Event()
    # The values on the row the claim read (a retry, a redelivery, a resend: the same row, the same
    # values), as the annotated types; a value that no longer fits fails the run below, uncalled.
    unfit: exceptions.InvalidParams | None = None
    try:
        # A tracked periodic task's row holds the arguments its task is called with, as they are.
        values = dict(claim.params or {}) if job.tracked else params.resolve(
            job.parameters, claim.params, job=job.name, tz=job.tzinfo)
    except exceptions.InvalidParams as wrong:
        values, unfit = {}, wrong
    run = Run(
        job=job.name, code=job.code, slot=slot, execution_date=attempt.execution_date,
        attempt=claim.retry_count + 1, fence=claim.fence, key=slots.run_key(job.code, slot),
        execution_id=claim.execution_id, run_number=claim.run_number, trigger=attempt.trigger,
        logger=logging.LoggerAdapter(logging.getLogger(f"cron_celery.jobs.{job.name}"), extra),
        cancelled=cancelled, params=types.MappingProxyType(values), previous=claim.previous,
        last_success=claim.last_success)
    outcomes.started(job, claim.execution_id, slot, claim.retry_count + 1)
    if not callers.in_test_transaction():  # there, no other session sees the row: nothing to renew, nobody to take it
        leases.track(claim.execution_id, claim.fence, attempt.lease_seconds, cancelled, extra,
                     attempt.job_lock if attempt.lock_held else None)
    if shutdown.requested.is_set():
        cancelled.set()
    error: BaseException | None = None
    trace = ""
    held = limits.NOT_HELD
    try:
        began = time.monotonic()
        try:
            if unfit is not None:
                raise unfit
            value = call(run)
        finally:
            runtime = time.monotonic() - began
            # The body is over: from here until the outcome is written the soft time limit is
            # held off (landing in the write it would roll it back, and the body would run again).
            try:
                held = limits.hold()
            finally:
                leases.untrack(claim.execution_id)
    except BaseException as exc:  # recorded, then re-raised by the caller
        error = exc
        status, message, code, trace = describe_exception(retries.cause(exc))
        stored = None
    else:
        status, message, code, stored = interpret_plain(value) if job.tracked else interpret(value)
    return _Called(run=run, status=status, message=message, code=code, trace=trace, stored=stored, error=error,
                   runtime=runtime, held=held)


def _write(attempt: _Attempt, called: _Called, countdown: float | None) -> str | bool:
    """The fenced final write (or the retry's), reconnecting through a database that went away; an
    outcome PostgreSQL refuses for its data is written as ``RESULT_NOT_STORABLE`` instead (``called``
    says so after). The job's lock and the soft time limit are released only now. What the write
    returned: the status written, or False when the fence or the status no longer allowed it."""
    job, slot, claim, extra = attempt.job, attempt.slot, attempt.claim, attempt.extra
    assert claim.execution_id is not None and claim.fence is not None

    def record(runtime: float | None) -> str | bool:
        return _record(job, claim, slot, countdown=countdown, status=called.status, message=called.message,
                       error_code=called.code, traceback=called.trace, result=called.stored, runtime=runtime)

    try:
        try:
            written, retried = reconnect.reconnecting(lambda: record(called.runtime), "recording the outcome", extra)
        except (DataError, ValueError) as problem:  # the data, not the connection: record what can be
            logger.exception("the outcome of execution %s (%s) cannot be stored; recording %s instead",
                             claim.execution_id, called.status, UNSTORABLE, extra=extra)
            called.message = clean_text(f"The outcome ({called.status}: {called.message[:200]}) could not be stored: "
                                    f"{type(problem).__name__}: {str(problem)[:500]}", 1000)
            called.status, called.code, called.trace, called.stored = S.FAILED, UNSTORABLE, "", None
            written, retried = reconnect.reconnecting(lambda: record(None), "recording the outcome", extra)
        if retried and written is False:
            # A commit whose answer was lost with the connection may have written it already.
            written = finishes.written_by(claim.execution_id, claim.fence, called.status,
                                          retrying=countdown is not None)
            if written is True:
                outcomes.written(job, jobs.job_id(job), claim.execution_id, slot, fence=claim.fence,
                                 status=called.status, error_code=called.code, message=called.message)
    except DatabaseError:
        logger.exception("could not record the outcome of execution %s", claim.execution_id, extra=extra)
        raise
    finally:
        # Released only after the outcome is written, so nobody starts before it is.
        if attempt.job_lock is not None:
            attempt.job_lock.release()
        limits.release(called.held, extra)
    return written


def _reported(attempt: _Attempt, called: _Called, written: str | bool, countdown: float | None) -> Outcome:
    """What came of the attempt, logged and returned: retrying, revoked while it ran, fenced (another
    attempt holds the slot now), or the outcome written."""
    job, slot, claim, extra = attempt.job, attempt.slot, attempt.claim, attempt.extra
    assert claim.execution_id is not None
    status, message, code = called.status, called.message, called.code
    if written == S.RETRYING:
        assert countdown is not None
        logger.warning("%s %s attempt %d %s, retrying in %.1f s: %s", job.name, slots.iso(slot),
                       called.run.attempt, status, countdown, message[:200], extra=extra)
        return Outcome(job=job.name, slot=slot, status=S.RETRYING, execution_id=claim.execution_id,
                       run_number=claim.run_number, message=message, error_code=code,
                       exc=called.error, countdown=countdown, frees_job=True)
    if not written and executions.status_of(claim.execution_id) == S.REVOKED:
        logger.warning("execution %s was revoked while it ran: its outcome (%s) is not recorded",
                       claim.execution_id, status, extra=extra)
        status = S.REVOKED
    elif not written:
        finishes.count_fenced(jobs.job_id(job))
        logger.warning("execution %s was fenced: its outcome (%s) is not recorded",
                       claim.execution_id, status, extra=extra)
        status = FENCED
    else:
        level = logging.INFO if status == S.SUCCEEDED else logging.WARNING
        if logger.isEnabledFor(level):  # most workers log successes at WARNING: nothing to build
            logger.log(level, "%s %s %s: %s", job.name, extra["slot"], status, message[:200],
                       extra={**extra, OUTCOME: True})
    return Outcome(job=job.name, slot=slot, status=status, execution_id=claim.execution_id,
                   run_number=claim.run_number, message=message, error_code=code,
                   result=called.stored, exc=called.error, frees_job=True)
