"""Pauses with a note and an end: what a pause says, and when one ends by itself.

A job is paused by its periodic task's ``enabled`` (a job without one: its row's ``paused``), as
always; a pause may also carry a note, its author and an end (``paused_until``). The database keeps
them honest: a trigger (``cron_celery_job_pause``, migration 0006) clears the note, the author and
the end whenever the job is resumed, however it is resumed, and dates the pause when it begins.

``say`` writes what a person says of a pause, under the job's row, and refuses an end that is not
ahead of the database's clock. ``after_failures`` pauses a job declared with ``pause_after_failures``
in the transaction of the final failure that makes it that many in a row, with a note naming them.
``end_due`` resumes the jobs whose pause has ended, by the database's clock: the beat calls it when
its idle tick finds a pause end passed (the tick's one query reads the earliest end,
``dispatch.next_due``), the reconciler at every pass, so a pause ends with nobody around and with no
beat running. Both may call it at once: each job is resumed once (its row is locked, skipping rows
another holds; the end is read again under the lock).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from django.db import connection, transaction

from cron_celery import exceptions, models
from cron_celery.decisions import audit

JOB = models.CronJob._meta.db_table
EXE = models.CronExecution._meta.db_table
TASK = "django_celery_beat_periodictask"
#: The audit log's source of a pause that ended by itself.
PAUSE_ENDED = "system (pause ended)"
#: The audit log's source, and the pause's author, of a job that paused itself after its failures.
PAUSED_AFTER_FAILURES = "system (pause_after_failures)"
BY_FAILURES = "cron_celery"
#: The longest note a person may give a pause (the admin's form and the endpoint).
NOTE_MAX = 2000


def say(job_id: int, *, note: str, until: dt.datetime | None, by: str) -> None:
    """Record the note, the author and the end of the job's pause (made in the same transaction,
    before this, by its periodic task's ``enabled``). An end at or before the database's clock is
    refused (``PauseRefused``): the job would resume at once."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE {JOB} SET pause_note = %(note)s, paused_by = %(by)s, paused_until = %(until)s
            WHERE id = %(id)s AND paused AND (%(until)s::timestamptz IS NULL OR %(until)s::timestamptz > now())
            RETURNING id
            """,
            {"id": job_id, "note": note, "by": by[:150], "until": until},
        )
        if cursor.fetchone() is not None:
            return
        cursor.execute(f"SELECT paused, now(), name FROM {JOB} WHERE id = %s", [job_id])
        row = cursor.fetchone()
    if row is None:
        raise exceptions.PauseRefused("its row is gone.", job=str(job_id))
    paused, now, name = row
    if not paused:
        raise exceptions.PauseRefused("it is not paused (its pause did not take).", job=name)
    raise exceptions.PauseRefused(f"its end {until:%Y-%m-%d %H:%M:%S %Z} is not after now "
                                  f"({now:%Y-%m-%d %H:%M:%S %Z}, the database's clock): a pause that ends in the "
                                  "past would resume at once.", job=name)


def end_due(limit: int = 100) -> list[int]:
    """Resume the jobs whose pause ended (``paused_until`` at or before the database's clock), at
    most ``limit`` at a time; returns their ids. The periodic task is enabled (its trigger resumes the
    job and has the beat take it in, as any resume); a job without one is resumed on its row. The
    audit log names the source ``PAUSE_ENDED``. With none ended this is one read of an index."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT (SELECT paused_until FROM {JOB} WHERE paused_until IS NOT NULL"
                       " ORDER BY paused_until LIMIT 1) <= now()")
        row = cursor.fetchone()
    if not (row and row[0]):
        return []
    with transaction.atomic(), connection.cursor() as cursor:
        audit.set_author(source=PAUSE_ENDED, cursor=cursor)
        cursor.execute(
            f"""
            WITH due AS (
                SELECT id, periodic_task_id FROM {JOB}
                WHERE paused_until IS NOT NULL AND paused_until <= now() AND paused
                ORDER BY paused_until LIMIT %s FOR UPDATE SKIP LOCKED
            ), enabled AS (
                UPDATE {TASK} AS task SET enabled = true FROM due
                WHERE task.id = due.periodic_task_id AND NOT task.enabled RETURNING due.id
            ), plain AS (
                UPDATE {JOB} AS job SET paused = false FROM due
                WHERE job.id = due.id AND due.periodic_task_id IS NULL RETURNING job.id
            )
            SELECT due.id, due.id IN (SELECT id FROM enabled UNION ALL SELECT id FROM plain) FROM due
            """,
            [limit],
        )
        rows = cursor.fetchall()
        # A job that stays paused all the same (its task was enabled already: paused by a schedule that
        # cannot drive it) keeps its pause, without the end that has passed.
        cursor.execute(f"UPDATE {JOB} SET paused_until = NULL WHERE id = ANY(%s) AND paused_until IS NOT NULL",
                       [[row[0] for row in rows]])
        return [int(row[0]) for row in rows if row[1]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class SelfPaused:
    """A job that paused itself: the note it wrote and the failures it names, newest first."""

    note: str
    failures: list[dict[str, Any]]


def after_failures(*, job_id: int, execution_id: int, counted: bool, status: str, slot: dt.datetime,
                   error_code: str) -> SelfPaused | None:
    """Pause the job if this final failure (``status``, of ``execution_id``) makes its
    ``pause_after_failures`` in a row; call it in the transaction that writes the failure. ``counted``:
    that write already counted it (``consecutive_failures``), or is still to (the worker's own final
    write). A job paused already (by a person, or by an earlier failure) is left as it is; a resumed
    job whose failures go on pauses again at the next one, as its streak is still that long.

    The periodic task is disabled (a job without one: its row), as the admin's *Pause* does, and the
    note names the failures: this one and the ones before it, by slot. None: not paused now."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT consecutive_failures, pause_after_failures, paused, periodic_task_id FROM {JOB}"
                       " WHERE id = %s FOR UPDATE", [job_id])
        row = cursor.fetchone()
        if row is None:
            return None
        failures, limit, paused, task_id = row
        in_a_row = int(failures) if counted else int(failures) + 1
        if limit is None or paused or in_a_row < int(limit):
            return None
        cursor.execute(
            f"""
            SELECT id, status, slot, error_code FROM {EXE}
            WHERE job_id = %s AND id <> %s AND completed AND status IN ('FAILED', 'TIMED_OUT', 'LOST')
            ORDER BY slot DESC, id DESC LIMIT %s
            """,
            [job_id, execution_id, int(limit) - 1],
        )
        listed = [{"id": execution_id, "status": status, "slot": slot.isoformat(), "error_code": error_code}]
        listed += [{"id": int(found[0]), "status": str(found[1]), "slot": found[2].isoformat(),
                    "error_code": str(found[3] or "")} for found in cursor.fetchall()]
        named = "; ".join(f"execution {item['id']} {item['status']}"
                          + (f" {item['error_code']}" if item["error_code"] else "")
                          + f" (slot {item['slot']})" for item in listed)
        note = f"Paused after {in_a_row} failures in a row (pause_after_failures={limit}): {named}."
        audit.set_author(source=PAUSED_AFTER_FAILURES, cursor=cursor)
        if task_id is not None:  # the switch, as a person's pause; its trigger pauses the job
            cursor.execute(f"UPDATE {TASK} SET enabled = false WHERE id = %s AND enabled", [task_id])
        cursor.execute(f"UPDATE {JOB} SET paused = true, pause_note = %s, paused_by = %s, paused_until = NULL"
                       " WHERE id = %s", [note[:2000], BY_FAILURES, job_id])
    return SelfPaused(note=note, failures=listed)
