"""Jobs removed from the code: what they leave behind is retired, once, and nobody is alerted.

The schedule sync of a deploy (a beat's start, ``sync_cron_schedules``) compares the job rows with
the jobs its code declares (``sync``):

- the row of a job the code no longer declares is marked (``removed_at``), unlinked from its periodic
  task (which is disabled, never deleted) and given no next slot, in a statement that two beats starting
  at once cannot both make: one row in the audit log ("declared": [true, false], with the link), one
  line in the log;
- its edges (``after=``, either way) are deleted, and the executions it left waiting — PENDING (a slot
  the beat or an upstream's success recorded, a one-off run not sent yet) or RETRYING — are closed
  SKIPPED (``REMOVED``), saying why: no worker is sent them any more (the new code has no task to run
  them), none is alerted, and they decide nothing below them. A closed row is never late: its timing
  mark goes with it;
- a row marked removed whose job the code declares again is unmarked ("declared": [false, true]); the
  rest of the sync gives it back its edges and its periodic task, and it runs again.

Only that sync calls ``sync``, never a worker's start: in a rolling deploy a worker of the old code
may start after the new beat, and it must not retire the jobs it does not know.

The database makes sure of the rest: the after= decision gives a removed downstream job no slot, and
names a removed upstream as the reason a downstream slot is skipped (``migrations/_initial/after.py``). A run that was
under way at the deploy finishes on the worker that runs it (the old code's). What such a run leaves
later is the reconciler's (``leftovers``, each pass): an execution waiting again (a retry written after
the deploy) is closed the same way, and a running one whose lease ran out ends LOST (``JOB_REMOVED``),
neither retried nor alerted. ``timing`` marks nothing of a removed job.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from django.db import connection, transaction
from django_celery_beat.models import PeriodicTask

from cron_celery import models
from cron_celery.decisions import audit, executions, tracked
from cron_celery.declaring import registry

logger = logging.getLogger(__name__)

EXE, JOB = executions.EXE, executions.JOB
DEP = models.CronDependency._meta.db_table
TASK = PeriodicTask._meta.db_table
#: The error code of what a removed job left (its running attempts' ends; the skips say REMOVED).
ERROR_CODE = "JOB_REMOVED"
_CLOSED = "Not run: job %s (%s) was removed from the code (its executions are no longer sent)."
_LOST = ("The worker stopped renewing the lease; not retried and not alerted: job %s (%s) was removed "
         "from the code.")


@dataclasses.dataclass(kw_only=True)
class Report:
    """What one sync retired or brought back."""

    removed: list[str] = dataclasses.field(default_factory=list)  # "name (code)" of the jobs marked removed now
    restored: list[str] = dataclasses.field(default_factory=list)  # of those declared again
    disabled: list[str] = dataclasses.field(default_factory=list)  # codes of those whose periodic task was unlinked
    closed: int = 0  # executions they left waiting, closed SKIPPED (REMOVED)


def sync(declared: list[registry.Job], *, source: str) -> Report:
    """Mark the rows of jobs this code does not declare removed (and unmark those it declares again),
    then retire what every removed job left; see the module's docstring. ``declared``: every job of
    this code (``registry.all_jobs()``), never a part of them. ``source``: the audit log's."""
    report = Report()
    codes = [job.code for job in declared]
    with transaction.atomic(), connection.cursor() as cursor:
        audit.set_author(source=source, cursor=cursor)
        # Every row this may write (bring back, mark, close the executions of) locked first, in one order:
        # two beats of different code syncing at once (a rolling deploy) then queue, never deadlock.
        # A tracked periodic task's row is declared by no code: it is never removed from it (``tracked``).
        cursor.execute(f"SELECT 1 FROM {JOB} WHERE removed_at IS NOT NULL OR (code <> ALL(%s) AND {tracked.UNTRACKED})"
                       " ORDER BY id FOR UPDATE", [codes])
        cursor.execute(
            f"UPDATE {JOB} SET removed_at = NULL WHERE removed_at IS NOT NULL AND code = ANY(%s) RETURNING name, code",
            [codes])
        report.restored = [f"{name} ({code})" for name, code in cursor.fetchall()]
        cursor.execute(
            f"""
            WITH gone AS (SELECT id, periodic_task_id FROM {JOB} WHERE removed_at IS NULL AND code <> ALL(%s)
                            AND {tracked.UNTRACKED} ORDER BY id FOR UPDATE)
            UPDATE {JOB} AS job SET removed_at = now(), next_run_at = NULL, periodic_task_id = NULL
            FROM gone WHERE job.id = gone.id
            RETURNING job.name, job.code, gone.periodic_task_id
            """,
            [codes])
        gone = cursor.fetchall()
        report.removed = [f"{name} ({code})" for name, code, _task in gone]
        report.disabled = [str(code) for _name, code, task in gone if task is not None]
        tasks = [int(task) for _name, _code, task in gone if task is not None]
        if tasks:
            cursor.execute(f"UPDATE {TASK} SET enabled = false WHERE id = ANY(%s) AND enabled", [tasks])
        cursor.execute(
            f"DELETE FROM {DEP} WHERE downstream_id IN (SELECT id FROM {JOB} WHERE removed_at IS NOT NULL)"
            f" OR upstream_id IN (SELECT id FROM {JOB} WHERE removed_at IS NOT NULL)")
        report.closed = _close(cursor, [int(row[0]) for row in _held(cursor, skip_locked=False)], running=False)
    for name in report.removed:
        logger.warning("cron_celery: job %s was removed from the code: its edges (after=) are deleted, its periodic "
                       "task (if any) disabled and the executions it left waiting closed SKIPPED (REMOVED); nothing "
                       "of it is sent or alerted any more", name)
    for name in report.restored:
        logger.warning("cron_celery: job %s is declared in the code again: it runs again", name)
    if report.closed:
        logger.warning("cron_celery: %d execution(s) of jobs removed from the code closed SKIPPED (REMOVED)",
                       report.closed)
    return report


def leftovers() -> int:
    """Step of a reconciler pass: what runs of removed jobs left since the deploy — executions waiting
    (a retry written by a run that was under way), closed SKIPPED (``REMOVED``), and running ones whose
    lease ran out, ended LOST (``JOB_REMOVED``) — none retried, re-sent or alerted. Returns how many."""
    with transaction.atomic(), connection.cursor() as cursor:
        held = [int(row[0]) for row in _held(cursor, skip_locked=True)]
        return _close(cursor, held, running=True) if held else 0


def _held(cursor: Any, *, skip_locked: bool) -> list[tuple[int]]:
    """The removed jobs with an execution open (PENDING, RETRYING, RUNNING), their rows locked first, as
    every writer of an execution's status takes them (``skip_locked``: one held this instant waits for
    the next pass). Each is a probe of the (job, status) index."""
    cursor.execute(
        f"""
        SELECT j.id FROM {JOB} AS j
        WHERE j.removed_at IS NOT NULL AND EXISTS (
            SELECT 1 FROM {EXE} AS e WHERE e.job_id = j.id AND e.status IN ('PENDING', 'RETRYING', 'RUNNING'))
        ORDER BY j.id FOR NO KEY UPDATE{' SKIP LOCKED' if skip_locked else ''}
        """)
    return list(cursor.fetchall())


def _close(cursor: Any, job_ids: list[int], *, running: bool) -> int:
    """Close the waiting executions of these removed jobs (and, ``running``, those whose lease ran out)."""
    if not job_ids:
        return 0
    lost = "e.status = 'RUNNING'"
    cursor.execute(
        f"""
        UPDATE {EXE} AS e SET
            status = CASE WHEN {lost} THEN 'LOST' ELSE 'SKIPPED' END,
            skip_reason = CASE WHEN {lost} THEN '' ELSE 'REMOVED' END,
            error_code = CASE WHEN {lost} THEN %(code)s ELSE e.error_code END,
            success = CASE WHEN {lost} THEN false END,
            completed = true, ended = now(), lease_until = NULL,
            message = left((SELECT format(CASE WHEN {lost} THEN %(lost)s ELSE %(closed)s END, j.name, j.code)
                            FROM {JOB} AS j WHERE j.id = e.job_id), 1000),
            attempts = {executions.closed_attempts("'LOST'", "%(code)s", "'its worker stopped renewing the lease'",
                                                   lost)}
        WHERE e.job_id = ANY(%(jobs)s)
          AND (e.status IN ('PENDING', 'RETRYING') OR (%(running)s AND {lost} AND e.lease_until < now()))
        """,
        {"code": ERROR_CODE, "lost": _LOST, "closed": _CLOSED, "jobs": job_ids, "running": running})
    return int(cursor.rowcount)
