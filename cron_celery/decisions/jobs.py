"""The job rows of declared jobs: create or refresh them from their declarations, and map a
row id to its declaration and back.

Each process keeps the row ids of the jobs it has seen (``job_id``), so a run costs no
lookup; the row is keyed by the job's code (its stable id), so renaming a job keeps its
history. Everything that needs a job's row id — the run, the beat, schedule sync, the
admin, the reconciler — asks here.
"""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, connection, transaction

from cron_celery import exceptions
from cron_celery.decisions import audit, executions
from cron_celery.declaring import registry

JOB = executions.JOB
_job_ids: dict[registry.Job, int] = {}

#: The columns a declaration sets; a row whose values all match is left alone (not even touched).
_DECLARED = ("name", "task", "pattern", "overlap", "timezone", "description", "catch_up", "max_retries",
             "alert_after", "alert_repeat", "max_concurrency", "concurrency_group", "jitter_ms", "start_deadline",
             "max_runtime", "min_runtime", "catch_up_window", "pause_after_failures")
_INSERT = (f"INSERT INTO {JOB} AS job (name, code, {', '.join(_DECLARED[1:])}, paused, fence,"
           " consecutive_failures, last_status, created_at, updated_at)")
_REFRESH = (f"ON CONFLICT (code) DO UPDATE SET {', '.join(f'{c} = EXCLUDED.{c}' for c in _DECLARED)},"
            " updated_at = now()"
            f" WHERE ({', '.join(f'job.{c}' for c in _DECLARED)})"
            f" IS DISTINCT FROM ({', '.join(f'EXCLUDED.{c}' for c in _DECLARED)})")


def ensure_job(job: registry.Job) -> int:
    """Create or refresh the job's row from its declaration and return its id.

    The row is keyed by the job's code (its stable id): renaming a job keeps its history.
    A stale row that still holds the name under another code is renamed out of the way.
    """
    params: list[str | int | float | None] = [
        job.name, job.code, job.task_name, job.pattern, job.overlap, job.timezone, job.description, job.catch_up,
        job.max_retries, job.alert_after, job.alert_repeat, job.limit, job.concurrency_group or "", job.jitter_ms,
        job.start_deadline, job.max_runtime, job.min_runtime, job.catch_up_window, job.pause_after_failures]
    upsert = f"""
        {_INSERT}
        VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s::float8, %s::float8, %s::float8,
                %s::float8, %s::int, false, 0, 0, '', now(), now())
        {_REFRESH}
        RETURNING id
        """
    for attempt in range(3):
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                # A declared value that changes (max_concurrency, ...) is a schedule change of the audit log.
                audit.set_author(source=audit.DECLARED, cursor=cursor, keep=True)
                if attempt:
                    cursor.execute(
                        f"UPDATE {JOB} SET name = left(name, 80) || '-was-' || code"
                        " WHERE name = %s AND code <> %s",
                        [job.name, job.code],
                    )
                cursor.execute(upsert, params)
                row = cursor.fetchone()
                if row is None:  # unchanged: ON CONFLICT ... WHERE false returns nothing
                    cursor.execute(f"SELECT id FROM {JOB} WHERE code = %s", [job.code])
                    row = cursor.fetchone()
            assert row is not None
            return int(row[0])
        except IntegrityError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def ensure_jobs(jobs: list[registry.Job]) -> dict[str, int]:
    """``ensure_job`` for many jobs in one statement; returns row ids by code.

    A name held by a stale row under another code (a renamed job) makes the statement
    fail; then each job goes through ``ensure_job``, which moves the stale name aside.
    """
    if not jobs:
        return {}
    fields = ("name", "code", "task_name", "pattern", "overlap", "timezone", "description", "catch_up")
    columns: list[list[Any]] = [[str(getattr(job, field)) for job in jobs] for field in fields]
    columns.append([job.max_retries for job in jobs])
    columns.append([job.alert_after for job in jobs])
    columns.append([job.alert_repeat for job in jobs])
    columns.append([job.limit for job in jobs])
    columns.append([job.concurrency_group or "" for job in jobs])
    columns.append([job.jitter_ms for job in jobs])
    for field in ("start_deadline", "max_runtime", "min_runtime", "catch_up_window"):
        columns.append([getattr(job, field) for job in jobs])
    columns.append([job.pause_after_failures for job in jobs])
    try:
        # A declared value that changes (max_concurrency, ...) is a schedule change of the audit log:
        # the statement names its source itself (its author CTE runs before the rows are written).
        author, named = audit.author_sql(source=audit.DECLARED, keep=True)
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                f"""
                WITH author AS MATERIALIZED ({author})
                {_INSERT}
                SELECT d.*, false, 0, 0, '', now(), now()
                FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::text[],
                            %s::text[], %s::int[], %s::int[], %s::int[], %s::int[], %s::text[], %s::int[],
                            %s::float8[], %s::float8[], %s::float8[], %s::float8[], %s::int[]) AS d, author
                {_REFRESH}
                """,
                [*named, *columns],
            )
            cursor.execute(f"SELECT code, id FROM {JOB} WHERE code = ANY(%s)", [columns[1]])
            return {code: int(job_id) for code, job_id in cursor.fetchall()}
    except IntegrityError:
        return {job.code: ensure_job(job) for job in jobs}


def scheduled_params(job: registry.Job) -> dict[str, Any] | None:
    """The job's parameter values in effect for its scheduled runs: its periodic task's kwargs, as
    ``schedule_sync.apply_edits`` checked and copied them onto the row (None: none)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT params FROM {JOB} WHERE id = %s", [job_id(job)])
        row = cursor.fetchone()
    return executions.loaded(row[0]) if row else None


def job_code(job_id: int) -> str | None:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT code FROM {JOB} WHERE id = %s", [job_id])
        row = cursor.fetchone()
    return str(row[0]) if row else None



def refresh_job_ids(jobs: list[registry.Job]) -> dict[str, int]:
    """Create or refresh many jobs' rows at once (a beat starting with thousands of jobs)."""
    ids = ensure_jobs(jobs)
    for job in jobs:
        _job_ids[job] = ids[job.code]
    return ids


def job_for_row(row_id: int) -> registry.Job | None:
    """The declaration of the job with this row id (None: not declared in this process)."""
    for job, known in _job_ids.items():
        if known == row_id:
            return job
    code = job_code(row_id)
    if code is None:
        return None
    try:
        return registry.get(code)
    except exceptions.UnknownJob:
        return None


def jobs_by_row_id() -> dict[int, registry.Job]:
    """The declarations this process knows, by row id."""
    return {row_id: job for job, row_id in _job_ids.items()}


def job_id(job: registry.Job, *, refresh: bool = False) -> int:
    """The job's row id, creating or refreshing the row once per process. A tracked periodic task's row
    is written by its tracking only (``tracked``): read, never refreshed from a declaration read of it."""
    if refresh or job not in _job_ids:
        _job_ids[job] = _tracked_row(job) if job.tracked else ensure_job(job)
    return _job_ids[job]


def _tracked_row(job: registry.Job) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id FROM {JOB} WHERE code = %s", [job.code])
        row = cursor.fetchone()
    if row is None:
        raise exceptions.UnknownJob(name=job.code, known="(a tracked periodic task whose job row is gone)")
    return int(row[0])
