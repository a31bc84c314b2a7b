"""The run's claim: whether this call of a slot runs, is skipped, waits, or is a duplicate.

Every decision about one job is serialised by locking that job's ``CronJob`` row (a row
that always exists), never rows that may not exist. The same statement that takes the
lock also advances the job's fence, so each claim gets a number no earlier claim had;
every later write about the run carries it (the heartbeat here, the final write in
``finishes``), and a write with a stale fence changes nothing.

Statements per run (see docs/benchmarks.md): ``begin`` first tries one autocommit query that claims
a run nothing stands in the way of (``quick_claims``); otherwise three statements in one transaction
(lock + fence, read the slot's state, insert or claim) decide. The final write (``finishes.finish``)
is one autocommit statement, ``heartbeat`` one every third of the lease; all but the full claim's
are prepared once per database session (``statements``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from django.db import connection, transaction

from cron_celery import enums
from cron_celery.decisions import executions, groups, quick_claims, room, slot_state, supersede, waiting
from cron_celery.decisions import previous as previous_runs
from cron_celery.declaring import registry

S = enums.Status
JOB = executions.JOB
EXE = executions.EXE


#: Outcome of ``begin`` besides claiming or skipping: the execution was already
#: finished or is running elsewhere (a broker redelivery); nothing was written.
DUPLICATE = "DUPLICATE"

#: ``Claim.status_seen`` of a duplicate whose execution has no attempt left to take over.
CAPPED = "CAPPED"

#: Outcome of ``begin``: the execution waits for the job's live run, or for the paused job to be
#: resumed (``waiting.mark``); its message is done with, and the execution is sent again then.
WAITING = "WAITING"

#: Outcome of ``begin``: an execution that already had an attempt (RETRYING, or RUNNING with
#: an expired lease) reached a paused job; the caller ends it with its failure (``give_up``).
GIVE_UP = "GIVE_UP"

#: Triggers whose executions wait for a live run of their overlap-``skip`` job instead of
#: being skipped: slots a person (a one-off run recorded ahead too), the catch-up policy or an
#: upstream job asked for. Only a regular beat slot (``BEAT``) that meets a live run is skipped;
#: and not for ``rate_limited`` jobs, whose extra calls are skipped. The same executions that reach
#: a paused job wait for it to be resumed (a pause does not use them up); see ``waits_its_turn``.
BUFFERED_TRIGGERS = frozenset({enums.Trigger.BACKFILL, enums.Trigger.CATCH_UP, enums.Trigger.ENQUEUE,
                               enums.Trigger.ADMIN, enums.Trigger.UPSTREAM, enums.Trigger.ONE_OFF})

#: The patterns whose slot is checked: a slot runs once (``standard``), or until it succeeds.
SLOT_CHECKED = supersede.SLOT_CHECKED

def waits_its_turn(job: registry.Job, state: dict[str, Any]) -> bool:
    """Whether this execution, once its row exists, waits rather than being skipped when it meets a
    live run of its job (or, unforced, a paused job): a run somebody asked for (``BUFFERED_TRIGGERS``),
    or the last slot of a django-celery-beat ``one_off`` task — the one beat slot sent with ``force``
    (``dispatch.dispatch_many``), which must run once although the task is disabled with it. Never
    for a ``rate_limited`` job."""
    asked = state["own_trigger"] in BUFFERED_TRIGGERS or bool(state["own_force"])
    return asked and job.pattern != enums.ExecutionPattern.RATE_LIMITED


class JobRowMissing(LookupError):
    """The job's row is gone (a flushed database); ``runs`` recreates it and retries."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Claim:
    """What ``begin`` decided for one call."""

    outcome: str  # S.RUNNING (claimed), S.SKIPPED, DUPLICATE, WAITING or GIVE_UP
    execution_id: int | None
    run_number: int = 0
    fence: int | None = None
    retry_count: int = 0
    skip_reason: str = ""
    status_seen: str = ""  # for DUPLICATE, WAITING, GIVE_UP: the status the execution already had
    blocker: int | None = None  # for WAITING: the live execution it waits for
    #: Skipped or waiting behind older runs of the job that wait for room it has: the caller sends the oldest
    behind: bool = False
    message: str = ""  # a skip: what its row says
    params: dict[str, Any] | None = None  # claimed: the parameter values on the row (what the body runs with)
    previous: previous_runs.PreviousRun | None = None  # claimed: the job's run before it, by slot order
    last_success: previous_runs.PreviousRun | None = None  # claimed: the job's success before it

    @property
    def claimed(self) -> bool:
        return self.outcome == S.RUNNING


def _decide(
    job: registry.Job, state: dict[str, Any], *, paused: bool, force: bool, rerun: bool, attempted: bool = False
) -> str:
    """The skip reason for this call, or '' to run. Pure: tested branch by branch.

    ``attempted``: the execution already had an attempt (a retry, or a takeover); it owns its
    slot, so the pattern's slot check does not apply again — only the pause and the overlap do.
    """
    if paused and not force:
        return enums.SkipReason.PAUSED
    if not (force or rerun or attempted):
        if job.pattern in SLOT_CHECKED:
            if state["live"]:
                return enums.SkipReason.ALREADY_RUNNING
            if state["succeeded"]:
                return enums.SkipReason.ALREADY_RAN
        if job.pattern == enums.ExecutionPattern.STANDARD and (
            state["failed"] or state["stale"]
        ):
            return enums.SkipReason.ALREADY_RAN
    if job.exclusive and state["job_live"]:
        return enums.SkipReason.OVERLAP
    if room.job_full(job, state) or state.get("group_full"):
        return enums.SkipReason.CONCURRENCY
    if room.behind(job, state):  # older runs of the job wait for its room: they have it first
        return enums.SkipReason.OVERLAP if job.exclusive else enums.SkipReason.CONCURRENCY
    return ""


def _needs_state(job: registry.Job, execution_id: int | None, force: bool, rerun: bool) -> bool:
    if execution_id is not None:
        return True
    if job.limit is not None or job.concurrency_group:
        return True
    return job.pattern in SLOT_CHECKED and not (force or rerun)


def begin(
    *,
    job: registry.Job,
    job_id: int,
    slot: dt.datetime,
    execution_date: dt.date,
    trigger: str,
    execution_id: int | None = None,
    force: bool = False,
    rerun: bool = False,
    celery_task_id: str = "",
    worker: str = "",
    pid: int | None = None,
    lease_seconds: int = 60,
    lock_busy: bool = False,
    given: dict[str, Any] | None = None,
    params_given: bool = False,
) -> Claim:
    """Claim the slot for this worker, record a skip, or recognise a duplicate delivery.

    With ``execution_id`` (a message from beat or ``--enqueue``) the existing row is
    claimed, and runs with the parameter values on it; without it a new execution (the next
    ``run_number``) is inserted, with ``given`` over the job's scheduled values. A run with
    parameters a person gave (``params_given``, or such a row) is its own execution: the
    pattern's slot check passes it by (as a re-run), and other runs' slot checks ignore it; the
    pause, the overlap and the limits apply to it as to any run.
    ``lock_busy`` (another server holds the job's Redis lock) does not decide on its own:
    a lock left behind by a killed worker must not block the next run, so the overlap
    check reads the database (a live lease of another execution), and reports such a skip
    as ``LOCK_UNAVAILABLE``.
    """
    checks = None if lock_busy else _quick_checks(job, execution_id, force, rerun or params_given)
    quick = None if checks is None else _claim_quickly(
        job, job_id, slot, execution_date, trigger, execution_id, checks, forced=force or rerun,
        celery_task_id=celery_task_id, worker=worker, pid=pid, lease_seconds=lease_seconds, given=given,
        params_given=params_given)
    if quick is not None:
        return quick
    with transaction.atomic(), connection.cursor() as cursor:
        # 1. Lock the job's row and take the next fence in one statement.
        cursor.execute(
            f"UPDATE {JOB} SET fence = fence + 1 WHERE id = %s RETURNING fence, paused, max_retries, params",
            [job_id],
        )
        locked = cursor.fetchone()
        if locked is None:
            raise JobRowMissing(job.name)
        fence, paused, max_retries, scheduled = locked[0], locked[1], locked[2], executions.loaded(locked[3])
        state = slot_state.nothing_seen()
        # 2. A job of a concurrency group takes the group's lock next (always after its row's).
        group_full = groups.full(cursor, job.concurrency_group, job_id, execution_id or 0) \
            if job.concurrency_group else None
        if lock_busy or _needs_state(job, execution_id, force, rerun or params_given):
            state = slot_state.read(cursor, job_id, slot, execution_id or 0, paused=paused)
        state["group_full"] = group_full
        if execution_id is not None:
            seen = _delivered_already(execution_id, state, max_retries)
            if seen is not None:
                return seen
            # A run sent with --force/--rerun keeps that choice when its message is sent again.
            rerun = rerun or bool(state["own_forced"])
            force = force or bool(state["own_force"])
        held = _held_back(cursor, job, job_id, slot, execution_date, trigger, execution_id, state, paused=paused,
                          force=force, rerun=rerun, lock_busy=lock_busy, celery_task_id=celery_task_id,
                          worker=worker, pid=pid, given=given, params_given=params_given)
        if held is not None:
            return held
        supersede.stale_runs(cursor, job, job_id, state, fence)  # a stale run this one replaces
        if execution_id is not None:
            return _take_row(cursor, execution_id, fence, lease_seconds, worker, pid, celery_task_id)
        new_id, run_number = executions.insert(
            cursor, job, job_id, slot, execution_date, trigger,
            status=S.RUNNING, forced=force or rerun, fence=fence, lease_seconds=lease_seconds,
            celery_task_id=celery_task_id, worker=worker, pid=pid, given=given, params_given=params_given,
        )
        # What the insert stored (``executions.params_sql``), from the job's row locked above.
        stored = {**(scheduled or {}), **(given or {})}
        before, success = previous_runs.read(cursor, job_id, slot, run_number)
        return Claim(outcome=S.RUNNING, execution_id=new_id, run_number=run_number, fence=fence,
                     params=stored or None, previous=before, last_success=success)


def _quick_checks(job: registry.Job, execution_id: int | None, force: bool, rerun: bool) -> tuple[bool, bool] | None:
    """The checks a quick claim makes (``quick_claims``): (the slot check, the overlap check); None when
    only the full path may decide (a limit, a group, ``rate_limited``, an own execution forced or re-run)."""
    if job.max_concurrency is not None or job.concurrency_group or job.pattern == enums.ExecutionPattern.RATE_LIMITED:
        return None
    if execution_id is not None and (force or rerun):
        return None
    return job.pattern in SLOT_CHECKED and not (force or rerun), job.exclusive


def _claim_quickly(job: registry.Job, job_id: int, slot: dt.datetime, execution_date: dt.date, trigger: str,
                   execution_id: int | None, checks: tuple[bool, bool], *, forced: bool, celery_task_id: str,
                   worker: str, pid: int | None, lease_seconds: int, given: dict[str, Any] | None,
                   params_given: bool) -> Claim | None:
    """The message's own execution (``execution_id``) or a new one, claimed in one round trip; None:
    the full path decides."""
    if execution_id is not None:
        return _claim_pending(job_id=job_id, execution_id=execution_id, slot=slot, celery_task_id=celery_task_id,
                              worker=worker, pid=pid, lease_seconds=lease_seconds, checks=checks)
    return _claim_new(job=job, job_id=job_id, slot=slot, execution_date=execution_date, trigger=trigger,
                      forced=forced, celery_task_id=celery_task_id, worker=worker, pid=pid,
                      lease_seconds=lease_seconds, given=given, params_given=params_given, checks=checks)


def _claim_new(
    *,
    job: registry.Job,
    job_id: int,
    slot: dt.datetime,
    execution_date: dt.date,
    trigger: str,
    forced: bool,
    celery_task_id: str,
    worker: str,
    pid: int | None,
    lease_seconds: int,
    given: dict[str, Any] | None = None,
    params_given: bool = False,
    checks: tuple[bool, bool] = (False, False),
) -> Claim | None:
    """A new execution claimed quickly (``quick_claims.new``); None: the full path decides."""
    row = quick_claims.new(job_id=job_id, code=job.code, name=job.name, slot=slot, execution_date=execution_date,
                           trigger=trigger, forced=forced, celery_task_id=celery_task_id, worker=worker, pid=pid,
                           lease_seconds=lease_seconds, given=given, params_given=params_given,
                           slot_checked=checks[0], exclusive=checks[1])
    return _claimed(row)


def _claim_pending(*, job_id: int, execution_id: int, slot: dt.datetime, celery_task_id: str, worker: str,
                   pid: int | None, lease_seconds: int, checks: tuple[bool, bool]) -> Claim | None:
    """The message's PENDING execution claimed quickly (``quick_claims.pending``); None: full path."""
    row = quick_claims.pending(job_id=job_id, execution_id=execution_id, slot=slot, celery_task_id=celery_task_id,
                               worker=worker, pid=pid, lease_seconds=lease_seconds, slot_checked=checks[0],
                               exclusive=checks[1])
    return _claimed(row)


def _claimed(row: quick_claims.Claimed | None) -> Claim | None:
    return None if row is None else Claim(outcome=S.RUNNING, execution_id=row[0], run_number=row[1], fence=row[2],
                                          params=row[3], previous=row[4], last_success=row[5])


def _record_skip(
    cursor: Any,
    job: registry.Job,
    job_id: int,
    slot: dt.datetime,
    execution_date: dt.date,
    trigger: str,
    execution_id: int | None,
    reason: str,
    celery_task_id: str,
    worker: str,
    pid: int | None,
    *,
    message: str,
    given: dict[str, Any] | None = None,
    params_given: bool = False,
) -> Claim:
    if execution_id is not None:
        cursor.execute(
            f"""
            UPDATE {EXE} SET status = 'SKIPPED', skip_reason = %s, message = %s,
                completed = true, ended = now(), worker = %s, pid = %s
            WHERE id = %s RETURNING run_number
            """,
            [reason, message, worker, pid, execution_id],
        )
        run_number = cursor.fetchone()[0]
    else:
        execution_id, run_number = executions.insert(
            cursor, job, job_id, slot, execution_date, trigger, status=S.SKIPPED,
            skip_reason=reason, message=message, celery_task_id=celery_task_id,
            worker=worker, pid=pid, given=given, params_given=params_given,
        )
    return Claim(outcome=S.SKIPPED, execution_id=execution_id, run_number=run_number,
                 skip_reason=reason, message=message)


def _delivered_already(execution_id: int, state: dict[str, Any], max_retries: int) -> Claim | None:
    """A delivery of an execution that has ended, runs elsewhere, or is gone: a duplicate that does
    nothing (None: the row may be claimed)."""
    own = state["own_status"]
    if own is None:
        return Claim(outcome=DUPLICATE, execution_id=execution_id, status_seen="MISSING")
    if own in S.terminal() or (own == S.RUNNING and state["own_live"]):
        return Claim(outcome=DUPLICATE, execution_id=execution_id, status_seen=own)
    if own == S.RUNNING and (state["own_retries"] or 0) >= max_retries:
        # Its worker vanished on the last allowed attempt: taking it over would be one
        # attempt too many (a job that kills its whole worker would loop). The caller
        # records it LOST instead.
        return Claim(outcome=DUPLICATE, execution_id=execution_id, status_seen=CAPPED)
    return None


def _held_back(cursor: Any, job: registry.Job, job_id: int, slot: dt.datetime, execution_date: dt.date,
               trigger: str, execution_id: int | None, state: dict[str, Any], *, paused: bool, force: bool,
               rerun: bool, lock_busy: bool, celery_task_id: str, worker: str, pid: int | None,
               given: dict[str, Any] | None, params_given: bool) -> Claim | None:
    """What the pattern, the pause, the overlap and the limits decide for a run that may not start
    now: a retry given up on a paused job, a wait for the job's live run (or its resume), or a skip
    recorded. None: it runs."""
    own = state["own_status"]
    attempted = own in (S.RETRYING, S.RUNNING)
    # A run with parameters a person gave passes the slot check by, as a re-run does.
    own_params = params_given or bool(state.get("own_params_given"))
    reason = _decide(job, state, paused=paused, force=force, rerun=rerun or own_params, attempted=attempted)
    if lock_busy and reason == enums.SkipReason.OVERLAP:
        reason = enums.SkipReason.LOCK_UNAVAILABLE
    if reason and attempted and reason == enums.SkipReason.PAUSED:
        # Never turn a failed attempt into a skip: the caller ends it with its failure.
        return Claim(outcome=GIVE_UP, execution_id=execution_id, status_seen=own, skip_reason=reason)
    overlapping = reason in (enums.SkipReason.OVERLAP, enums.SkipReason.LOCK_UNAVAILABLE,
                             enums.SkipReason.CONCURRENCY)
    buffered = waits_its_turn(job, state)
    if reason == enums.SkipReason.PAUSED and execution_id is not None and own == S.PENDING and buffered:
        # Asked for: the pause holds it (unsent) until the job is resumed; it does not use it up.
        waiting.mark(cursor, execution_id, None, paused=True)
        return Claim(outcome=WAITING, execution_id=execution_id, status_seen=own, skip_reason=reason)
    behind = overlapping and bool(room.waits_for(job, state, reason).get("ahead"))
    if overlapping and execution_id is not None and (attempted or buffered or room.buffers_one(job, state)):
        if own != S.RUNNING:  # an expired RUNNING attempt is the reconciler's to end first
            waiting.mark(cursor, execution_id, state["blocker"], **room.waits_for(job, state, reason))
        return Claim(outcome=WAITING, execution_id=execution_id, status_seen=own, skip_reason=reason,
                     blocker=state["blocker"], behind=behind)
    if reason:
        return dataclasses.replace(_record_skip(
            cursor, job, job_id, slot, execution_date, trigger, execution_id, reason,
            celery_task_id, worker, pid, message=room.skip_message(job, state, reason), given=given,
            params_given=params_given,
        ), behind=behind)
    return None


def _take_row(cursor: Any, execution_id: int, fence: int, lease_seconds: int, worker: str, pid: int | None,
              celery_task_id: str) -> Claim:
    """Claim the execution's existing row (PENDING, RETRYING, or RUNNING with its lease run out)."""
    cursor.execute(
        f"""
        UPDATE {EXE} SET status = 'RUNNING', fence = %(fence)s,
            lease_until = now() + make_interval(secs => %(lease)s),
            started = coalesce(started, clock_timestamp()), ended = NULL, waiting_since = NULL,
            retry_count = retry_count + (CASE WHEN status = 'RUNNING' THEN 1 ELSE 0 END),
            worker = %(worker)s, pid = %(pid)s,
            attempts = CASE WHEN status = 'PENDING' THEN attempts
                ELSE {executions.TAKEN_OVER} || {executions.RECLAIMED} END,
            celery_task_id = coalesce(nullif(%(task_id)s, ''), celery_task_id)
        WHERE id = %(id)s AND (status IN ('PENDING', 'RETRYING')
              OR (status = 'RUNNING' AND lease_until <= now()))
        RETURNING run_number, retry_count, params, {previous_runs.of_row(EXE)}
        """,
        {"fence": fence, "lease": lease_seconds, "worker": worker, "pid": pid,
         "task_id": celery_task_id, "id": execution_id},
    )
    row = cursor.fetchone()
    if row is None:  # changed under us despite the job lock: treat as delivered
        return Claim(outcome=DUPLICATE, execution_id=execution_id, status_seen="CHANGED")
    return Claim(outcome=S.RUNNING, execution_id=execution_id, run_number=row[0],
                 fence=fence, retry_count=row[1], params=executions.loaded(row[2]),
                 previous=previous_runs.loaded(row[3]), last_success=previous_runs.loaded(row[4]))
