"""CSV exports of the history and of the audit log, streamed, every cell safe from spreadsheet formulas."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator

from django.db.models import QuerySet

from cron_celery import models

CSV_FIELDS = ("id", "task_name", "task_code", "slot", "execution_date", "run_number", "status", "trigger",
              "skip_reason", "retry_count", "started", "ended", "error_code", "message", "worker", "fence",
              "celery_task_id", "params", "params_given")


class _Echo:
    def write(self, value: str) -> str:
        return value


#: A cell starting with one of these is a formula to a spreadsheet (OWASP, "CSV Injection").
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: object) -> object:
    """A value as a CSV cell that a spreadsheet shows as text: a string that would start a
    formula gets a leading ``'`` (job messages are whatever the job wrote)."""
    if value is None:
        return ""
    if isinstance(value, dict | list):  # a JSON column (params): as JSON, not as Python's repr
        value = json.dumps(value, ensure_ascii=False)
    if isinstance(value, str) and value.startswith(FORMULA_START):
        return "'" + value
    return value


def execution_rows(queryset: QuerySet[models.CronExecution]) -> Iterator[str]:
    """The rows as CSV lines, read in chunks: constant memory whatever the selection."""
    writer = csv.writer(_Echo())
    yield writer.writerow(CSV_FIELDS)
    for values in queryset.order_by("id").values_list(*CSV_FIELDS).iterator(chunk_size=2000):
        yield writer.writerow([csv_cell(value) for value in values])


SCHEDULE_CHANGE_CSV = ("id", "changed_at", "job_name", "job_code", "actor", "db_role", "application_name", "source",
                       "changes")


def schedule_change_rows(queryset: QuerySet[models.ScheduleChange]) -> Iterator[str]:
    writer = csv.writer(_Echo())
    yield writer.writerow(SCHEDULE_CHANGE_CSV)
    for values in queryset.order_by("id").values_list(*SCHEDULE_CHANGE_CSV).iterator(chunk_size=2000):
        yield writer.writerow([csv_cell(value) for value in values])
