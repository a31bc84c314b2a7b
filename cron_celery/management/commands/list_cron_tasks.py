"""``manage.py list_cron_tasks``: the registered jobs, their policies, and their latest slot's
outcome (not the most recently written execution: a backfill of an older date, or one that
could not be sent, does not hide what happened to the latest slot)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.core.management.base import BaseCommand
from django.db import connection
from django.utils import timezone

from cron_celery import enums, models
from cron_celery.decisions import oneoffs
from cron_celery.declaring import registry

EXE, JOB = models.CronExecution._meta.db_table, models.CronJob._meta.db_table

#: Each job's latest slot, and its outcome: the last run of it that was not a skip or a send the
#: broker refused (which never ran), else the last of those. Two index reads per job, whatever
#: the history's size.
LATEST = f"""
SELECT j.code, e.slot, e.status, e.skip_reason
FROM {JOB} AS j
CROSS JOIN LATERAL (SELECT max(slot) AS slot FROM {EXE} WHERE job_id = j.id) AS latest
CROSS JOIN LATERAL (SELECT slot, status, skip_reason FROM {EXE} WHERE job_id = j.id AND slot = latest.slot
                    ORDER BY status = 'SKIPPED' OR error_code = 'PUBLISH_FAILED', run_number DESC
                    LIMIT 1) AS e
WHERE j.code = ANY(%s)
"""


def outcome(status: str, skip_reason: str) -> str:
    """A skip reads as one ("SKIPPED (overlap)"), not as a run."""
    if status != enums.Status.SKIPPED:
        return status
    reasons = {reason.value: reason.label.lower() for reason in enums.SkipReason}
    return f"SKIPPED ({reasons[skip_reason]})" if skip_reason in reasons else "SKIPPED"


def next_cell(state: models.CronJob | None, upcoming: dt.datetime | None, ended: bool,
              one_off: dt.datetime | None) -> str:
    """NEXT SLOT: the next slot, a one-off run when it comes first, "window ended", or "paused" (with the
    pause's end and note when it has them: "paused until 2026-12-08 07:00Z (warehouse migration)")."""
    if one_off is not None and (upcoming is None or ended or one_off < upcoming or (state and state.paused)):
        return f"one-off {one_off:%Y-%m-%d %H:%M}Z"
    if state is not None and state.paused:
        said = f"paused until {state.paused_until:%Y-%m-%d %H:%M}Z" if state.paused_until else "paused"
        return f"{said} ({' '.join(state.pause_note.split())[:60]})" if state.pause_note else said
    if ended:
        return "window ended"
    return f"{upcoming:%Y-%m-%d %H:%M}Z" if upcoming else "-"


class Command(BaseCommand):
    help = "List the registered cron jobs with their schedule, policies, next slot and last execution."

    def handle(self, *args: Any, **options: Any) -> None:
        jobs = registry.all_jobs()
        if not jobs:
            self.stdout.write("No cron jobs are registered (declare them in an app's tasks.py).")
            return
        with connection.cursor() as cursor:
            cursor.execute(LATEST, [[job.code for job in jobs]])
            latest = {code: (slot, outcome(status, reason)) for code, slot, status, reason in cursor.fetchall()}
        rows_by_code = {row.code: row for row in models.CronJob.objects.filter(code__in=[job.code for job in jobs])}
        one_offs = oneoffs.next_by_job([row.id for row in rows_by_code.values()])
        now = timezone.now()
        header = ("NAME", "CODE", "SCHEDULE", "PATTERN", "OVERLAP", "TIMEZONE", "NEXT SLOT", "LATEST SLOT",
                  "ITS OUTCOME")
        rows = [header]
        for job in jobs:
            slot, status = latest.get(job.code, (None, "never run"))
            state = rows_by_code.get(job.code)
            schedule = job.schedule.expression if job.schedule else "-"
            if job.after:  # no schedule of its own: it runs each slot after these jobs
                schedule = f"after {', '.join(job.after)}"
            upcoming = job.next_slot(now)
            if state is not None and state.schedule:  # the schedule in effect (it may be edited in the admin)
                schedule, upcoming = state.schedule, state.next_run_at
            ended = state is not None and state.active_until is not None and upcoming is not None \
                and upcoming >= state.active_until
            one_off = one_offs.get(state.id) if state is not None else None
            rows.append((
                job.name,
                job.code,
                schedule,
                job.pattern.value,
                job.overlap.value,
                job.timezone,
                next_cell(state, upcoming, ended, one_off),
                f"{slot:%Y-%m-%d %H:%M}Z" if slot else "-",
                status,
            ))
        widths = [max(len(str(row[i])) for row in rows) for i in range(len(header))]
        for row in rows:
            self.stdout.write("  ".join(str(cell).ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
