"""One-off runs: a run of a job recorded ahead for a given time, sent once by the beat then.

``run_cron_task NAME --at 2026-12-01T18:00 --schedule``, the admin's "Schedule a one-off run"
and ``POST run/<job>/`` with ``"schedule": true`` record a PENDING execution (trigger
``ONE_OFF``) whose slot is that time and whose ``due_at`` says when to send it, with no Celery
task id yet. The beat's idle query looks at the earliest of them through a partial index;
once one is due, ``take_due`` gives it a task id in a statement that two beats cannot both
win, and only the beat that gave it publishes it. Until then it can be cancelled: it becomes
SKIPPED (``CANCELLED``) and is never sent. The reconciler leaves a one-off that was never sent
to the beat (it is not late before the beat has sent it); the health check counts one that a
beat should have sent by now as overdue, like a job's slot.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from typing import Any

from django.db import connection, transaction

from cron_celery import enums
from cron_celery.decisions import executions
from cron_celery.declaring import registry

EXE = executions.EXE
JOB = executions.JOB
S = enums.Status
ONE_OFF = enums.Trigger.ONE_OFF

#: An unsent one-off, as SQL on an execution row named ``e`` (what the partial index covers).
UNSENT = "e.trigger = 'ONE_OFF' AND e.status = 'PENDING' AND e.celery_task_id = ''"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Recorded:
    """A one-off run recorded ahead: its execution, and when it is to be sent."""

    execution_id: int
    run_number: int
    at: dt.datetime


def record(job: registry.Job, job_id: int, at: dt.datetime, *, force: bool = False,
           given: Mapping[str, Any] | None = None) -> Recorded:
    """Record a one-off run of ``job`` at ``at`` (a future instant), under the job's row lock.
    Its row holds its parameters now (``given`` over the scheduled ones), so it runs with them
    whenever it is sent.

    Raises ``ValueError`` with what to do instead when ``at`` is not in the future by the
    database's clock, or when a one-off of the job at that instant is already waiting."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SELECT now() FROM {JOB} WHERE id = %s FOR UPDATE", [job_id])
        row = cursor.fetchone()
        assert row is not None, f"no job row {job_id}"
        if at <= row[0]:
            raise ValueError(f"{at.isoformat()} is not in the future (the database's clock says "
                             f"{row[0].isoformat(timespec='seconds')}): run it now instead")
        cursor.execute(f"SELECT e.id FROM {EXE} AS e WHERE e.job_id = %s AND e.slot = %s AND {UNSENT}", [job_id, at])
        waiting = cursor.fetchone()
        if waiting is not None:
            raise ValueError(f"a one-off run of {job.name} at {at.isoformat()} is already recorded "
                             f"(execution {waiting[0]})")
        execution_id, run_number = executions.insert(
            cursor, job, job_id, at, at.astimezone(job.tzinfo).date(), ONE_OFF, status=S.PENDING, forced=force,
            given=given, params_given=bool(given))
        cursor.execute(f"UPDATE {EXE} SET due_at = %s, force = %s WHERE id = %s", [at, force, execution_id])
    return Recorded(execution_id=execution_id, run_number=run_number, at=at)


def earliest() -> str:
    """SQL for the earliest due time of an unsent one-off (one probe of the partial index)."""
    return f"(SELECT e.due_at FROM {EXE} AS e WHERE {UNSENT} ORDER BY e.due_at LIMIT 1)"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Due:
    """A one-off this beat took to send: the execution, its Celery task id, and the job's task."""

    execution_id: int
    job_id: int
    slot: dt.datetime
    celery_task_id: str
    task: str
    force: bool


def take_due(now: dt.datetime, limit: int) -> list[Due]:
    """The unsent one-offs due by ``now``, each given its Celery task id here: a row another
    beat takes at the same moment is skipped (``SKIP LOCKED``) or, once it has an id, no longer
    matches, so each one-off is taken, and sent, once."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE {EXE} AS taken SET celery_task_id = gen_random_uuid()::text, lease_until = now()
            FROM (SELECT e.id FROM {EXE} AS e WHERE {UNSENT} AND e.due_at <= %s
                  ORDER BY e.due_at, e.id LIMIT %s FOR UPDATE SKIP LOCKED) AS due, {JOB} AS job
            WHERE taken.id = due.id AND job.id = taken.job_id AND taken.celery_task_id = ''
            RETURNING taken.id, taken.job_id, taken.slot, taken.celery_task_id, job.task, taken.force
            """,
            [now, limit],
        )
        rows = cursor.fetchall()
    return sorted((Due(execution_id=int(row[0]), job_id=int(row[1]), slot=row[2], celery_task_id=str(row[3]),
                       task=str(row[4]), force=bool(row[5])) for row in rows),
                  key=lambda due: (due.slot, due.execution_id))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Cancelled:
    execution_id: int
    job_id: int
    slot: dt.datetime
    message: str


def cancel(execution_ids: list[int], by: str, *, any_pending: bool = False) -> list[Cancelled]:
    """Cancel these one-offs if they were not sent yet: SKIPPED (``CANCELLED``), never sent.
    Those already sent (or not one-offs) are left alone; the cancelled ones come back.

    ``any_pending``: cancel every one of them that has not started (PENDING): besides one-offs not
    sent, runs a pause holds, runs waiting for a live run, and sent runs no worker took yet. Safe: a
    message of one that turns up later finds it ended and does nothing (the claim, under the job's
    row lock, as here). A RETRYING execution is left alone: it had an attempt, whose failure a skip
    would hide."""
    which = "e.status = 'PENDING'" if any_pending else UNSENT
    said = "Cancelled before it ran" if any_pending else "Cancelled before it was sent"
    if not execution_ids:
        return []
    with transaction.atomic(), connection.cursor() as cursor:
        # The jobs' rows first, as every writer of an execution's status takes them.
        cursor.execute(f"SELECT 1 FROM {JOB} WHERE id IN (SELECT job_id FROM {EXE} WHERE id = ANY(%s))"
                       " ORDER BY id FOR UPDATE", [execution_ids])
        cursor.execute(
            f"""
            UPDATE {EXE} AS e SET status = 'SKIPPED', skip_reason = 'CANCELLED', completed = true, ended = now(),
                   message = %s, waiting_since = NULL, lease_until = NULL
            WHERE e.id = ANY(%s) AND {which}
            RETURNING e.id, e.job_id, e.slot, e.message
            """,
            [f"{said}, by {by}."[:1000], execution_ids],
        )
        rows = cursor.fetchall()
    return [Cancelled(execution_id=int(row[0]), job_id=int(row[1]), slot=row[2], message=str(row[3])) for row in rows]


def next_by_job(job_ids: list[int]) -> dict[int, dt.datetime]:
    """The earliest unsent one-off of each of these jobs (the dashboard's "next: one-off at ...")."""
    if not job_ids:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT e.job_id, min(e.due_at) FROM {EXE} AS e WHERE e.job_id = ANY(%s) AND {UNSENT} GROUP BY 1",
            [job_ids])
        return {int(job_id): at for job_id, at in cursor.fetchall()}


def waiting(until: dt.datetime | None = None) -> list[tuple[int, int, dt.datetime]]:
    """Unsent one-offs due by ``until`` (every one: None), earliest first: (execution id, job id, due at)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT e.id, e.job_id, e.due_at FROM {EXE} AS e WHERE {UNSENT}"
            + (" AND e.due_at <= %s" if until is not None else "") + " ORDER BY e.due_at, e.id LIMIT 1000",
            [until] if until is not None else [])
        return [(int(row[0]), int(row[1]), row[2]) for row in cursor.fetchall()]
