"""The reconciler's repairs (and the worker's parent's): attempts whose process is gone,
executions that never started, and the queries that find them.

Each repair locks the job's row first, like the claim, so passes on many workers at once
(and a live beat or worker) cannot double anything. The finding queries go job by job
through the ``(job, status)`` index, so a pass reads the few open executions, not the history.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from typing import Any

from django.db import connection, transaction

from cron_celery.decisions import executions, groups, waiting

JOB = executions.JOB
EXE = executions.EXE


def newest_missed(job_ids: list[int]) -> list[tuple[int, int, dt.datetime]]:
    """(job id, newest MISSED execution id, its slot) of these jobs' slots recorded MISSED in the
    last minute."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT DISTINCT ON (job_id) job_id, id, slot FROM {EXE}
            WHERE job_id = ANY(%s) AND status = 'MISSED' AND created_at > now() - interval '1 minute'
            ORDER BY job_id, slot DESC
            """,
            [job_ids],
        )
        return [(int(row[0]), int(row[1]), row[2]) for row in cursor.fetchall()]


def ran_by_request() -> str:
    """The condition that an execution is the one a worker's request ran: its ``cron_execution_id``
    header (``%(id)s``), else, for a message without the headers, its Celery task id (``%(task)s``),
    which the claim recorded. Never the host and pid alone: pids repeat across pid namespaces."""
    return (f"({EXE}.id = %(id)s::bigint OR (%(id)s::bigint IS NULL AND %(task)s::text <> ''"
            f" AND {EXE}.celery_task_id = %(task)s::text))")


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
    task_id: str = "",
) -> Ended | None:
    """The process running an attempt of this job is gone (killed, timed out, vanished).

    With ``worker`` (the worker's parent saw its child die): the execution that child ran — the
    request's execution (``execution_id``, its header) or, for a message without the headers, the
    one its claim recorded under the request's Celery task id (``task_id``) — while it is still
    RUNNING by that worker (``identity.WORKER``: host and boot) and pid. Without ``worker`` (the
    reconciler): execution ``execution_id`` once its lease has expired. It ends with ``status``
    (LOST or TIMED_OUT) in the history. If ``retry`` and the job's row allows another attempt, the
    execution becomes RETRYING, due now; otherwise it ends with ``status`` and counts as a failure
    of the job. None when nothing matched (it already ended, another worker owns it now, or the
    request named no execution), and with ``worker`` when the job's next run superseded it (that
    death is fenced like the run's own outcome; the reconciler ends it ``LEASE_EXPIRED``).
    """
    if worker:
        # A run the job's next run superseded is no longer this process's to end (what it reports is
        # fenced): the reconciler ends it.
        condition = (f"{EXE}.worker = %(worker)s AND {EXE}.pid = %(pid)s AND {ran_by_request()}"
                     f" AND NOT {executions.superseded(EXE)}")
    else:
        condition = f"{EXE}.id = %(id)s AND {EXE}.lease_until < now()"
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
                    attempts = {executions.ENDED}
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
             "message": message[:1000], "retry": retry, "worker": worker, "pid": pid, "task": task_id},
        )
        row = cursor.fetchone()
    if row is None:
        return None
    return Ended(execution_id=int(row[0]), job_id=int(row[1]), status=str(row[2]), retry_count=int(row[3]),
                 slot=row[4], trigger=str(row[5]))


def close_unstarted(*, job_id: int, execution_id: int, status: str, error_code: str, message: str,
                    running_too: bool = False, stranded_for: float | None = None) -> bool:
    """End a PENDING or RETRYING execution that never started: MISSED (the catch-up policy
    will not run it late) or LOST (its message never arrived). LOST counts as a failure.
    ``running_too``: a person marks a stuck RUNNING execution LOST (its worker, if alive,
    is fenced: its next heartbeat and its finish match no row).

    ``stranded_for`` (the reconciler's ``PENDING_GRACE``): only if it is still stranded as the pass
    read it, not waiting, its grace period not restarted since. A copy of its message may have
    arrived between the pass's read and this write, and its claim marked it waiting for the job's
    live run (``waiting.mark`` restarts the grace): that execution was delivered, and runs later.
    The check is made on the row as it is once the job's row is held (a concurrent update of the
    execution is read again), on the clock as it is then."""
    open_statuses = ["PENDING", "RETRYING", "RUNNING"] if running_too else ["PENDING", "RETRYING"]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH j AS (SELECT id FROM {JOB} WHERE id = %(job)s FOR UPDATE),
            e AS (
                UPDATE {EXE} SET status = %(status)s, completed = true,
                    success = CASE WHEN %(status)s = 'MISSED' THEN NULL ELSE false END,
                    ended = now(), lease_until = NULL, error_code = %(code)s, message = %(message)s,
                    attempts = {executions.ABANDONED}
                FROM j
                WHERE {EXE}.id = %(id)s AND {EXE}.job_id = j.id AND {EXE}.status = ANY(%(open)s)
                  AND (%(stranded)s::float8 IS NULL OR ({EXE}.waiting_since IS NULL AND coalesce(
                       {EXE}.lease_until, {EXE}.created_at) < clock_timestamp() - make_interval(secs => %(stranded)s)))
                RETURNING {EXE}.job_id
            )
            UPDATE {JOB} SET consecutive_failures = consecutive_failures + 1, last_status = %(status)s,
                last_run_at = now()
            FROM e WHERE {JOB}.id = e.job_id AND %(status)s <> 'MISSED'
            """,
            {"job": job_id, "id": execution_id, "status": status, "code": error_code, "message": message[:1000],
             "open": open_statuses, "stranded": stranded_for},
        )
        cursor.execute(f"SELECT status = %s FROM {EXE} WHERE id = %s", [status, execution_id])
        row = cursor.fetchone()
    return bool(row and row[0])


def expired_leases(batch: int) -> list[tuple[Any, ...]]:
    """(execution id, job id, task name, Celery task id) of RUNNING executions whose lease ran out,
    the longest expired first (step 1 of a reconciler pass)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT e.id, e.job_id, j.task, e.celery_task_id FROM {JOB} AS j CROSS JOIN LATERAL (
                SELECT id, job_id, lease_until, celery_task_id FROM {EXE}
                WHERE job_id = j.id AND status = 'RUNNING' AND lease_until < now()) AS e
            ORDER BY e.lease_until LIMIT %s
            """,
            [batch],
        )
        return list(cursor.fetchall())


def stranded(grace: float, batch: int) -> list[tuple[Any, ...]]:
    """PENDING and RETRYING executions no worker started within ``grace`` seconds (step 2 of a
    reconciler pass): (id, job id, slot, status, trigger, times sent again, Celery task id, task
    name, the job's catch-up policy, whether it waited its turn, whether a newer beat slot of the
    job exists, created at, whether its slot is older than the job's catch-up window)."""
    group_limits = json.dumps(groups.limits())
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT e.id, e.job_id, e.slot, e.status, e.trigger, e.republished, e.celery_task_id,
                   j.task, j.catch_up, e.waiting_since IS NOT NULL,
                   EXISTS (SELECT 1 FROM {EXE} AS newer WHERE newer.job_id = e.job_id AND newer.slot > e.slot
                           AND newer.trigger IN ('BEAT', 'CATCH_UP')),
                   e.created_at,
                   coalesce(e.slot + make_interval(secs => j.jitter_ms / 1000.0)
                            < now() - make_interval(secs => j.catch_up_window), false)
            FROM {JOB} AS j CROSS JOIN LATERAL (
                SELECT * FROM {EXE} WHERE job_id = j.id AND status IN ('PENDING', 'RETRYING')
                  AND coalesce(lease_until, created_at) < now() - make_interval(secs => %s)
                  AND NOT (trigger = 'ONE_OFF' AND celery_task_id = '')) AS e  -- the beat's to send
            -- A waiting execution is stranded only once its job has room for a run (and its
            -- concurrency group, counted as groups counts it), and, for a job with a limit, only
            -- its oldest one: it is the one that runs next. One a pause holds is never stranded
            -- while the job is paused (unless it was sent with --force): it is sent once the job is
            -- resumed, every one at once for a job without a limit (no run of it ends to send the
            -- next).
            WHERE e.waiting_since IS NULL OR (
                {waiting.may_go("e", "j")} AND
                (j.max_concurrency IS NULL
                 OR (SELECT count(*) FROM {EXE} AS r WHERE r.job_id = e.job_id AND r.status = 'RUNNING'
                     AND r.lease_until > now()) < j.max_concurrency)
                AND (j.concurrency_group = '' OR NOT (%s::jsonb ? j.concurrency_group)
                     OR ({groups.holding('j.concurrency_group', 'j.id', 'e.id')})
                        < (%s::jsonb ->> j.concurrency_group)::int)
                AND ((j.max_concurrency IS NULL AND NOT (%s::jsonb ? j.concurrency_group))
                     OR e.id = (SELECT w.id FROM {EXE} AS w WHERE w.job_id = e.job_id
                                AND w.status IN ('PENDING', 'RETRYING') AND w.waiting_since IS NOT NULL
                                AND {waiting.may_go("w", "j")}
                                ORDER BY w.slot, w.id LIMIT 1)))
            ORDER BY e.job_id, e.slot LIMIT %s
            """,
            [grace, group_limits, group_limits, group_limits, batch],
        )
        return list(cursor.fetchall())


def mark_late(execution_id: int) -> bool:
    """Restart the grace period of an execution whose message is still on its way, or was sent
    again without being counted (``republished`` counts sends of messages found gone)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {EXE} SET lease_until = now() WHERE id = %s AND status IN ('PENDING', 'RETRYING')",
            [execution_id],
        )
        return bool(cursor.rowcount == 1)


def as_catch_up(job_id: int, execution_id: int) -> bool:
    """Before a stranded beat slot of a catch-up ``all`` job is sent again: it runs late now, so it
    becomes what the beat makes of a late slot under ``all``, a catch-up (trigger ``CATCH_UP``), which
    waits for a live run of its job instead of being skipped (``claims.BUFFERED_TRIGGERS``). The claim
    reads the trigger from the row, so every copy of the slot's message (the one sent now, or the
    original turning up after all) is claimed as a catch-up. The job's row is locked first, as the
    claim locks it, so a claim sees the trigger before or after the change, never decides between.
    False when the execution no longer waits to start (a copy was claimed meanwhile): nothing to send."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH j AS (SELECT id FROM {JOB} WHERE id = %(job)s FOR UPDATE)
            UPDATE {EXE} SET trigger = 'CATCH_UP' FROM j
            WHERE {EXE}.id = %(id)s AND {EXE}.job_id = j.id AND {EXE}.status = 'PENDING'
              AND {EXE}.trigger IN ('BEAT', 'CATCH_UP')
            """,
            {"job": job_id, "id": execution_id},
        )
        return bool(cursor.rowcount == 1)


def mark_resent(execution_id: int) -> bool:
    """Count a send and restart the grace period, if the execution still waits."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE {EXE} SET republished = republished + 1, lease_until = now()
            WHERE id = %s AND status IN ('PENDING', 'RETRYING')
            """,
            [execution_id],
        )
        return bool(cursor.rowcount == 1)
