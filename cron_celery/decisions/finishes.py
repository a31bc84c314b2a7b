"""The run's end: its final write or its retry, both fenced, and the endings a person or the
job's pause decide (revoked, given up).

Every statement locks the job's row first (the order ``claims.begin`` takes), then re-checks
the execution's fence and status on its latest version: a stale writer changes nothing.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from typing import Any

from django.db import connection, transaction

from cron_celery import enums
from cron_celery.decisions import executions, repairs, statements

S = enums.Status
JOB = executions.JOB
EXE = executions.EXE


def finish(**kwargs: Any) -> bool:
    """Write the terminal status and the job's aggregates, only if the fence still holds
    (the arguments of ``finish_counting``).

    Returns False (and writes nothing) when another claim has taken the execution over.
    ``history=False`` (the first attempt: ``retry_count`` 0) leaves ``attempts`` alone.
    """
    return finish_counting(**kwargs) is not None


def _finish_sql(history: bool) -> statements.Statement:
    # One statement, locks taken in the same order as ``begin``: the job's row first (j), then
    # the execution (e), whose fence and status are re-checked on its latest version; the job's
    # aggregates change only if the execution did.
    attempts = f"attempts = {executions.FINISHED}," if history else ""
    return statements.statement("finish" if history else "finish_first", f"""
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
        """, {"job": "bigint", "status": "text", "ok": "boolean", "message": "text", "code": "text", "tb": "text",
              "result": "text", "id": "bigint", "fence": "bigint"})


#: The final write, with the attempts history closed (True) or, for a first attempt, left alone.
_FINISH = {history: _finish_sql(history) for history in (True, False)}


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
    with connection.cursor() as cursor:
        statements.execute(cursor, _FINISH[history], {
            "status": status, "ok": status == S.SUCCEEDED, "message": message, "code": error_code,
            "tb": traceback, "result": None if result is None else json.dumps(result),
            "id": execution_id, "fence": fence, "job": job_id})
        row = cursor.fetchone()
    return None if row is None else int(row[0])


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
    capped: bool = True,
) -> bool:
    """End this attempt (``status``: FAILED or TIMED_OUT) and schedule the next one.

    The execution becomes RETRYING with ``retry_count + 1`` and its next attempt due in
    ``countdown`` seconds (kept in ``lease_until``, where the reconciler looks for retries
    whose message never came). Written only if the fence still holds and the job's row
    allows another attempt (``retry_count < max_retries``): the cap lives in the database,
    so a redelivered message cannot loop. False: write the final outcome instead. Not ``capped``: a
    tracked periodic task's own retry, whose task counts its attempts itself (its next message is
    already sent).
    """
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH j AS (SELECT id, max_retries FROM {JOB} WHERE id = %(job)s FOR UPDATE)
            UPDATE {EXE} SET status = 'RETRYING', retry_count = retry_count + 1,
                message = %(message)s, error_code = %(code)s, traceback = %(tb)s,
                lease_until = now() + make_interval(secs => %(countdown)s), pid = NULL,
                attempts = {executions.ENDED}
            FROM j
            WHERE {EXE}.id = %(id)s AND {EXE}.job_id = j.id AND {EXE}.fence = %(fence)s
              AND {EXE}.status = 'RUNNING' AND (NOT %(capped)s OR {EXE}.retry_count < j.max_retries)
            """,
            {"capped": capped, "job": job_id, "id": execution_id, "fence": fence, "status": status, "message": message,
             "code": error_code, "tb": traceback, "countdown": max(0.0, float(countdown))},
        )
        return bool(cursor.rowcount == 1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Revoked:
    """An execution ended by ``revoke``."""

    execution_id: int
    slot: dt.datetime
    started: bool  # False: it was still waiting for its message to run


def revoke(*, job_id: int, message: str, execution_id: int | None = None, worker: str = "",
           pid: int | None = None, task_id: str = "") -> Revoked | None:
    """End an execution whose Celery task was revoked: REVOKED, final, never retried or sent again.

    It is execution ``execution_id`` (the message's header) while it waits (PENDING, RETRYING)
    or while it runs in process ``pid`` of ``worker`` (``identity.WORKER``: host and boot); without an
    id (a message without the headers), the execution that process runs under the revoked task's
    id ``task_id`` (``repairs.ran_by_request``). The job's failure count and its alert incident are
    left as they were: somebody stopped the run on purpose. None when nothing matched (it already
    ended, or another process runs it).
    """
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH j AS (SELECT id FROM {JOB} WHERE id = %(job)s FOR UPDATE),
            e AS (
                UPDATE {EXE} SET status = 'REVOKED', completed = true, success = false, ended = clock_timestamp(),
                    lease_until = NULL, error_code = %(code)s, message = %(message)s, attempts = {executions.ABANDONED}
                FROM j
                WHERE {EXE}.job_id = j.id AND (
                    ({EXE}.id = %(id)s::bigint AND {EXE}.status IN ('PENDING', 'RETRYING'))
                    OR ({EXE}.status = 'RUNNING' AND {EXE}.worker = %(worker)s AND {EXE}.pid = %(pid)s::int
                        AND {repairs.ran_by_request()}))
                RETURNING {EXE}.id, {EXE}.job_id, {EXE}.slot, {EXE}.started IS NOT NULL AS started
            ), touched AS (
                UPDATE {JOB} SET last_status = 'REVOKED', last_run_at = now()
                FROM e WHERE {JOB}.id = e.job_id
                RETURNING 1
            )
            SELECT id, slot, started FROM e ORDER BY id LIMIT 1
            """,
            {"job": job_id, "id": execution_id, "status": S.REVOKED, "code": "REVOKED", "message": message[:1000],
             "worker": worker, "pid": pid, "task": task_id},
        )
        row = cursor.fetchone()
    if row is None:
        return None
    return Revoked(execution_id=int(row[0]), slot=row[1], started=bool(row[2]))


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
                    attempts = {executions.GIVEN_UP},
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

