"""Deleting old history in batches: ``purge_cron_executions``, the daily retention job, and
the hourly tidying of what would otherwise grow for ever.

Only final executions are ever deleted — never PENDING, RUNNING or RETRYING — with their
alert rows, in batches of ``batch_size`` rows per statement (constant memory, short
locks). The built-in job ``cron-celery-retention`` runs every day at 03:17 UTC when
``CRON_CELERY["RETENTION_DAYS"]`` is set, deleting ``RETENTION_STATUSES`` older than that.

Whatever the history's retention, ``tidy`` (run by the reconciler once an hour) deletes the
heartbeat rows of beats gone for a week, the alert rows settled more than
``ALERT_RETENTION_DAYS`` ago (90 by default) and the schedule changes (the audit log) recorded
more than ``AUDIT_RETENTION_DAYS`` ago (730 by default). The per-job counters (``Tally``) have a row
per job, status and duration bucket, and an execution's attempt history at most one entry
per allowed attempt: neither grows with time.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Callable

from django.db import connection
from django.utils import timezone

from cron_celery import conf, enums, models

logger = logging.getLogger(__name__)
EXE = models.CronExecution._meta.db_table
JOB = models.CronJob._meta.db_table
ALERT = models.Alert._meta.db_table
BEAT = models.BeatHeartbeat._meta.db_table
HOUR, DURATIONS = models.Hour._meta.db_table, models.Durations._meta.db_table
CHANGES = models.ScheduleChange._meta.db_table
#: Statuses that are never deleted: the execution is not over.
OPEN = frozenset({enums.Status.PENDING, enums.Status.RUNNING, enums.Status.RETRYING})


@dataclasses.dataclass(frozen=True, kw_only=True)
class Purged:
    executions: int
    alerts: int
    batches: int


def statuses(text: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Validated statuses from "SUCCEEDED,SKIPPED" or a list; open ones are refused."""
    items = [item.strip().upper() for item in (text.split(",") if isinstance(text, str) else text) if item.strip()]
    known = {status.value for status in enums.Status}
    unknown = [item for item in items if item not in known]
    if unknown:
        raise ValueError(f"unknown status {', '.join(unknown)} (use {', '.join(sorted(known - OPEN))})")
    refused = [item for item in items if item in OPEN]
    if refused:
        raise ValueError(f"{', '.join(refused)} executions are not over and are never deleted")
    if not items:
        raise ValueError("name at least one status")
    return tuple(dict.fromkeys(items))


def count(before: dt.datetime, wanted: tuple[str, ...]) -> int:
    """How many executions ``purge`` would delete (job by job, through the slot index)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT coalesce(sum(n), 0) FROM {JOB} AS j CROSS JOIN LATERAL (
                SELECT count(*) AS n FROM {EXE} WHERE job_id = j.id AND slot < %s AND status = ANY(%s)) AS c
            """,
            [before, list(wanted)],
        )
        return int(cursor.fetchone()[0])


def purge(before: dt.datetime, wanted: tuple[str, ...], batch_size: int = 1000,
          progress: Callable[[int], None] | None = None) -> Purged:
    """Delete the executions with a slot before ``before`` and one of ``wanted`` statuses."""
    wanted = statuses(wanted)
    executions = alerts = batches = 0
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id FROM {JOB} ORDER BY id")
        job_ids = [int(row[0]) for row in cursor.fetchall()]
    for job_id in job_ids:  # job by job: each batch is a range of the (job, slot) index
        while True:
            deleted, deleted_alerts = _purge_batch(job_id, before, wanted, batch_size)
            if not deleted:
                break
            executions += deleted
            alerts += deleted_alerts
            batches += 1
            if progress is not None:
                progress(executions)
    return Purged(executions=executions, alerts=alerts, batches=batches)


def _purge_batch(job_id: int, before: dt.datetime, wanted: tuple[str, ...], batch_size: int) -> tuple[int, int]:
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH doomed AS (
                SELECT id FROM {EXE} WHERE job_id = %s AND slot < %s AND status = ANY(%s) LIMIT %s
                FOR UPDATE SKIP LOCKED
            ), gone_alerts AS (
                DELETE FROM {ALERT} WHERE execution_id IN (SELECT id FROM doomed) RETURNING 1
            ), gone AS (
                DELETE FROM {EXE} WHERE id IN (SELECT id FROM doomed) RETURNING 1
            )
            SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM gone_alerts)
            """,
            [job_id, before, list(wanted), batch_size],
        )
        deleted, deleted_alerts = cursor.fetchone()
    return int(deleted), int(deleted_alerts)


#: A beat not seen for this long is gone: its heartbeat row is deleted (each beat process writes
#: its own, ``host:pid``, so restarts would otherwise add rows for ever).
HEARTBEAT_DAYS = 7


@dataclasses.dataclass(frozen=True, kw_only=True)
class Tidied:
    heartbeats: int
    alerts: int
    rollups: int = 0
    schedule_changes: int = 0


def tidy(batch: int) -> Tidied:
    """Delete what no page needs any more, at most ``batch`` rows of each: heartbeat rows of beats
    not seen for ``HEARTBEAT_DAYS`` and alert rows settled (sent, or given up) more than
    ``ALERT_RETENTION_DAYS`` ago, and schedule changes recorded more than ``AUDIT_RETENTION_DAYS``
    ago (the oldest first). Alerts still to be delivered are never deleted. Also the
    dashboard's rollups of slots older than ``models.ROLLUP_DAYS`` (all of them: at most a row
    per job an hour and a few per job a day age out, in a table of a few rows per job)."""
    days = conf.settings.ALERT_RETENTION_DAYS
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            DELETE FROM {BEAT} WHERE identity IN (
                SELECT identity FROM {BEAT} WHERE seen_at < now() - make_interval(days => %s) LIMIT %s)
            """,
            [HEARTBEAT_DAYS, batch],
        )
        heartbeats = cursor.rowcount
        alerts = 0
        if days:
            cursor.execute(
                f"""
                DELETE FROM {ALERT} WHERE id IN (
                    SELECT id FROM {ALERT} WHERE status <> 'PENDING'
                      AND updated_at < now() - make_interval(days => %s) LIMIT %s)
                """,
                [int(days), batch],
            )
            alerts = cursor.rowcount
        changes = 0
        audit_days = conf.settings.AUDIT_RETENTION_DAYS
        if audit_days:  # through the index on changed_at, the oldest first
            cursor.execute(
                f"""
                DELETE FROM {CHANGES} WHERE id IN (
                    SELECT id FROM {CHANGES} WHERE changed_at < now() - make_interval(days => %s)
                     ORDER BY changed_at LIMIT %s)
                """,
                [int(audit_days), batch],
            )
            changes = cursor.rowcount
        cursor.execute(f"DELETE FROM {HOUR} WHERE hour < now() - make_interval(days => %s)", [models.ROLLUP_DAYS])
        rollups = cursor.rowcount
        cursor.execute(f"DELETE FROM {DURATIONS} WHERE day < ((now() AT TIME ZONE 'UTC')::date - %s)",
                       [models.ROLLUP_DAYS])
        rollups += cursor.rowcount
    return Tidied(heartbeats=max(0, heartbeats), alerts=max(0, alerts), rollups=max(0, rollups),
                  schedule_changes=max(0, changes))

def run_retention() -> str:
    """The daily retention job's body."""
    days = conf.settings.RETENTION_DAYS
    if not days:
        return "RETENTION_DAYS is not set; nothing deleted"
    wanted = statuses(tuple(conf.settings.RETENTION_STATUSES))
    result = purge(timezone.now() - dt.timedelta(days=int(days)), wanted)
    return (f"deleted {result.executions} executions older than {days} days ({', '.join(wanted)}) "
            f"and {result.alerts} alerts")


JOB_NAME, JOB_CODE = "cron-celery-retention", "CC.RETENTION"


def declare_job() -> None:
    """Declare the built-in retention job (when ``RETENTION_DAYS`` is set; see ``apps``)."""
    from cron_celery.declaring import registry
    from cron_celery.run import decorators
    from cron_celery.run.runs import Run

    if registry.by_task_name("cron_celery.retention") is not None:
        return

    def retention(run: Run) -> str:
        """Deletes old execution history (CRON_CELERY["RETENTION_DAYS"])."""
        return run_retention()

    decorators.cron_task(name=JOB_NAME, code=JOB_CODE, task_name="cron_celery.retention", schedule="17 3 * * *",
                    timezone="UTC", catch_up="latest")(retention)
