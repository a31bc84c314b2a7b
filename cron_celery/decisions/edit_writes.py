"""The job rows the admin's edits are written to: each edit applied on its own.

``schedule_sync.apply_edits`` reads the edited jobs and decides each one's row (``Update``); this
writes them. The whole batch goes in one statement; when PostgreSQL refuses it (a value it cannot
store, a trigger that raises, whatever one row holds) each row is written again on its own, in a
savepoint, so the others go through. A row refused on its own is not written: the job keeps what
it had, its edit is marked seen, and the refusal in words becomes its ``schedule_problem``
(``Written.refused``), for the caller to log and alert like any edit that cannot drive a job. Were
even that refused, the edit is only marked seen, so a beat never reads it again on every tick.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging

from django.db import DatabaseError, connection, transaction

from cron_celery import models
from cron_celery.decisions import audit
from cron_celery.declaring import storable

logger = logging.getLogger(__name__)

JOB = models.CronJob._meta.db_table


@dataclasses.dataclass(frozen=True, kw_only=True)
class Update:
    """What one job's row becomes once its edit is taken in (``one_off`` None: left as it is)."""

    job_id: int
    version: int  # the schedule_version read: a newer edit meanwhile leaves the row for the next call
    schedule: str
    tz: str
    move: bool  # whether next_run_at becomes ``next_run_at``
    next_run_at: dt.datetime | None
    problem: str
    paused: bool | None  # None: the flag stays as it is
    opens: dt.datetime | None
    closes: dt.datetime | None
    one_off: bool | None
    params: str | None  # JSON text, or None for no values


@dataclasses.dataclass
class Written:
    ids: set[int] = dataclasses.field(default_factory=set)  # rows written as decided
    refused: dict[int, str] = dataclasses.field(default_factory=dict)  # job id: why its row was refused


_COLUMNS = ("job_id", "version", "schedule", "tz", "move", "next_run_at", "problem", "paused", "opens", "closes",
            "one_off", "params")
_TYPES = ("bigint", "bigint", "text", "text", "boolean", "timestamptz", "text", "boolean", "timestamptz",
          "timestamptz", "boolean", "text")
_UPDATE = f"""
    UPDATE {JOB} AS job
       SET schedule = d.schedule, schedule_timezone = d.tz, schedule_seen = d.version,
           next_run_at = CASE WHEN d.move THEN d.next_run_at ELSE job.next_run_at END,
           schedule_problem = d.problem, paused = coalesce(d.paused, job.paused),
           active_from = d.opens, active_until = d.closes, one_off = coalesce(d.one_off, job.one_off),
           params = d.params::jsonb
      FROM unnest({", ".join(f"%s::{kind}[]" for kind in _TYPES)}) AS d({", ".join(_COLUMNS)})
     WHERE job.id = d.job_id AND job.schedule_version = d.version
    RETURNING job.id
"""


def _write(cursor: object, updates: list[Update]) -> set[int]:
    rows = [tuple(getattr(update, name) for name in _COLUMNS) for update in updates]
    cursor.execute(_UPDATE, [list(column) for column in zip(*rows, strict=True)])  # type: ignore[attr-defined]
    return {int(row[0]) for row in cursor.fetchall()}  # type: ignore[attr-defined]


def write(updates: list[Update]) -> Written:
    """Write the rows: in one statement, else one by one (see the module's doc)."""
    written = Written()
    if not updates:
        return written
    with transaction.atomic(), connection.cursor() as cursor:
        # The copies below are no schedule change of the audit log (recorded at the periodic task),
        # but for a pause decided here: an edit that cannot drive the job, or a usable one again.
        audit.set_author(source=audit.EDIT_TAKEN_IN, cursor=cursor, keep=True)
        try:
            with transaction.atomic():
                written.ids = _write(cursor, updates)
            return written
        except DatabaseError as error:
            logger.warning("cron_celery: %d edited job(s) could not be written together (%s); writing each "
                           "on its own", len(updates), _first_line(error))
        for update in updates:
            try:
                with transaction.atomic():
                    written.ids |= _write(cursor, [update])
            except DatabaseError as error:
                written.refused[update.job_id] = _refused(cursor, update, error)
    return written


def _refused(cursor: object, update: Update, error: DatabaseError) -> str:
    """Keep the job as it was, the edit seen and the refusal stored; the refusal in words."""
    problem = f"the edit could not be stored: {_first_line(error)}"
    if update.problem:
        problem = f"{update.problem}; {problem}"
    problem = problem[:2000]
    try:
        with transaction.atomic():
            cursor.execute(  # type: ignore[attr-defined]
                f"UPDATE {JOB} SET schedule_seen = %s, schedule_problem = %s WHERE id = %s AND schedule_version = %s",
                [update.version, problem, update.job_id, update.version])
    except DatabaseError:
        logger.exception("cron_celery: job %d: its edit could not be stored, nor why; marking it seen only",
                         update.job_id)
        with transaction.atomic():
            cursor.execute(f"UPDATE {JOB} SET schedule_seen = %s WHERE id = %s AND schedule_version = %s",  # type: ignore[attr-defined]
                           [update.version, update.job_id, update.version])
    return problem


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return storable.shown(f"{type(error).__name__}: {text[0] if text else ''}")[:500]
