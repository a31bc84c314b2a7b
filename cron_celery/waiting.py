"""Buffered executions: which waiting execution of an overlap-``skip`` job runs next.

A slot that a person or the catch-up policy asked for (a backfill, a catch-up ``all`` slot, an
enqueued or admin run) and a retry never skip because another execution of their job is
running: the claim marks them waiting (``waiting_since``) and lets their message go. When the
live run ends — its outcome written, its attempt retried, or its worker found dead — the one
that ended it asks ``next_to_run`` for the job's oldest waiting execution and sends it again.
If that message is lost (the sender died between its commit and the send), the reconciler
sends the waiting execution once the job is free and ``PENDING_GRACE`` has passed.

Waiting executions keep their status (PENDING or RETRYING), so everything that counts open
executions — the dashboard, the health check, the retention job — still sees them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from django.db import connection

from cron_celery import models

EXE = models.CronExecution._meta.db_table
JOB = models.CronJob._meta.db_table


def mark(cursor: Any, execution_id: int, blocker: int | None) -> None:
    """Record that the execution waits (inside the claim's transaction, under the job's lock).

    ``lease_until`` restarts the reconciler's grace period and ``republished`` starts again (its
    message arrived: it was not lost); a PENDING execution's message says what it waits for (a
    RETRYING one keeps its last attempt's error)."""
    note = f"Waiting: execution {blocker} of this job is running; this one runs when it ends." if blocker \
        else "Waiting: another execution of this job is running; this one runs when it ends."
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
    """The job's oldest waiting execution (by slot), if the job has no live run now.

    Its ``lease_until`` is set to now (sent at), so the reconciler waits a full grace period
    before it sends the same execution again. The job's row is locked first, as everywhere.
    Two callers one after the other may both pick it: the claim lets one of the two messages
    run it and the other does nothing.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH j AS (SELECT id, task FROM {JOB} WHERE id = %(job)s FOR UPDATE)
            UPDATE {EXE} AS e SET lease_until = now()
            FROM j
            WHERE j.id = e.job_id AND e.id = (
                SELECT w.id FROM {EXE} AS w
                WHERE w.job_id = %(job)s AND w.status IN ('PENDING', 'RETRYING') AND w.waiting_since IS NOT NULL
                  AND NOT EXISTS (SELECT 1 FROM {EXE} AS r WHERE r.job_id = %(job)s AND r.status = 'RUNNING'
                                  AND r.lease_until > now())
                ORDER BY w.slot, w.id LIMIT 1)
            RETURNING e.id, e.slot, e.trigger, e.celery_task_id, j.task
            """,
            {"job": job_id},
        )
        row = cursor.fetchone()
    if row is None:
        return None
    return Next(execution_id=int(row[0]), slot=row[1], trigger=str(row[2]), celery_task_id=str(row[3] or ""),
                task_name=str(row[4]))
