"""Periodic tasks tracked as jobs (``TRACK_PERIODIC_TASKS``): their job rows, linked to the periodic
task they follow; each one's declaration read back from its row (no code declares it); and what
its messages carry, read from the periodic task when they are sent.

A tracked job's row names as its ``task`` an alias, ``cron_celery.tracked:<code>``, never a task a
worker knows: every path that sends a job's message (the beat, the reconciler, a retry, the admin,
a backfill) passes the row's task to ``run.tasks.publish``, which turns the alias into the periodic
task's own task, arguments and options here. The alias is also how a row is known to be tracked.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time
from typing import Any

from django.db import connection, transaction
from django.utils.text import slugify

from cron_celery import enums, exceptions, schedules
from cron_celery.decisions import audit, executions
from cron_celery.declaring import registry, storable

JOB = executions.JOB
TASK = "django_celery_beat_periodictask"
#: The start of a tracked job's ``task``: the rest is its code.
ALIAS = "cron_celery.tracked:"
#: SQL: the job row (aliased ``job``) is a tracked periodic task's.
IS_TRACKED = "job.task LIKE 'cron_celery.tracked:%%'"
#: SQL: the job row (unaliased) is declared in code, not a tracked periodic task's.
UNTRACKED = "task NOT LIKE 'cron_celery.tracked:%%'"
#: How long a process keeps what a tracked job's messages carry (an edit reaches them within it).
CONTENTS_SECONDS = 2.0
#: The periodic task's options that say where its message goes, as ``DatabaseScheduler`` sends them.
_ROUTING = ("queue", "exchange", "routing_key", "priority")


def alias(code: str) -> str:
    return f"{ALIAS}{code}"


def code_of(task_name: str) -> str | None:
    """The code of the tracked job whose row names ``task_name``; None for any other task."""
    return task_name[len(ALIAS):] if task_name.startswith(ALIAS) else None


def code_for(periodic_task_id: int) -> str:
    """A tracked periodic task's job code: stable while the periodic task lives (renames keep it)."""
    return f"PT{periodic_task_id}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Candidate:
    """A periodic task to track: its row id, name and task, its job's timezone (its crontab's) and catch-up."""

    periodic_task_id: int
    name: str
    task: str
    timezone: str
    catch_up: str = "none"


def name_for(candidate: Candidate, taken: frozenset[str] | set[str]) -> str:
    """The job name of a tracked periodic task: its name as a slug, made unique with its code."""
    slug = re.sub(r"[^a-z0-9_-]", "", slugify(candidate.name).lower())[:100].strip("-_")
    suffix = f"-pt{candidate.periodic_task_id}"
    if not slug:
        return f"periodic-task{suffix}"
    return slug if slug not in taken else f"{slug[:100 - len(suffix)]}{suffix}"


def link(candidates: list[Candidate], *, source: str, reserved: frozenset[str] = frozenset()) -> list[str]:
    """Give each candidate a job row linked to its periodic task (a new row, or its old one linked
    again) and mark it for the beat to read its schedule (``schedule_sync.apply_edits``); a renamed
    periodic task renames its job; a name in ``reserved`` (a job declared in code) is never taken.
    Returns the codes of the rows created or linked again."""
    if not candidates:
        return []
    codes = {code_for(c.periodic_task_id): c for c in candidates}
    linked: list[str] = []
    with transaction.atomic(), connection.cursor() as cursor:
        audit.set_author(source=source, cursor=cursor)
        # The job rows by id first, as every sync locks them (two syncs at once never deadlock).
        cursor.execute(f"SELECT id, code, name, periodic_task_id, catch_up, timezone, removed_at FROM {JOB} AS job"
                       f" WHERE {IS_TRACKED} ORDER BY id FOR UPDATE")
        rows = {row[1]: row for row in cursor.fetchall()}
        cursor.execute(f"SELECT name, code FROM {JOB}")
        names = {name: code for name, code in cursor.fetchall()}
        for code, candidate in codes.items():
            row = rows.get(code)
            taken = reserved | {name for name, holder in names.items() if holder != code}
            name = name_for(candidate, taken)
            if row is None:
                cursor.execute(
                    f"""
                    INSERT INTO {JOB} (name, code, task, pattern, overlap, timezone, description, paused, catch_up,
                        periodic_task_id, fence, max_retries, alert_after, consecutive_failures, last_status,
                        schedule_version, created_at, updated_at)
                    VALUES (%s, %s, %s, %s, %s, %s, %s, false, %s, %s, 0, 0, 1, 0, '', 1, now(), now())
                    ON CONFLICT DO NOTHING
                    """,
                    [name, code, alias(code), enums.ExecutionPattern.STANDARD, enums.Overlap.ALLOW, candidate.timezone,
                     f"The periodic task {candidate.name!r} ({candidate.task}), tracked", candidate.catch_up,
                     candidate.periodic_task_id])
                if cursor.rowcount == 1:  # else another beat linked it this instant, or took the name
                    names[name] = code
                    linked.append(code)
                continue
            _, _, old_name, linked_to, old_catch_up, old_timezone, removed = row
            if (linked_to, old_name, old_catch_up, old_timezone, removed) == (
                    candidate.periodic_task_id, name, candidate.catch_up, candidate.timezone, None):
                continue
            cursor.execute(
                f"""UPDATE {JOB} SET periodic_task_id = %s, name = %s, catch_up = %s, timezone = %s, updated_at = now(),
                        removed_at = NULL,
                        schedule_version = schedule_version + CASE WHEN periodic_task_id IS NULL THEN 1 ELSE 0 END
                     WHERE code = %s""",
                [candidate.periodic_task_id, name, candidate.catch_up, candidate.timezone, code])
            names.pop(old_name, None)
            names[name] = code
            if linked_to is None:
                linked.append(code)
    return linked


def linked_code(periodic_task_id: int) -> str | None:
    """The code of the tracked job linked to this periodic task now; None when it is not tracked."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT code FROM {JOB} AS job WHERE job.periodic_task_id = %s AND {IS_TRACKED}",
                       [periodic_task_id])
        row = cursor.fetchone()
    return None if row is None else str(row[0])


def read_again_with_problems() -> int:
    """Mark every linked tracked row with a problem for the next ``apply_edits`` to read again (at a beat's
    start and a sync): what it said may no longer hold (its task registered by a deploy since)."""
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {JOB} AS job SET schedule_version = schedule_version + 1 WHERE {IS_TRACKED}"
                       " AND job.periodic_task_id IS NOT NULL AND job.schedule_problem <> ''")
        return int(cursor.rowcount)


def any_rows() -> bool:
    """Whether a tracked periodic task's job row exists, linked or not."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {JOB} AS job WHERE {IS_TRACKED})")
        row = cursor.fetchone()
    return bool(row and row[0])


def unlink_others(keep: set[int], *, source: str, spare: frozenset[str] = frozenset()) -> list[str]:
    """The tracked rows whose periodic task is gone or no longer tracked: unlinked, never due again, and
    marked removed (``removed_at``), so what they left waiting is closed SKIPPED (REMOVED), unalerted, as
    for a job removed from the code (``removals``). Their history stays; the periodic task, if it is
    still there, is sent untracked again. A row whose code is in ``spare`` (a job declared in code takes
    it over) is left as it is. Returns their codes."""
    with transaction.atomic(), connection.cursor() as cursor:
        audit.set_author(source=source, cursor=cursor)
        cursor.execute(
            f"""
            WITH gone AS (
                SELECT id FROM {JOB} AS job
                 WHERE {IS_TRACKED} AND (job.periodic_task_id IS NOT NULL OR job.next_run_at IS NOT NULL)
                   AND NOT (coalesce(job.periodic_task_id, -1) = ANY(%s::bigint[])) AND job.code <> ALL(%s)
                 ORDER BY id FOR UPDATE
            )
            UPDATE {JOB} AS job SET periodic_task_id = NULL, next_run_at = NULL, updated_at = now(),
                   removed_at = coalesce(job.removed_at, now())
              FROM gone WHERE job.id = gone.id
            RETURNING job.code
            """,
            [sorted(keep), sorted(spare)],
        )
        return sorted(str(row[0]) for row in cursor.fetchall())


def load_job(name_or_code: str) -> registry.Job | None:
    """The declaration of a tracked job, read from its row (by name or code); None when there is none."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""SELECT name, code, task, timezone, description, catch_up, schedule, schedule_timezone, alert_after,
                       alert_repeat, start_deadline, max_runtime, min_runtime, pattern, overlap
                  FROM {JOB} AS job WHERE (job.code = %s OR job.name = %s) AND {IS_TRACKED}
                 ORDER BY (job.code = %s) DESC LIMIT 1""",
            [name_or_code, name_or_code, name_or_code])
        row = cursor.fetchone()
    if row is None:
        return None
    (name, code, task, tz, description, catch_up, expression, schedule_tz, alert_after, alert_repeat,
     start_deadline, max_runtime, min_runtime, pattern, overlap) = row
    schedule: schedules.Schedule | None = None
    if expression:
        try:
            schedule = schedules.parse_expression(expression, schedule_tz or tz)
        except (exceptions.CronCeleryError, ValueError):
            schedule = None  # the beat keeps it aside as a schedule problem; a run still needs its job
    return registry.Job(
        name=name, code=code, task_name=task, pattern=enums.ExecutionPattern(pattern), overlap=enums.Overlap(overlap),
        timezone=tz, description=description, schedule=schedule, catch_up=enums.CatchUp(catch_up),
        alert_after=int(alert_after or 1), alert_repeat=alert_repeat, start_deadline=start_deadline,
        max_runtime=max_runtime, min_runtime=min_runtime, tracked=True,
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Contents:
    """What a tracked job's message carries: the periodic task's task, arguments, options and headers."""

    task: str
    args: list[Any]
    kwargs: dict[str, Any]
    options: dict[str, Any]
    headers: dict[str, Any]


_contents: dict[str, tuple[float, Contents]] = {}
_contents_lock = threading.Lock()


def contents(code: str) -> Contents:
    """What the messages of tracked job ``code`` carry now (kept ``CONTENTS_SECONDS``). Raises
    ``UnknownJob`` when its periodic task is gone, ``InvalidParams`` when its arguments do not read."""
    now = time.monotonic()
    with _contents_lock:
        kept = _contents.get(code)
    if kept is not None and now - kept[0] < CONTENTS_SECONDS:
        return kept[1]
    with connection.cursor() as cursor:
        cursor.execute(
            f"""SELECT task.task, task.args, task.kwargs, task.queue, task.exchange, task.routing_key, task.priority,
                       task.headers, task.expire_seconds, task.expires, task.name
                  FROM {JOB} AS job JOIN {TASK} AS task ON task.id = job.periodic_task_id
                 WHERE job.code = %s""",
            [code])
        row = cursor.fetchone()
    if row is None:
        raise exceptions.UnknownJob(name=code, known="(its periodic task is gone or no longer tracked)")
    task_name, args, kwargs, *routing, headers, expire_seconds, expires, periodic_name = row
    message, problem, _ = read_message(args, kwargs, None)
    if message is None:
        raise exceptions.InvalidParams(problem, job=code, field="args")
    options = {key: value for key, value in zip(_ROUTING, routing, strict=True) if value not in (None, "")}
    if expire_seconds is not None:
        options["expires"] = int(expire_seconds)
    elif expires is not None:
        options["expires"] = expires
    try:
        extra = storable.loads(headers or "{}")
    except ValueError:
        extra = {}
    # As django-celery-beat's scheduler sends it: the periodic task's name in the headers (django-celery-results
    # keeps it on its result row), then the periodic task's own headers.
    found = Contents(task=str(task_name), args=list(message["args"]), kwargs=dict(message["kwargs"]), options=options,
                     headers={"periodic_task_name": str(periodic_name), **(extra if isinstance(extra, dict) else {})})
    with _contents_lock:
        _contents[code] = (now, found)
    return found


def read_message(args: str | None, kwargs: str | None, stored: dict[str, Any] | None
                 ) -> tuple[dict[str, Any] | None, str, bool]:
    """A tracked periodic task's ``args`` and ``kwargs`` (JSON text) read as the values its runs are
    called with, ``{"args": [...], "kwargs": {...}}``: (the values to keep on the job's row, the
    problem in words or '', whether those values can run). Text that is not a JSON list (args) or
    object (kwargs), or holds what PostgreSQL cannot store, leaves the job its ``stored`` values."""
    problems = []
    values: dict[str, Any] = {}
    for field, text, kind, default in (("args", args, list, "[]"), ("kwargs", kwargs, dict, "{}")):
        try:
            value = storable.loads(text or default)
        except ValueError as error:
            problems.append(f"{field}: not JSON ({str(error)[:200]})")
            continue
        if not isinstance(value, kind):
            wanted = "list" if kind is list else "object"
            problems.append(f"{field}: a JSON {wanted} is needed, not {json.dumps(value)[:80]}")
            continue
        found = storable.json_problem(value)
        if found:
            problems.append(f"{field}: {found}")
            continue
        values[field] = value
    if problems:
        return stored, "; ".join(problems), stored is not None
    return values, "", True
