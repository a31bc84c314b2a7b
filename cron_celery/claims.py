"""The SQL that decides whether a slot runs: claim, heartbeat and finish, with fences.

Every decision about one job is serialised by locking that job's ``CronJob`` row (a row
that always exists), never rows that may not exist. The same statement that takes the
lock also advances the job's fence, so each claim gets a number no earlier claim had;
every later write about the run carries it, and a write with a stale fence changes
nothing.

Statements per run (see docs/benchmarks.md): ``begin`` is one autocommit statement when
the job needs no slot or overlap check (pattern ``always`` with overlap ``allow``), and
otherwise three statements in one transaction (lock + fence, read the slot's state,
insert or claim); ``finish`` is one autocommit statement; ``heartbeat`` is one statement
every third of the lease. Every statement that changes an execution's status or fence
locks the job's row first, so decisions about one job are serialised and no two of them
can deadlock.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import uuid
from typing import Any

from django.db import IntegrityError, connection, transaction

from cron_celery import models, registry, waiting

S = models.Status
JOB = models.CronJob._meta.db_table
EXE = models.CronExecution._meta.db_table

#: Outcome of ``begin`` besides claiming or skipping: the execution was already
#: finished or is running elsewhere (a broker redelivery); nothing was written.
DUPLICATE = "DUPLICATE"
#: ``Claim.status_seen`` of a duplicate whose execution has no attempt left to take over.
CAPPED = "CAPPED"
#: Outcome of ``begin``: the execution waits for the job's live run (``waiting.mark``); its
#: message is done with, and the execution is sent again when that run ends.
WAITING = "WAITING"
#: Outcome of ``begin``: an execution that already had an attempt (RETRYING, or RUNNING with
#: an expired lease) reached a paused job; the caller ends it with its failure (``give_up``).
GIVE_UP = "GIVE_UP"
#: Triggers whose executions wait for a live run of their overlap-``skip`` job instead of
#: being skipped: slots a person or the catch-up policy asked for. Only a regular beat slot
#: (``BEAT``) that meets a live run is skipped.
BUFFERED_TRIGGERS = frozenset({models.Trigger.BACKFILL, models.Trigger.CATCH_UP, models.Trigger.ENQUEUE,
                               models.Trigger.ADMIN})  # not for ``rate_limited`` jobs, whose extra calls are skipped


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

    @property
    def claimed(self) -> bool:
        return self.outcome == S.RUNNING


def ensure_job(job: registry.Job) -> int:
    """Create or refresh the job's row from its declaration and return its id.

    The row is keyed by the job's code (its stable id): renaming a job keeps its history.
    A stale row that still holds the name under another code is renamed out of the way.
    """
    params: list[str | int | None] = [job.name, job.code, job.task_name, job.pattern, job.overlap, job.timezone,
                                job.description, job.catch_up, job.max_retries, job.alert_after, job.alert_repeat]
    upsert = f"""
        INSERT INTO {JOB} (name, code, task, pattern, overlap, timezone, description, catch_up,
                           max_retries, alert_after, alert_repeat, paused, fence, consecutive_failures,
                           last_status, created_at, updated_at)
        VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, false, 0, 0, '', now(), now())
        ON CONFLICT (code) DO UPDATE SET
            name = EXCLUDED.name, task = EXCLUDED.task, pattern = EXCLUDED.pattern,
            overlap = EXCLUDED.overlap, timezone = EXCLUDED.timezone,
            description = EXCLUDED.description, catch_up = EXCLUDED.catch_up,
            max_retries = EXCLUDED.max_retries, alert_after = EXCLUDED.alert_after,
            alert_repeat = EXCLUDED.alert_repeat, updated_at = now()
        WHERE ({JOB}.name, {JOB}.task, {JOB}.pattern, {JOB}.overlap, {JOB}.timezone,
               {JOB}.description, {JOB}.catch_up, {JOB}.max_retries, {JOB}.alert_after, {JOB}.alert_repeat)
          IS DISTINCT FROM (EXCLUDED.name, EXCLUDED.task, EXCLUDED.pattern,
                            EXCLUDED.overlap, EXCLUDED.timezone, EXCLUDED.description,
                            EXCLUDED.catch_up, EXCLUDED.max_retries, EXCLUDED.alert_after,
                            EXCLUDED.alert_repeat)
        RETURNING id
        """
    for attempt in range(3):
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                if attempt:
                    cursor.execute(
                        f"UPDATE {JOB} SET name = left(name, 80) || '-was-' || code"
                        " WHERE name = %s AND code <> %s",
                        [job.name, job.code],
                    )
                cursor.execute(upsert, params)
                row = cursor.fetchone()
                if row is None:  # unchanged: ON CONFLICT ... WHERE false returns nothing
                    cursor.execute(f"SELECT id FROM {JOB} WHERE code = %s", [job.code])
                    row = cursor.fetchone()
            assert row is not None
            return int(row[0])
        except IntegrityError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def ensure_jobs(jobs: list[registry.Job]) -> dict[str, int]:
    """``ensure_job`` for many jobs in one statement; returns row ids by code.

    A name held by a stale row under another code (a renamed job) makes the statement
    fail; then each job goes through ``ensure_job``, which moves the stale name aside.
    """
    if not jobs:
        return {}
    fields = ("name", "code", "task_name", "pattern", "overlap", "timezone", "description", "catch_up")
    columns: list[list[Any]] = [[str(getattr(job, field)) for job in jobs] for field in fields]
    columns.append([job.max_retries for job in jobs])
    columns.append([job.alert_after for job in jobs])
    columns.append([job.alert_repeat for job in jobs])
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                f"""
                INSERT INTO {JOB} AS job (name, code, task, pattern, overlap, timezone, description, catch_up,
                                          max_retries, alert_after, alert_repeat, paused, fence,
                                          consecutive_failures, last_status, created_at, updated_at)
                SELECT d.*, false, 0, 0, '', now(), now()
                FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::text[],
                            %s::text[], %s::int[], %s::int[], %s::int[]) AS d
                ON CONFLICT (code) DO UPDATE SET
                    name = EXCLUDED.name, task = EXCLUDED.task, pattern = EXCLUDED.pattern,
                    overlap = EXCLUDED.overlap, timezone = EXCLUDED.timezone,
                    description = EXCLUDED.description, catch_up = EXCLUDED.catch_up,
                    max_retries = EXCLUDED.max_retries, alert_after = EXCLUDED.alert_after,
                    alert_repeat = EXCLUDED.alert_repeat, updated_at = now()
                WHERE (job.name, job.task, job.pattern, job.overlap, job.timezone, job.description, job.catch_up,
                       job.max_retries, job.alert_after, job.alert_repeat)
                  IS DISTINCT FROM (EXCLUDED.name, EXCLUDED.task, EXCLUDED.pattern, EXCLUDED.overlap,
                                    EXCLUDED.timezone, EXCLUDED.description, EXCLUDED.catch_up,
                                    EXCLUDED.max_retries, EXCLUDED.alert_after, EXCLUDED.alert_repeat)
                """,
                columns,
            )
            cursor.execute(f"SELECT code, id FROM {JOB} WHERE code = ANY(%s)", [columns[1]])
            return {code: int(job_id) for code, job_id in cursor.fetchall()}
    except IntegrityError:
        return {job.code: ensure_job(job) for job in jobs}


def _slot_state(cursor: Any, job_id: int, slot: dt.datetime, me: int) -> dict[str, Any]:
    """What the other executions of this slot and job are doing (under the job lock)."""
    cursor.execute(
        f"""
        SELECT
          bool_or(id <> %(me)s AND slot = %(slot)s AND status = 'SUCCEEDED'),
          bool_or(id <> %(me)s AND slot = %(slot)s AND status IN ('FAILED', 'TIMED_OUT', 'LOST', 'REVOKED')),
          bool_or(id <> %(me)s AND slot = %(slot)s AND (status IN ('PENDING', 'RETRYING')
                  OR (status = 'RUNNING' AND lease_until > now()))),
          bool_or(id <> %(me)s AND slot = %(slot)s AND status = 'RUNNING'
                  AND lease_until <= now()),
          bool_or(id <> %(me)s AND status = 'RUNNING' AND lease_until > now()),
          max(status) FILTER (WHERE id = %(me)s),
          bool_or(id = %(me)s AND lease_until > now()),
          bool_or(id = %(me)s AND forced),
          max(retry_count) FILTER (WHERE id = %(me)s),
          max(trigger) FILTER (WHERE id = %(me)s),
          bool_or(id = %(me)s AND force),
          max(id) FILTER (WHERE id <> %(me)s AND status = 'RUNNING' AND lease_until > now()),
          bool_or(id <> %(me)s AND status = 'RUNNING' AND lease_until <= now())
        FROM {EXE}
        WHERE job_id = %(job)s AND (slot = %(slot)s OR status = 'RUNNING' OR id = %(me)s)
        """,
        {"me": me, "slot": slot, "job": job_id},
    )
    row = cursor.fetchone()
    keys = ("succeeded", "failed", "live", "stale", "job_live", "own_status", "own_live", "own_forced",
            "own_retries", "own_trigger", "own_force", "blocker", "job_stale")
    kept = ("own_status", "own_retries", "own_trigger", "blocker")
    return {key: row[i] if key in kept else (row[i] or False) for i, key in enumerate(keys)}


def _decide(
    job: registry.Job, state: dict[str, Any], *, paused: bool, force: bool, rerun: bool, attempted: bool = False
) -> str:
    """The skip reason for this call, or '' to run. Pure: tested branch by branch.

    ``attempted``: the execution already had an attempt (a retry, or a takeover); it owns its
    slot, so the pattern's slot check does not apply again — only the pause and the overlap do.
    """
    if paused and not force:
        return models.SkipReason.PAUSED
    if not (force or rerun or attempted):
        if job.pattern in (models.ExecutionPattern.STANDARD,
                           models.ExecutionPattern.RERUN_ON_FAILURE):
            if state["live"]:
                return models.SkipReason.ALREADY_RUNNING
            if state["succeeded"]:
                return models.SkipReason.ALREADY_RAN
        if job.pattern == models.ExecutionPattern.STANDARD and (
            state["failed"] or state["stale"]
        ):
            return models.SkipReason.ALREADY_RAN
    if _exclusive(job) and state["job_live"]:
        return models.SkipReason.OVERLAP
    return ""


def _exclusive(job: registry.Job) -> bool:
    """Never two runs of the job at once (overlap ``skip``, or the ``rate_limited`` pattern)."""
    return job.overlap == models.Overlap.SKIP or job.pattern == models.ExecutionPattern.RATE_LIMITED


def _supersede(cursor: Any, job_id: int, me: int, fence: int) -> None:
    """This claim runs an exclusive job while another of its runs is RUNNING with an expired
    lease (its worker froze, or lost the database, and did not renew): that run no longer owns
    the job. It takes this claim's fence, so its heartbeat and final write, which carry the old
    one, are refused (FENCED, its run told to stop), and two runs of the job are never both
    recorded. Its row stays RUNNING with the expired lease: the reconciler ends it
    (``LEASE_EXPIRED``, retried by the job's policy) as it would have without this claim.

    Every other RUNNING row of the job is superseded, not only those whose lease is still
    expired now: under the job's lock, with no live run seen, each was stale when the claim
    looked, and a heartbeat that renewed one since (it takes no job lock) must not leave the
    job with two live runs: its lease is ended too."""
    # Its history keeps the fence it ran under: a first attempt (no history yet) gets its entry now.
    cursor.execute(
        f"""
        UPDATE {EXE} SET fence = %(fence)s, lease_until = least(lease_until, now()),
            attempts = CASE WHEN jsonb_array_length(attempts) > 0 THEN attempts
                ELSE jsonb_build_array(jsonb_build_object('attempt', retry_count + 1, 'started', started,
                                                          'worker', worker, 'pid', pid, 'fence', fence)) END
        WHERE job_id = %(job)s AND id <> %(me)s AND status = 'RUNNING' AND fence < %(fence)s
        """,
        {"fence": fence, "job": job_id, "me": me},
    )


def _needs_state(job: registry.Job, execution_id: int | None, force: bool, rerun: bool) -> bool:
    if execution_id is not None:
        return True
    if _exclusive(job):
        return True
    slot_checked = job.pattern in (
        models.ExecutionPattern.STANDARD, models.ExecutionPattern.RERUN_ON_FAILURE
    )
    return slot_checked and not (force or rerun)


SKIP_MESSAGES: dict[str, str] = {
    models.SkipReason.PAUSED: "Skipped: the job is paused.",
    models.SkipReason.ALREADY_RAN: "Skipped: this slot already ran.",
    models.SkipReason.ALREADY_RUNNING: "Skipped: this slot is already running or queued.",
    models.SkipReason.OVERLAP: "Skipped: another execution of this job is running.",
    models.SkipReason.LOCK_UNAVAILABLE: "Skipped: another server holds the job's lock.",
}


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
) -> Claim:
    """Claim the slot for this worker, record a skip, or recognise a duplicate delivery.

    With ``execution_id`` (a message from beat or ``--enqueue``) the existing row is
    claimed; without it a new execution (the next ``run_number``) is inserted.
    ``lock_busy`` (another server holds the job's Redis lock) does not decide on its own:
    a lock left behind by a killed worker must not block the next run, so the overlap
    check reads the database (a live lease of another execution), and reports such a skip
    as ``LOCK_UNAVAILABLE``.
    """
    if not lock_busy and not _needs_state(job, execution_id, force, rerun):
        fast = _claim_new(job=job, job_id=job_id, slot=slot, execution_date=execution_date,
                          trigger=trigger, forced=force or rerun, celery_task_id=celery_task_id,
                          worker=worker, pid=pid, lease_seconds=lease_seconds)
        if fast is not None:
            return fast
    with transaction.atomic(), connection.cursor() as cursor:
        # 1. Lock the job's row and take the next fence in one statement.
        cursor.execute(
            f"UPDATE {JOB} SET fence = fence + 1 WHERE id = %s RETURNING fence, paused, max_retries",
            [job_id],
        )
        locked = cursor.fetchone()
        if locked is None:
            raise JobRowMissing(job.name)
        fence, paused, max_retries = locked
        state: dict[str, Any] = {
            "succeeded": False, "failed": False, "live": False, "stale": False,
            "job_live": False, "own_status": None, "own_live": False, "own_forced": False, "own_retries": None,
            "own_trigger": None, "own_force": False, "blocker": None, "job_stale": False,
        }
        if lock_busy or _needs_state(job, execution_id, force, rerun):
            state = _slot_state(cursor, job_id, slot, execution_id or 0)
        if execution_id is not None:
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
            # A run sent with --force/--rerun keeps that choice when its message is sent again.
            rerun = rerun or bool(state["own_forced"])
            force = force or bool(state["own_force"])
        own = state["own_status"]
        attempted = own in (S.RETRYING, S.RUNNING)
        reason = _decide(job, state, paused=paused, force=force, rerun=rerun, attempted=attempted)
        if lock_busy and reason == models.SkipReason.OVERLAP:
            reason = models.SkipReason.LOCK_UNAVAILABLE
        if reason and attempted and reason == models.SkipReason.PAUSED:
            # Never turn a failed attempt into a skip: the caller ends it with its failure.
            return Claim(outcome=GIVE_UP, execution_id=execution_id, status_seen=own, skip_reason=reason)
        overlapping = reason in (models.SkipReason.OVERLAP, models.SkipReason.LOCK_UNAVAILABLE)
        buffered = state["own_trigger"] in BUFFERED_TRIGGERS and job.pattern != models.ExecutionPattern.RATE_LIMITED
        if overlapping and execution_id is not None and (attempted or buffered):
            if own != S.RUNNING:  # an expired RUNNING attempt is the reconciler's to end first
                waiting.mark(cursor, execution_id, state["blocker"])
            return Claim(outcome=WAITING, execution_id=execution_id, status_seen=own, skip_reason=reason,
                         blocker=state["blocker"])
        if reason:
            return _record_skip(
                cursor, job, job_id, slot, execution_date, trigger, execution_id, reason,
                celery_task_id, worker, pid,
            )
        if state["job_stale"] and _exclusive(job):
            _supersede(cursor, job_id, execution_id or 0, fence)
        if execution_id is not None:
            cursor.execute(
                f"""
                UPDATE {EXE} SET status = 'RUNNING', fence = %(fence)s,
                    lease_until = now() + make_interval(secs => %(lease)s),
                    started = coalesce(started, clock_timestamp()), ended = NULL, waiting_since = NULL,
                    retry_count = retry_count + (CASE WHEN status = 'RUNNING' THEN 1 ELSE 0 END),
                    worker = %(worker)s, pid = %(pid)s,
                    attempts = CASE WHEN status = 'PENDING' THEN attempts ELSE {_TAKEN_OVER} || {_RECLAIMED} END,
                    celery_task_id = coalesce(nullif(%(task_id)s, ''), celery_task_id)
                WHERE id = %(id)s AND (status IN ('PENDING', 'RETRYING')
                      OR (status = 'RUNNING' AND lease_until <= now()))
                RETURNING run_number, retry_count
                """,
                {"fence": fence, "lease": lease_seconds, "worker": worker, "pid": pid,
                 "task_id": celery_task_id, "id": execution_id},
            )
            row = cursor.fetchone()
            if row is None:  # changed under us despite the job lock: treat as delivered
                return Claim(outcome=DUPLICATE, execution_id=execution_id, status_seen="CHANGED")
            return Claim(outcome=S.RUNNING, execution_id=execution_id, run_number=row[0],
                         fence=fence, retry_count=row[1])
        new_id, run_number = _insert(
            cursor, job, job_id, slot, execution_date, trigger,
            status=S.RUNNING, forced=force or rerun, fence=fence, lease_seconds=lease_seconds,
            celery_task_id=celery_task_id, worker=worker, pid=pid,
        )
        return Claim(outcome=S.RUNNING, execution_id=new_id, run_number=run_number, fence=fence)


INSERT_COLUMNS = """job_id, task_code, task_name, slot, execution_date, run_number,
    status, trigger, skip_reason, forced, created_at, started, ended, completed,
    success, message, error_code, traceback, retry_count, celery_task_id, worker,
    pid, fence, lease_until, attempts"""


def _new_attempt(number: str, fence: str) -> str:
    """SQL for a one-element JSON array: the attempt that starts now (``worker``/``pid``
    parameters by name)."""
    return (f"jsonb_build_array(jsonb_build_object('attempt', {number}, 'started', clock_timestamp(),"
            f" 'worker', %(worker)s::text, 'pid', %(pid)s::int, 'fence', {fence}))")


def _closed_attempts(status: str, code: str, message: str, when: str = "true") -> str:
    """SQL for ``attempts`` with its last entry ended (when ``when`` holds): its status,
    end time, error code and the first 500 characters of its message.

    The first attempt has no entry until it ends (the hot path writes no JSON at the
    claim): its entry is then made from the row's own columns, which describe it.
    """
    end = f"'status', {status}, 'ended', clock_timestamp(), 'error_code', {code}, 'message', left({message}, 500)"
    return f"""(CASE WHEN NOT ({when}) THEN attempts
        WHEN jsonb_array_length(attempts) = 0
        THEN jsonb_build_array(jsonb_build_object('attempt', 1, 'started', started, 'worker', worker, 'pid', pid,
                                                  'fence', fence, {end}))
        ELSE jsonb_set(attempts, ARRAY[(jsonb_array_length(attempts) - 1)::text],
                       (attempts -> -1) || jsonb_build_object({end}))
        END)"""


_ENDED = _closed_attempts("%(status)s", "%(code)s", "%(message)s")
#: ``finish`` keeps the history only once there is one (a retry or a takeover made it): an
#: execution that ended in its first attempt is described by its own columns, and the hot
#: path does not touch ``attempts`` at all (``history=False``; measured: about 5 % of a
#: tracked run).
_FINISHED = _closed_attempts("%(status)s", "%(code)s", "%(message)s", "jsonb_array_length(attempts) > 0")
_RECLAIMED = _new_attempt("retry_count + (CASE WHEN status = 'RUNNING' THEN 1 ELSE 0 END) + 1", "%(fence)s")
#: A running attempt a person marks LOST ends in the history too, once there is one.
_ABANDONED = _closed_attempts("%(status)s", "%(code)s", "%(message)s",
                              "status = 'RUNNING' AND jsonb_array_length(attempts) > 0")
_TAKEN_OVER = _closed_attempts("'LOST'", "'LEASE_EXPIRED'", "'taken over after its lease expired'",
                               "status = 'RUNNING'")
#: An expired RUNNING attempt that ``give_up`` ends LOST ends in the history too, once there is one.
_GIVEN_UP = _closed_attempts("'LOST'", "'LEASE_EXPIRED'", "'its worker stopped renewing the lease'",
                             "status = 'RUNNING' AND jsonb_array_length(attempts) > 0")


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
) -> Claim | None:
    """One autocommit statement for a job that needs no slot or overlap check.

    It locks the job's row (taking the fence) and inserts the RUNNING execution. It
    returns None — and the caller takes the full path — when the job is paused, its row
    is gone, or another claim inserted the same run number first.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH j AS (UPDATE {JOB} SET fence = fence + 1 WHERE id = %(job)s AND NOT paused
                       RETURNING fence)
            INSERT INTO {EXE} ({INSERT_COLUMNS})
            SELECT %(job)s, %(code)s, %(name)s, %(slot)s, %(date)s,
                coalesce((SELECT max(run_number) FROM {EXE}
                          WHERE job_id = %(job)s AND slot = %(slot)s), 0) + 1,
                'RUNNING', %(trigger)s, '', %(forced)s, now(), clock_timestamp(), NULL, false, NULL,
                '', '', '', 0, %(task_id)s, %(worker)s, %(pid)s, j.fence,
                now() + make_interval(secs => %(lease)s), '[]'::jsonb
            FROM j
            ON CONFLICT (job_id, slot, run_number) DO NOTHING
            RETURNING id, run_number, fence
            """,
            {"job": job_id, "code": job.code, "name": job.name, "slot": slot,
             "date": execution_date, "trigger": trigger, "forced": forced,
             "task_id": celery_task_id, "worker": worker, "pid": pid, "lease": lease_seconds},
        )
        row = cursor.fetchone()
    if row is None:
        return None
    return Claim(outcome=S.RUNNING, execution_id=int(row[0]), run_number=int(row[1]),
                 fence=int(row[2]))


def _insert(
    cursor: Any,
    job: registry.Job,
    job_id: int,
    slot: dt.datetime,
    execution_date: dt.date,
    trigger: str,
    *,
    status: str,
    forced: bool = False,
    fence: int | None = None,
    lease_seconds: int = 0,
    skip_reason: str = "",
    message: str = "",
    celery_task_id: str = "",
    worker: str = "",
    pid: int | None = None,
) -> tuple[int, int]:
    """Insert the slot's next execution. The job lock makes ``max + 1`` safe against other
    claims; a beat insert of run 1 that races us is absorbed by ON CONFLICT and a retry."""
    running = status == S.RUNNING
    finished = status in S.terminal()
    for _ in range(5):
        cursor.execute(
            f"""
            INSERT INTO {EXE} (job_id, task_code, task_name, slot, execution_date, run_number,
                status, trigger, skip_reason, forced, created_at, started, ended, completed,
                success, message, error_code, traceback, retry_count, celery_task_id, worker,
                pid, fence, lease_until, attempts)
            SELECT %(job)s, %(code)s, %(name)s, %(slot)s, %(date)s,
                coalesce((SELECT max(run_number) FROM {EXE}
                          WHERE job_id = %(job)s AND slot = %(slot)s), 0) + 1,
                %(status)s, %(trigger)s, %(reason)s, %(forced)s, now(),
                CASE WHEN %(running)s THEN clock_timestamp() END, CASE WHEN %(finished)s THEN now() END,
                %(finished)s, NULL, %(message)s, '', '', 0, %(task_id)s, %(worker)s, %(pid)s,
                %(fence)s,
                CASE WHEN %(running)s THEN now() + make_interval(secs => %(lease)s) END,
                '[]'::jsonb
            ON CONFLICT (job_id, slot, run_number) DO NOTHING
            RETURNING id, run_number
            """,
            {"job": job_id, "code": job.code, "name": job.name, "slot": slot,
             "date": execution_date, "status": status, "trigger": trigger,
             "reason": skip_reason, "forced": forced, "running": running,
             "finished": finished, "message": message, "task_id": celery_task_id,
             "worker": worker, "pid": pid, "fence": fence, "lease": lease_seconds},
        )
        row = cursor.fetchone()
        if row is not None:
            return int(row[0]), int(row[1])
    raise RuntimeError(f"could not insert an execution of {job.name} at {slot} after 5 tries")


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
) -> Claim:
    message = SKIP_MESSAGES[reason]
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
        execution_id, run_number = _insert(
            cursor, job, job_id, slot, execution_date, trigger, status=S.SKIPPED,
            skip_reason=reason, message=message, celery_task_id=celery_task_id,
            worker=worker, pid=pid,
        )
    return Claim(outcome=S.SKIPPED, execution_id=execution_id, run_number=run_number,
                 skip_reason=reason)


def enqueue(
    *,
    job: registry.Job,
    job_id: int,
    slot: dt.datetime,
    execution_date: dt.date,
    trigger: str,
    forced: bool = False,
    force: bool = False,
) -> tuple[int, int]:
    """Insert a PENDING execution for a message about to be published; (id, run_number).

    ``forced``: past the slot check (``--rerun``/``--force``); ``force``: also past a pause
    (``--force``). Both are kept on the row, so every later send of it keeps them."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SELECT 1 FROM {JOB} WHERE id = %s FOR UPDATE", [job_id])
        inserted = _insert(cursor, job, job_id, slot, execution_date, trigger, status=S.PENDING,
                           forced=forced or force)
        if force:
            cursor.execute(f"UPDATE {EXE} SET force = true WHERE id = %s", [inserted[0]])
        return inserted


def abandon(execution_id: int, message: str) -> None:
    """Close a PENDING execution whose message could not be published (status FAILED)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE {EXE} SET status = 'FAILED', completed = true, success = false,
                ended = now(), error_code = 'PUBLISH_FAILED', message = %s
            WHERE id = %s AND status = 'PENDING'
            """,
            [message[:1000], execution_id],
        )


def set_celery_task_id(execution_id: int, celery_task_id: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {EXE} SET celery_task_id = %s WHERE id = %s AND celery_task_id = ''",
            [celery_task_id, execution_id],
        )


def heartbeat(execution_id: int, fence: int, lease_seconds: int) -> bool:
    """Extend the lease; False means this worker was fenced and must stop."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE {EXE} SET lease_until = now() + make_interval(secs => %s)
            WHERE id = %s AND fence = %s AND status = 'RUNNING'
            """,
            [lease_seconds, execution_id, fence],
        )
        return bool(cursor.rowcount == 1)


def finish(
    *,
    job_id: int,
    execution_id: int,
    fence: int,
    status: str,
    message: str = "",
    error_code: str = "",
    traceback: str = "",
    result: Any = None,
    history: bool = True,
) -> bool:
    """Write the terminal status and the job's aggregates, only if the fence still holds.

    Returns False (and writes nothing) when another claim has taken the execution over.
    ``history=False`` (the first attempt: ``retry_count`` 0) leaves ``attempts`` alone.
    """
    return finish_counting(job_id=job_id, execution_id=execution_id, fence=fence, status=status,
                           message=message, error_code=error_code, traceback=traceback, result=result,
                           history=history) is not None


def finish_counting(
    *,
    job_id: int,
    execution_id: int,
    fence: int,
    status: str,
    message: str = "",
    error_code: str = "",
    traceback: str = "",
    result: Any = None,
    history: bool = True,
) -> int | None:
    """``finish``, returning the job's failures in a row before this outcome (None: fenced)."""
    attempts = f"attempts = {_FINISHED}," if history else ""
    succeeded = status == S.SUCCEEDED
    with connection.cursor() as cursor:
        # One statement, locks taken in the same order as ``begin``: the job's row first
        # (j), then the execution (e), whose fence and status are re-checked on its latest
        # version; the job's aggregates change only if the execution did.
        cursor.execute(
            f"""
            WITH j AS (SELECT id, consecutive_failures FROM {JOB} WHERE id = %(job)s FOR UPDATE),
            e AS (
                UPDATE {EXE} SET status = %(status)s, ended = clock_timestamp(), completed = true,
                    success = %(ok)s, message = %(message)s, error_code = %(code)s,
                    {attempts} traceback = %(tb)s, result = %(result)s::jsonb, lease_until = NULL
                FROM j
                WHERE {EXE}.id = %(id)s AND {EXE}.fence = %(fence)s AND {EXE}.status = 'RUNNING'
                RETURNING {EXE}.job_id
            )
            UPDATE {JOB} SET
                consecutive_failures = CASE WHEN %(ok)s THEN 0 ELSE {JOB}.consecutive_failures + 1 END,
                last_success_at = CASE WHEN %(ok)s THEN now() ELSE last_success_at END,
                alerted_at = CASE WHEN %(ok)s THEN NULL ELSE {JOB}.alerted_at END,
                last_status = %(status)s, last_run_at = now()
            FROM e, j WHERE {JOB}.id = e.job_id AND j.id = e.job_id
            RETURNING j.consecutive_failures
            """,
            {"status": status, "ok": succeeded, "message": message, "code": error_code,
             "tb": traceback, "result": None if result is None else json.dumps(result),
             "id": execution_id, "fence": fence, "job": job_id},
        )
        row = cursor.fetchone()
    return None if row is None else int(row[0])


def own_claim(execution_id: int, worker: str, pid: int) -> Claim | None:
    """The claim this process made of ``execution_id`` and committed, though the answer was lost
    with the connection: the row is RUNNING, by this worker and process, with a live lease."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT run_number, fence, retry_count FROM {EXE} WHERE id = %s AND status = 'RUNNING'"
            " AND worker = %s AND pid = %s AND lease_until > now()",
            [execution_id, worker, pid],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    return Claim(outcome=S.RUNNING, execution_id=execution_id, run_number=row[0], fence=row[1], retry_count=row[2])


def written_by(execution_id: int, fence: int, status: str, *, retrying: bool) -> str | bool:
    """Whether this claim's outcome is already in the row (its write was committed but the answer
    was lost with the connection, and the write tried again matched nothing): True for the final
    ``status``, ``RETRYING`` for a retry of an attempt that ended ``status``, False otherwise
    (another claim or the reconciler wrote it)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT status FROM {EXE}
            WHERE id = %(id)s AND fence = %(fence)s AND (
                (status = %(status)s AND completed)
                OR (%(retrying)s AND status = 'RETRYING' AND attempts -> -1 ->> 'status' = %(status)s
                    AND attempts -> -1 ->> 'fence' = %(fence)s::text))
            """,
            {"id": execution_id, "fence": fence, "status": status, "retrying": retrying},
        )
        row = cursor.fetchone()
    if row is None:
        return False
    return S.RETRYING if row[0] == S.RETRYING else True


def count_fenced(job_id: int) -> None:
    """Count an outcome that was not recorded because the run had been taken over."""
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {JOB} SET fenced_count = fenced_count + 1 WHERE id = %s", [job_id])


def job_code(job_id: int) -> str | None:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT code FROM {JOB} WHERE id = %s", [job_id])
        row = cursor.fetchone()
    return str(row[0]) if row else None


def newest_missed(job_ids: list[int]) -> list[tuple[int, int]]:
    """(job id, newest MISSED execution id) of these jobs' slots recorded MISSED in the last minute."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT DISTINCT ON (job_id) job_id, id FROM {EXE}
            WHERE job_id = ANY(%s) AND status = 'MISSED' AND created_at > now() - interval '1 minute'
            ORDER BY job_id, slot DESC
            """,
            [job_ids],
        )
        return [(int(row[0]), int(row[1])) for row in cursor.fetchall()]


def set_checkin(execution_id: int, check_in_id: str) -> None:
    """Keep the Sentry check-in id of an execution (sent at its first claim)."""
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {EXE} SET sentry_checkin_id = %s WHERE id = %s", [check_in_id, execution_id])


def checkin_of(execution_id: int) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT sentry_checkin_id FROM {EXE} WHERE id = %s", [execution_id])
        row = cursor.fetchone()
    return str(row[0]) if row else ""


def retry(
    *,
    job_id: int,
    execution_id: int,
    fence: int,
    status: str,
    message: str,
    error_code: str,
    traceback: str,
    countdown: float,
) -> bool:
    """End this attempt (``status``: FAILED or TIMED_OUT) and schedule the next one.

    The execution becomes RETRYING with ``retry_count + 1`` and its next attempt due in
    ``countdown`` seconds (kept in ``lease_until``, where the reconciler looks for retries
    whose message never came). Written only if the fence still holds and the job's row
    allows another attempt (``retry_count < max_retries``): the cap lives in the database,
    so a redelivered message cannot loop. False: write the final outcome instead.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH j AS (SELECT id, max_retries FROM {JOB} WHERE id = %(job)s FOR UPDATE)
            UPDATE {EXE} SET status = 'RETRYING', retry_count = retry_count + 1,
                message = %(message)s, error_code = %(code)s, traceback = %(tb)s,
                lease_until = now() + make_interval(secs => %(countdown)s), pid = NULL,
                attempts = {_ENDED}
            FROM j
            WHERE {EXE}.id = %(id)s AND {EXE}.job_id = j.id AND {EXE}.fence = %(fence)s
              AND {EXE}.status = 'RUNNING' AND {EXE}.retry_count < j.max_retries
            """,
            {"job": job_id, "id": execution_id, "fence": fence, "status": status, "message": message,
             "code": error_code, "tb": traceback, "countdown": max(0.0, float(countdown))},
        )
        return bool(cursor.rowcount == 1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Ended:
    """An attempt ended by ``end_dead_attempts``, and where its execution stands now."""

    execution_id: int
    job_id: int
    status: str  # RETRYING, or the final status
    retry_count: int
    slot: dt.datetime
    trigger: str


def end_dead_attempts(
    *,
    job_id: int,
    status: str,
    error_code: str,
    message: str,
    retry: bool = True,
    worker: str = "",
    pid: int | None = None,
    execution_id: int | None = None,
) -> Ended | None:
    """The process running an attempt of this job is gone (killed, timed out, vanished).

    The attempt is the job's RUNNING execution run by ``worker``/``pid`` (the worker's
    parent saw its child die), or execution ``execution_id`` once its lease has expired
    (the reconciler). It ends with ``status`` (LOST or TIMED_OUT) in the history. If
    ``retry`` and the job's row allows another attempt, the execution becomes RETRYING, due
    now; otherwise it ends with ``status`` and counts as a failure of the job. None when
    nothing matched (it already ended, or another worker owns it now).
    """
    if execution_id is not None:
        condition = f"{EXE}.id = %(id)s AND {EXE}.lease_until < now()"
    else:
        condition = f"{EXE}.worker = %(worker)s AND {EXE}.pid = %(pid)s"
    again = f"(%(retry)s AND {EXE}.retry_count < j.max_retries)"
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH j AS (SELECT id, max_retries FROM {JOB} WHERE id = %(job)s FOR UPDATE),
            e AS (
                UPDATE {EXE} SET
                    status = CASE WHEN {again} THEN 'RETRYING' ELSE %(status)s END,
                    retry_count = {EXE}.retry_count + CASE WHEN {again} THEN 1 ELSE 0 END,
                    completed = NOT {again}, success = CASE WHEN {again} THEN NULL ELSE false END,
                    ended = CASE WHEN {again} THEN NULL ELSE clock_timestamp() END,
                    lease_until = CASE WHEN {again} THEN now() END,
                    message = %(message)s, error_code = %(code)s, pid = NULL,
                    attempts = {_ENDED}
                FROM j
                WHERE {EXE}.job_id = j.id AND {EXE}.status = 'RUNNING' AND {condition}
                RETURNING {EXE}.id, {EXE}.job_id, {EXE}.status, {EXE}.retry_count, {EXE}.slot, {EXE}.trigger
            ), counted AS (
                UPDATE {JOB} SET consecutive_failures = consecutive_failures + 1, last_status = e.status,
                    last_run_at = now()
                FROM e WHERE {JOB}.id = e.job_id AND e.status <> 'RETRYING'
                RETURNING 1
            )
            SELECT * FROM e ORDER BY id LIMIT 1
            """,
            {"job": job_id, "id": execution_id, "status": status, "code": error_code,
             "message": message[:1000], "retry": retry, "worker": worker, "pid": pid},
        )
        row = cursor.fetchone()
    if row is None:
        return None
    return Ended(execution_id=int(row[0]), job_id=int(row[1]), status=str(row[2]), retry_count=int(row[3]),
                 slot=row[4], trigger=str(row[5]))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Revoked:
    """An execution ended by ``revoke``."""

    execution_id: int
    slot: dt.datetime
    started: bool  # False: it was still waiting for its message to run


def revoke(*, job_id: int, message: str, execution_id: int | None = None, worker: str = "",
           pid: int | None = None) -> Revoked | None:
    """End an execution whose Celery task was revoked: REVOKED, final, never retried or sent again.

    It is execution ``execution_id`` (the message's header) while it waits (PENDING, RETRYING)
    or while it runs in process ``pid`` of ``worker``; without an id (a message without the
    headers), the job's execution that this process runs. The job's failure count and its
    alert incident are left as they were: somebody stopped the run on purpose. None when
    nothing matched (it already ended, or another process runs it).
    """
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH j AS (SELECT id FROM {JOB} WHERE id = %(job)s FOR UPDATE),
            e AS (
                UPDATE {EXE} SET status = 'REVOKED', completed = true, success = false, ended = clock_timestamp(),
                    lease_until = NULL, error_code = %(code)s, message = %(message)s, attempts = {_ABANDONED}
                FROM j
                WHERE {EXE}.job_id = j.id AND (
                    ({EXE}.id = %(id)s::bigint AND {EXE}.status IN ('PENDING', 'RETRYING'))
                    OR ({EXE}.status = 'RUNNING' AND {EXE}.worker = %(worker)s AND {EXE}.pid = %(pid)s::int
                        AND (%(id)s::bigint IS NULL OR {EXE}.id = %(id)s::bigint)))
                RETURNING {EXE}.id, {EXE}.job_id, {EXE}.slot, {EXE}.started IS NOT NULL AS started
            ), touched AS (
                UPDATE {JOB} SET last_status = 'REVOKED', last_run_at = now()
                FROM e WHERE {JOB}.id = e.job_id
                RETURNING 1
            )
            SELECT id, slot, started FROM e ORDER BY id LIMIT 1
            """,
            {"job": job_id, "id": execution_id, "status": S.REVOKED, "code": "REVOKED", "message": message[:1000],
             "worker": worker, "pid": pid},
        )
        row = cursor.fetchone()
    if row is None:
        return None
    return Revoked(execution_id=int(row[0]), slot=row[1], started=bool(row[2]))


def status_of(execution_id: int) -> str | None:
    """The execution's status now (None: no such row)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT status FROM {EXE} WHERE id = %s", [execution_id])
        row = cursor.fetchone()
    return str(row[0]) if row else None


def close_unstarted(*, job_id: int, execution_id: int, status: str, error_code: str, message: str,
                    running_too: bool = False) -> bool:
    """End a PENDING or RETRYING execution that never started: MISSED (the catch-up policy
    will not run it late) or LOST (its message never arrived). LOST counts as a failure.
    ``running_too``: a person marks a stuck RUNNING execution LOST (its worker, if alive,
    is fenced: its next heartbeat and its finish match no row)."""
    open_statuses = ["PENDING", "RETRYING", "RUNNING"] if running_too else ["PENDING", "RETRYING"]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH j AS (SELECT id FROM {JOB} WHERE id = %(job)s FOR UPDATE),
            e AS (
                UPDATE {EXE} SET status = %(status)s, completed = true,
                    success = CASE WHEN %(status)s = 'MISSED' THEN NULL ELSE false END,
                    ended = now(), lease_until = NULL, error_code = %(code)s, message = %(message)s,
                    attempts = {_ABANDONED}
                FROM j
                WHERE {EXE}.id = %(id)s AND {EXE}.job_id = j.id AND {EXE}.status = ANY(%(open)s)
                RETURNING {EXE}.job_id
            )
            UPDATE {JOB} SET consecutive_failures = consecutive_failures + 1, last_status = %(status)s,
                last_run_at = now()
            FROM e WHERE {JOB}.id = e.job_id AND %(status)s <> 'MISSED'
            """,
            {"job": job_id, "id": execution_id, "status": status, "code": error_code, "message": message[:1000],
             "open": open_statuses},
        )
        cursor.execute(f"SELECT status = %s FROM {EXE} WHERE id = %s", [status, execution_id])
        row = cursor.fetchone()
    return bool(row and row[0])


@dataclasses.dataclass(frozen=True, kw_only=True)
class GivenUp:
    """An execution ended by ``give_up``: its final status, error code and message."""

    status: str
    error_code: str
    message: str
    slot: dt.datetime


def give_up(*, job_id: int, execution_id: int, note: str) -> GivenUp | None:
    """End an execution that already had an attempt and will not get another (its job is paused).

    A RETRYING execution ends with its last attempt's status (FAILED, TIMED_OUT or LOST), error
    code and message, with ``note`` added; a RUNNING one whose lease expired ends LOST
    (``LEASE_EXPIRED``). Either counts as a failure of the job. None when the execution is no
    longer in either state (another writer ended or took it first), or the job was resumed
    since the claim decided (its next delivery runs it).
    """
    last = "attempts -> -1 ->> 'status'"
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH j AS (SELECT id FROM {JOB} WHERE id = %(job)s AND paused FOR UPDATE),
            e AS (
                UPDATE {EXE} SET
                    status = CASE WHEN status = 'RUNNING' THEN 'LOST'
                                  WHEN {last} IN ('FAILED', 'TIMED_OUT', 'LOST') THEN {last}
                                  ELSE 'FAILED' END,
                    error_code = CASE WHEN status = 'RUNNING' THEN 'LEASE_EXPIRED' ELSE error_code END,
                    message = CASE WHEN status = 'RUNNING' THEN %(lost)s ELSE message END || %(note)s,
                    attempts = {_GIVEN_UP},
                    completed = true, success = false, ended = now(), lease_until = NULL, waiting_since = NULL,
                    pid = NULL
                FROM j
                WHERE {EXE}.id = %(id)s AND {EXE}.job_id = j.id
                  AND ({EXE}.status = 'RETRYING' OR ({EXE}.status = 'RUNNING' AND {EXE}.lease_until <= now()))
                RETURNING {EXE}.status, {EXE}.error_code, {EXE}.message, {EXE}.slot
            ), counted AS (
                UPDATE {JOB} SET consecutive_failures = consecutive_failures + 1, last_status = e.status,
                    last_run_at = now()
                FROM e WHERE {JOB}.id = %(job)s
                RETURNING 1
            )
            SELECT * FROM e
            """,
            {"job": job_id, "id": execution_id, "note": f"\n({note})",
             "lost": "Its worker stopped renewing the lease (it died or lost the database)."},
        )
        row = cursor.fetchone()
    if row is None:
        return None
    return GivenUp(status=str(row[0]), error_code=str(row[1]), message=str(row[2]), slot=row[3])


@dataclasses.dataclass(frozen=True, kw_only=True)
class Decision:
    """A scheduler's plan for one due job (see ``schedules.plan_catch_up``)."""

    job_id: int
    expected_next_run_at: dt.datetime | None  # what the scheduler read; the advance is conditional on it
    next_run_at: dt.datetime
    run: list[dt.datetime]  # PENDING rows (CATCH_UP for all but the newest)
    missed: list[dt.datetime]  # MISSED rows
    tz: dt.tzinfo  # for each slot's execution date


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToPublish:
    """A PENDING execution this scheduler inserted: send it, with this Celery task id."""

    execution_id: int
    job_id: int
    slot: dt.datetime
    trigger: str
    celery_task_id: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Dispatched:
    """What ``dispatch`` wrote for one job: the PENDING executions to publish now."""

    advanced: bool  # False: another scheduler advanced the job first; nothing was written
    to_publish: list[tuple[int, dt.datetime]]  # (execution id, slot) of rows this call inserted
    missed: int = 0  # MISSED rows this call inserted
    catch_up_ids: frozenset[int] = frozenset()  # those of ``to_publish`` that run late (CATCH_UP)


def dispatch_many(
    decisions: list[Decision], trigger: str = models.Trigger.BEAT
) -> tuple[set[int], list[ToPublish], int]:
    """Record many jobs' decisions in one statement, once, however many schedulers decide.

    Each job's ``next_run_at`` advances only if it still is what the scheduler read (a
    second beat with the same view changes nothing, and a paused job nothing at all), and
    only the jobs that advanced get rows: run 1 of each slot, PENDING (with a Celery task id
    chosen here) or MISSED, with ``ON CONFLICT DO NOTHING``. Only the rows this call
    inserted come back for publishing: a slot is dispatched once.

    Returns (ids of the jobs advanced, the executions to publish, MISSED rows written).
    """
    if not decisions:
        return set(), [], 0
    slot_rows: list[tuple[int, dt.datetime, dt.date, str, str, str]] = []
    for decision in decisions:
        newest = max(decision.run) if decision.run else None
        for slot in decision.run:
            late = newest is not None and slot < newest
            slot_rows.append((decision.job_id, slot, slot.astimezone(decision.tz).date(), S.PENDING,
                              models.Trigger.CATCH_UP if late else trigger, str(uuid.uuid4())))
        for slot in decision.missed:
            slot_rows.append((decision.job_id, slot, slot.astimezone(decision.tz).date(), S.MISSED, trigger, ""))
    columns: list[list[Any]] = [list(column) for column in zip(*slot_rows, strict=True)] or [[] for _ in range(6)]
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH decided AS (
                SELECT * FROM unnest(%s::bigint[], %s::timestamptz[], %s::timestamptz[])
                    AS d(job_id, expected, next_run_at)
            ), advanced AS (
                UPDATE {JOB} AS job SET next_run_at = d.next_run_at
                FROM decided AS d
                WHERE job.id = d.job_id AND NOT job.paused
                  AND job.next_run_at IS NOT DISTINCT FROM d.expected
                RETURNING job.id, job.code, job.name
            ), slots AS (
                SELECT * FROM unnest(%s::bigint[], %s::timestamptz[], %s::date[], %s::text[], %s::text[],
                                     %s::text[])
                    AS s(job_id, slot, execution_date, status, trigger, celery_task_id)
            ), inserted AS (
                INSERT INTO {EXE} ({INSERT_COLUMNS})
                SELECT s.job_id, a.code, a.name, s.slot, s.execution_date, 1, s.status, s.trigger, '',
                       false, now(), NULL, CASE WHEN s.status = %s THEN now() END, s.status = %s, NULL,
                       CASE WHEN s.status = %s THEN %s ELSE '' END, '', '', 0, s.celery_task_id, '',
                       NULL, NULL, NULL, '[]'::jsonb
                FROM slots AS s JOIN advanced AS a ON a.id = s.job_id
                ORDER BY s.job_id, s.slot
                ON CONFLICT (job_id, slot, run_number) DO NOTHING
                RETURNING id, job_id, slot, status, trigger, celery_task_id
            )
            SELECT 'job', id, NULL, NULL, NULL, NULL FROM advanced
            UNION ALL
            SELECT 'exe', id, job_id, slot, status || ':' || trigger, celery_task_id FROM inserted
            """,
            [[d.job_id for d in decisions], [d.expected_next_run_at for d in decisions],
             [d.next_run_at for d in decisions], *columns,
             S.MISSED, S.MISSED, S.MISSED, "Missed: the scheduler did not dispatch this slot in time."],
        )
        rows = cursor.fetchall()
    advanced = {int(row[1]) for row in rows if row[0] == "job"}
    publish: list[ToPublish] = []
    missed = 0
    for kind, execution_id, job_id, slot, state, celery_task_id in rows:
        if kind != "exe":
            continue
        status, _, row_trigger = state.partition(":")
        if status == S.MISSED:
            missed += 1
            continue
        publish.append(ToPublish(execution_id=int(execution_id), job_id=int(job_id), slot=slot,
                                 trigger=row_trigger, celery_task_id=celery_task_id))
    publish.sort(key=lambda item: (item.slot, item.job_id))
    return advanced, publish, missed


def dispatch(
    *,
    job: registry.Job,
    job_id: int,
    expected_next_run_at: dt.datetime | None,
    next_run_at: dt.datetime,
    run: list[dt.datetime],
    missed: list[dt.datetime],
    trigger: str = models.Trigger.BEAT,
) -> Dispatched:
    """``dispatch_many`` for one job."""
    decision = Decision(job_id=job_id, expected_next_run_at=expected_next_run_at, next_run_at=next_run_at,
                        run=run, missed=missed, tz=job.tzinfo)
    advanced, publish, missed_count = dispatch_many([decision], trigger)
    return Dispatched(
        advanced=job_id in advanced,
        to_publish=[(item.execution_id, item.slot) for item in publish],
        missed=missed_count,
        catch_up_ids=frozenset(item.execution_id for item in publish if item.trigger == models.Trigger.CATCH_UP),
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class DueJob:
    """A job whose next slot has come, with what the scheduler needs to plan it."""

    job_id: int
    next_run_at: dt.datetime
    task: str
    name: str
    schedule: str
    timezone: str  # the schedule's: what its cron is read in
    catch_up: str
    job_timezone: str  # the job's: what its slots' execution dates are read in


def due_jobs(now: dt.datetime, limit: int = 1000, among: list[int] | None = None,
             skip_catch_up: str | None = None) -> list[DueJob]:
    """Unpaused jobs whose next slot is due, oldest first, through the index on
    ``next_run_at``; ``among`` limits it to some job ids, ``skip_catch_up`` leaves out the
    jobs with that catch-up policy."""
    only = "" if among is None else "AND id = ANY(%s)"
    if skip_catch_up is not None:
        only += f" AND catch_up <> '{models.CatchUp(skip_catch_up).value}'"
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT id, next_run_at, task, name, schedule, coalesce(nullif(schedule_timezone, ''), timezone),
                   catch_up, timezone
            FROM {JOB}
            WHERE next_run_at <= %s AND NOT paused {only}
            ORDER BY next_run_at LIMIT %s
            """,
            [now, limit] if among is None else [now, among, limit],
        )
        return [DueJob(job_id=int(row[0]), next_run_at=row[1], task=row[2], name=row[3], schedule=row[4],
                       timezone=row[5], catch_up=row[6], job_timezone=row[7]) for row in cursor.fetchall()]


def next_due() -> tuple[dt.datetime | None, bool, dt.datetime]:
    """The idle tick's one query: the earliest ``next_run_at`` of an unpaused job, whether
    any schedule was edited, and the database's clock (what "is it due" is decided by, so a
    beat whose own clock is off dispatches nothing early or late). Both lookups use an index
    (``next_run_at``, and the partial index of edited jobs: written as a scalar subquery, not
    ``EXISTS``, because only this form lets the planner use it — ``EXISTS`` scans the whole table)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT (SELECT next_run_at FROM {JOB} WHERE next_run_at IS NOT NULL AND NOT paused
                    ORDER BY next_run_at LIMIT 1),
                   (SELECT id FROM {JOB} WHERE schedule_version <> schedule_seen ORDER BY id LIMIT 1) IS NOT NULL,
                   clock_timestamp()
            """
        )
        row = cursor.fetchone()
    assert row is not None
    return row[0], bool(row[1]), row[2]
