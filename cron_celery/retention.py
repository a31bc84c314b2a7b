"""Deleting old history in batches: ``purge_cron_executions`` and the daily retention job.

Only final executions are ever deleted — never PENDING, RUNNING or RETRYING — with their
alert rows, in batches of ``batch_size`` rows per statement (constant memory, short
locks). The built-in job ``cron-celery-retention`` runs every day at 03:17 UTC when
``CRON_CELERY["RETENTION_DAYS"]`` is set, deleting ``RETENTION_STATUSES`` older than that.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Callable

from django.db import connection
from django.utils import timezone

from cron_celery import conf, models

logger = logging.getLogger(__name__)
EXE = models.CronExecution._meta.db_table
ALERT = models.Alert._meta.db_table
#: Statuses that are never deleted: the execution is not over.
OPEN = frozenset({models.Status.PENDING, models.Status.RUNNING, models.Status.RETRYING})


@dataclasses.dataclass(frozen=True, kw_only=True)
class Purged:
    executions: int
    alerts: int
    batches: int


def statuses(text: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Validated statuses from "SUCCEEDED,SKIPPED" or a list; open ones are refused."""
    items = [item.strip().upper() for item in (text.split(",") if isinstance(text, str) else text) if item.strip()]
    known = {status.value for status in models.Status}
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
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {EXE} WHERE slot < %s AND status = ANY(%s)", [before, list(wanted)])
        return int(cursor.fetchone()[0])


def purge(before: dt.datetime, wanted: tuple[str, ...], batch_size: int = 1000,
          progress: Callable[[int], None] | None = None) -> Purged:
    """Delete the executions with a slot before ``before`` and one of ``wanted`` statuses."""
    wanted = statuses(wanted)
    executions = alerts = batches = 0
    while True:
        with connection.cursor() as cursor:
            cursor.execute(
                f"""
                WITH doomed AS (
                    SELECT id FROM {EXE} WHERE slot < %s AND status = ANY(%s) ORDER BY id LIMIT %s
                    FOR UPDATE SKIP LOCKED
                ), gone_alerts AS (
                    DELETE FROM {ALERT} WHERE execution_id IN (SELECT id FROM doomed) RETURNING 1
                ), gone AS (
                    DELETE FROM {EXE} WHERE id IN (SELECT id FROM doomed) RETURNING 1
                )
                SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM gone_alerts)
                """,
                [before, list(wanted), batch_size],
            )
            deleted, deleted_alerts = cursor.fetchone()
        if not deleted:
            return Purged(executions=executions, alerts=alerts, batches=batches)
        executions += int(deleted)
        alerts += int(deleted_alerts)
        batches += 1
        if progress is not None:
            progress(executions)


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
    from cron_celery import registry, tasks
    from cron_celery.runs import Run

    if registry.by_task_name("cron_celery.retention") is not None:
        return

    def retention(run: Run) -> str:
        """Deletes old execution history (CRON_CELERY["RETENTION_DAYS"])."""
        return run_retention()

    tasks.cron_task(name=JOB_NAME, code=JOB_CODE, task_name="cron_celery.retention", schedule="17 3 * * *",
                    timezone="UTC", catch_up="latest")(retention)
