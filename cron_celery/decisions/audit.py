"""The audit log of schedule changes: who changed a job's schedule, timezone, enabled/paused
state, parameters (the periodic task's ``kwargs``), active window or concurrency, what changed
and where from.

The rows (``models.ScheduleChange``) are written by database triggers (``migrations/_initial/audit.py``), in the
transaction of the change, whatever made it: an admin form or action, a deploy, the beat, the ORM
or raw SQL. Each attribute is recorded once, at the table that is its source of truth — the
periodic task (enabled, its schedule link, kwargs, start_time/expires, one_off), the schedule rows
themselves (a crontab edited in place: a row for every job that uses it), the job row for what is
declared in code only (max_concurrency, concurrency_group, its timezone when no crontab carries
one) and for ``paused`` where it is set directly — so the copies that follow (the trigger that
pauses the job of a disabled task, ``schedule_sync.apply_edits``) are never a second row.

Code that knows who makes a change says so first, inside the transaction (``set_author``): two
transaction-local settings, ``cron_celery.actor`` (the person) and ``cron_celery.source`` (where
from), which the triggers read. Transaction-local, so a pooled connection never carries an author
into somebody else's transaction. Without them a row names the database role and the
connection's ``application_name``, from the source ``database``.

The person and the source are claims: any session can set those settings to anything. The role
(``current_user``) is not a setting: the trigger reads it from the session, which can only change it
to a role its login was granted (``SET ROLE``). So every place that shows the person shows the role
beside it (``role``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from typing import Any

from django.db import connection
from django.db.models import Q

from cron_celery import exceptions, models

#: Where a change came from (``ScheduleChange.source``). ``DATABASE``: nobody said.
DATABASE = "database"
ADMIN_FORM = "admin: change form"
ADMIN_ADD_FORM = "admin: add form"
ADMIN_DELETE = "admin: delete"
DEPLOY_COMMAND = "deploy (sync_cron_schedules)"
DEPLOY_BEAT = "deploy (beat start)"
DEPLOY_SYNC = "deploy (schedule sync)"
#: The declared values (max_concurrency, concurrency_group, timezone) written to the job row by the
#: first process that runs the new code (``jobs.ensure_job``).
DECLARED = "deploy (declared in code)"
BEAT_ONE_OFF = "beat (one_off)"
#: Periodic tasks tracked as jobs (``TRACK_PERIODIC_TASKS``) linked or unlinked by a beat as they change.
BEAT_TRACKING = "beat (tracked periodic tasks)"
#: A job paused by the beat because its stored schedule cannot be planned (``schedule_problems.set_aside``).
SCHEDULE_PROBLEM = "system (schedule cannot drive the job)"
#: The pause ``schedule_sync.apply_edits`` decides itself when it takes an edit in: an edit that cannot
#: drive the job (paused), a usable one again (resumed), the flag brought back to the task's enabled.
EDIT_TAKEN_IN = "system (schedule edit taken in)"

ACTOR_SETTING = "cron_celery.actor"
SOURCE_SETTING = "cron_celery.source"
#: The longest actor and source the table keeps (the triggers cut longer ones).
ACTOR_MAX, SOURCE_MAX = 150, 100


def admin_action(name: str) -> str:
    """The source of an admin action's changes: ``"admin: pause action"``."""
    return f"admin: {name} action"


def endpoint_action(name: str) -> str:
    """The source of an endpoint's changes: ``"endpoint: pause"``."""
    return f"endpoint: {name}"


def author_sql(*, source: str, actor: str = "", keep: bool = False) -> tuple[str, list[str]]:
    """The ``SELECT`` that names the author (``set_author``), and its parameters: for a statement
    that names it itself, in a CTE (``WITH author AS (...)``), instead of a statement of its own."""
    if keep:  # what this transaction already said wins ('' is a setting reset at a transaction's end)
        actor_value = f"coalesce(nullif(current_setting('{ACTOR_SETTING}', true), ''), %s)"
        source_value = f"coalesce(nullif(current_setting('{SOURCE_SETTING}', true), ''), %s)"
    else:
        actor_value = source_value = "%s"
    return (f"SELECT set_config('{ACTOR_SETTING}', {actor_value}, true),"
            f" set_config('{SOURCE_SETTING}', {source_value}, true)"), [actor[:ACTOR_MAX], source[:SOURCE_MAX]]


def set_author(*, source: str, actor: str = "", cursor: Any = None, keep: bool = False) -> None:
    """Name who makes the changes of the current transaction: ``actor`` (a person; empty when
    there is none) and ``source`` (where from). ``keep``: leave an author already named in this
    transaction as it is (a default for code that runs inside someone else's change).

    Must be called inside ``transaction.atomic()``: the settings are transaction-local, so outside
    one they would be gone before the change is written."""
    if not connection.in_atomic_block:
        raise RuntimeError("audit.set_author must be called inside transaction.atomic(): its settings last "
                           "for the transaction, and outside one they end with this statement")
    statement, params = author_sql(source=source, actor=actor, keep=keep)
    if cursor is not None:
        cursor.execute(statement, params)
        return
    with connection.cursor() as own:
        own.execute(statement, params)


# --- reading ----------------------------------------------------------------------------------

def who(change: models.ScheduleChange) -> str:
    """The person, else the database role and the connection's application name."""
    return change.actor or role(change)


def role(change: models.ScheduleChange) -> str:
    """The database role that made the change and its connection's application name: what the trigger
    read from the database itself. The person (``actor``) is what the transaction said, and any session
    may say any name; show this beside it."""
    return f"{change.db_role} ({change.application_name})" if change.application_name else change.db_role


def shown(value: object) -> str:
    """A before or after value as people read it: ``—`` for none, JSON for parameters."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


#: The order attributes are listed in (others after them, by name).
ORDER = ("schedule", "timezone", "enabled", "paused", "kwargs", "active_from", "active_until", "one_off",
         "max_concurrency", "concurrency_group", "periodic_task")


def described(changes: object) -> list[tuple[str, str, str]]:
    """``(attribute, before, after)`` of each change, in a stable order."""
    if not isinstance(changes, dict):
        return []
    ranked = sorted(changes, key=lambda key: (ORDER.index(key) if key in ORDER else len(ORDER), key))
    rows = []
    for key in ranked:
        pair = changes[key]
        before, after = (pair[0], pair[1]) if isinstance(pair, list) and len(pair) == 2 else (None, pair)
        rows.append((key, shown(before), shown(after)))
    return rows


def one_line(changes: object) -> str:
    """``schedule: 0 * * * * → */5 * * * *; enabled: true → false``."""
    return "; ".join(f"{key}: {before} → {after}" for key, before, after in described(changes))


def as_dict(change: models.ScheduleChange) -> dict[str, Any]:
    """A row as the endpoint answers it."""
    return {
        "id": change.id, "job": change.job_name, "code": change.job_code, "job_id": change.job_id,
        "changed_at": change.changed_at.isoformat(), "actor": change.actor or None, "db_role": change.db_role,
        "application_name": change.application_name, "source": change.source, "changes": change.changes,
    }


def latest(job_id: int, limit: int) -> list[models.ScheduleChange]:
    """The job's newest ``limit`` changes (through its index: job, newest first)."""
    return list(models.ScheduleChange.objects.filter(job_id=job_id).order_by("-id")[:limit])


@dataclasses.dataclass(frozen=True, kw_only=True)
class Page:
    changes: list[models.ScheduleChange]
    more: bool  # older rows follow: ask again with before = the last id


def page(*, job: str | None = None, since: dt.datetime | None = None, before: int | None = None,
         limit: int = 100) -> Page:
    """Changes newest first: of one job (by its name or code: all its rows, also those recorded under
    an older name; a deleted job's by the name or code its rows kept), at or after ``since``, with ids
    below ``before``; at most ``limit``. Raises ``UnknownAuditedJob`` for a job nobody knows.
    Each condition is read through an index (the job's, newest first; ``changed_at``)."""
    rows = models.ScheduleChange.objects.all()
    if job:
        found = models.CronJob.objects.filter(Q(name=job) | Q(code=job)).values_list("id", flat=True).first()
        gone = Q(job_id__isnull=True) & (Q(job_name=job) | Q(job_code=job))
        if found is None and not rows.filter(gone).exists():
            raise exceptions.UnknownAuditedJob(name=job)
        rows = rows.filter(Q(job_id=found) | gone if found is not None else gone)
    if since is not None:
        rows = rows.filter(changed_at__gte=since)
    if before is not None:
        rows = rows.filter(id__lt=before)
    listed = list(rows.order_by("-id")[: limit + 1])
    return Page(changes=listed[:limit], more=len(listed) > limit)
