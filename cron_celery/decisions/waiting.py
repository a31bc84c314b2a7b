"""Buffered executions: which waiting execution of a job with a limit runs next.

A slot that a person or the catch-up policy asked for (a backfill, a catch-up ``all`` slot, an
enqueued or admin run) and a retry never skip because another execution of their job is
running: the claim marks them waiting (``waiting_since``) and lets their message go. When the
live run ends — its outcome written, its attempt retried, or its worker found dead — the one
that ended it asks ``next_to_run`` for the job's oldest waiting execution and sends it again.
If that message is lost (the sender died between its commit and the send), the reconciler
sends the waiting execution once the job is free and ``PENDING_GRACE`` has passed.

A pause holds them too: such an execution that reaches a paused job is marked waiting, not
skipped (``mark(paused=True)``), and nothing sends a waiting execution of a paused job — neither
``next_to_run`` nor the reconciler (``may_go``) — unless it was sent with ``--force``. So a pause
costs no message, however long it lasts; once the job is resumed they are sent as above (the
admin's *Resume* sends them at once: ``resumes``; any other resume, at the reconciler's next pass).

Waiting executions keep their status (PENDING or RETRYING), so everything that counts open
executions — the dashboard, the health check, the retention job — still sees them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from django.db import connection, transaction

from cron_celery import models

EXE = models.CronExecution._meta.db_table
JOB = models.CronJob._meta.db_table


def may_go(execution: str, job: str) -> str:
    """SQL: the waiting execution (alias ``execution``) of job row ``job`` may be sent now: the job
    is not paused, or the execution runs past a pause (sent with ``--force``; the last slot of a
    ``one_off`` periodic task)."""
    return f"(NOT {job}.paused OR {execution}.force)"


def mark(cursor: Any, execution_id: int, blocker: int | None, *, limit: int | None = None,
         group: str | None = None, paused: bool = False, ahead: int | None = None) -> None:
    """Record that the execution waits (inside the claim's transaction, under the job's lock).

    ``lease_until`` restarts the reconciler's grace period and ``republished`` starts again (its
    message arrived: it was not lost); a PENDING execution's message says what it waits for (a
    RETRYING one keeps its last attempt's error). ``limit``: the job's ``max_concurrency``, or its
    concurrency ``group``'s limit, when that is what it waits for; ``paused``: it waits for the
    job to be resumed; ``ahead``: how many older runs of the job wait before it (``slot_state``)."""
    if paused:
        note = ("Waiting: the job is paused; this one runs when it is resumed "
                "(cancel it in the history to drop it).")
    elif ahead:
        note = (f"Waiting: {ahead} older run(s) of this job wait to run first; this one runs after them "
                "(oldest slot first).")
    elif group is not None:
        note = (f"Waiting: the job's concurrency group {group!r} has {limit} runs at once; "
                "this one runs when one of them ends.")
    elif limit is not None:
        note = f"Waiting: the job has {limit} runs at once (its max_concurrency); this one runs when one ends."
    elif blocker:
        note = f"Waiting: execution {blocker} of this job is running; this one runs when it ends."
    else:
        note = "Waiting: another execution of this job is running; this one runs when it ends."
    cursor.execute(
        f"""
        UPDATE {EXE} SET waiting_since = coalesce(waiting_since, now()), lease_until = now(), republished = 0,
            message = CASE WHEN status = 'PENDING' THEN %s ELSE message END
        WHERE id = %s AND status IN ('PENDING', 'RETRYING')
        """,
        [note, execution_id],
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Next:
    """A waiting execution to send again now."""

    execution_id: int
    slot: dt.datetime
    trigger: str
    celery_task_id: str
    task_name: str


def next_to_run(job_id: int) -> Next | None:
    """The job's oldest waiting execution (by slot), if the job has room for a run now (fewer live
    runs than its limit: 1 for overlap ``skip``, else its ``max_concurrency``). While the job is
    paused only one sent with ``--force`` is chosen (``may_go``).

    Its ``lease_until`` is set to now (sent at), so the reconciler waits a full grace period
    before it sends the same execution again. Two callers one after the other may both pick it:
    the claim lets one of the two messages run it and the other does nothing.

    The job's row is locked by a statement of its own, before the one that chooses: a statement
    reads the rows as they were when it began, so one that waited for the lock inside it would
    choose from before the claim it waited for — the execution just claimed, still "waiting" in
    its view — and cut the lease of that live run to now (its worker's own repeat delivery then
    found the run expired and recorded it LOST). Chosen after the lock, with a fresh view, it
    sees every committed claim of the job, and the update checks the execution still waits.
    """
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SELECT task, coalesce(max_concurrency, 1), paused FROM {JOB} WHERE id = %s FOR UPDATE",
                       [job_id])
        job = cursor.fetchone()
        if job is None:
            return None
        cursor.execute(
            f"""
            UPDATE {EXE} AS e SET lease_until = now()
            WHERE e.status IN ('PENDING', 'RETRYING') AND e.waiting_since IS NOT NULL AND e.id = (
                SELECT w.id FROM {EXE} AS w
                WHERE w.job_id = %(job)s AND w.status IN ('PENDING', 'RETRYING') AND w.waiting_since IS NOT NULL
                  AND (NOT %(paused)s OR w.force)
                  AND (SELECT count(*) FROM {EXE} AS r WHERE r.job_id = %(job)s AND r.status = 'RUNNING'
                       AND r.lease_until > now()) < %(room)s
                ORDER BY w.slot, w.id LIMIT 1)
            RETURNING e.id, e.slot, e.trigger, e.celery_task_id
            """,
            {"job": job_id, "room": job[1], "paused": bool(job[2])},
        )
        row = cursor.fetchone()
    if row is None:
        return None
    return Next(execution_id=int(row[0]), slot=row[1], trigger=str(row[2]), celery_task_id=str(row[3] or ""),
                task_name=str(job[0]))


def every_one(job_id: int) -> list[Next]:
    """Every waiting execution of a job that may be sent now (``may_go``), oldest slot first, each
    one's ``lease_until`` set to now (sent at): for a resumed job without a limit on its live runs,
    whose held executions may all run at once. (A job with a limit gets ``next_to_run``'s one.)"""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH j AS (SELECT id, task, paused FROM {JOB} WHERE id = %s FOR UPDATE)
            UPDATE {EXE} AS e SET lease_until = now() FROM j
            WHERE e.job_id = j.id AND e.status IN ('PENDING', 'RETRYING') AND e.waiting_since IS NOT NULL
              AND {may_go("e", "j")}
            RETURNING e.id, e.slot, e.trigger, e.celery_task_id, j.task
            """,
            [job_id],
        )
        rows = cursor.fetchall()
    return sorted((Next(execution_id=int(row[0]), slot=row[1], trigger=str(row[2]), celery_task_id=str(row[3] or ""),
                        task_name=str(row[4])) for row in rows), key=lambda item: (item.slot, item.execution_id))
