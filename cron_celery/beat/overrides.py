"""A job's schedule as its code declares it, beside the admin's edit in effect, and when a deploy
will replace that edit with the code's schedule.

``schedule_sync.sync`` (a beat's start, ``manage.py sync_cron_schedules``) writes the code's
schedule to a job's periodic task only when the job's declaration hash changed since the last
sync: the hash of its task name, its schedule's expression, its timezone and (when declared) its
active window (``schedule_sync.declaration_hash``). A deploy that leaves those as they are keeps
an edit made in the admin; one that changes any of them replaces it. The admin shows both (the
dashboard's schedule column, the job's page, the periodic task's page) with that warning.
"""

from __future__ import annotations

import dataclasses

from cron_celery import exceptions, models, schedules
from cron_celery.beat import schedule_sync
from cron_celery.declaring import registry

#: What the admin says beside an edit, the rule of ``schedule_sync.sync`` in one sentence.
WARNING = ("A deploy that changes this job's declaration in code — its schedule, timezone, task or active "
           "window (its declaration hash) — replaces this admin edit with the code's schedule at the next "
           "sync (a beat's start or manage.py sync_cron_schedules); a deploy that leaves the declaration as "
           "it is keeps the edit.")
#: When this process runs code whose declaration differs from the one synced last.
PENDING = ("This web process runs a declaration of the job that differs from the one synced last: the next "
           "sync (a beat's start or manage.py sync_cron_schedules) replaces this admin edit with the code's "
           "schedule.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class CodeAndAdmin:
    """A job whose schedule in effect (edited in the admin) is not the one its code declares."""

    declared: str  # the code's expression: "0 2 * * *", "every 30s"
    declared_timezone: str  # the code's timezone for a cron schedule; "" for an interval
    in_effect: str  # the job row's schedule (the admin's edit, taken in)
    in_effect_timezone: str  # "" for an interval
    replaced_at_next_sync: bool  # the declaration changed since the last sync: the next sync writes the code's

    @property
    def warning(self) -> str:
        return PENDING if self.replaced_at_next_sync else WARNING

    def declared_text(self) -> str:
        """``0 2 * * * (Europe/Amsterdam)``, ``every 30s``."""
        return f"{self.declared} ({self.declared_timezone})" if self.declared_timezone else self.declared


def compare(row: models.CronJob) -> CodeAndAdmin | None:
    """The code's schedule beside the one in effect, when they differ; None for a job not declared
    in this code base with a schedule of its own, without a periodic task, or running the code's
    schedule. Reads nothing from the database (the row is enough)."""
    if not row.periodic_task_id or not row.schedule:
        return None
    try:
        declared = registry.get(row.code)
    except exceptions.UnknownJob:
        return None
    if declared.schedule is None:
        return None
    # A cron schedule is read in its timezone; an interval in none (its slots are epoch-aligned).
    zone = (declared.schedule.timezone or declared.timezone) if isinstance(declared.schedule, schedules.Cron) else ""
    effective_zone = "" if row.schedule.startswith("every ") else (row.schedule_timezone or row.timezone)
    if (declared.schedule.expression, zone) == (row.schedule, effective_zone):
        return None
    return CodeAndAdmin(declared=declared.schedule.expression, declared_timezone=zone, in_effect=row.schedule,
                        in_effect_timezone=effective_zone,
                        replaced_at_next_sync=row.declaration_hash != schedule_sync.declaration_hash(declared))
