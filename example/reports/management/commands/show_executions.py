"""``manage.py show_executions``: the recorded executions as a table, oldest first."""

from __future__ import annotations

import datetime as dt
import zoneinfo
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from cron_celery.models import CronExecution

from ...tables import table

HEADER = ("JOB", "SLOT", "RUN", "TRIES", "STATUS", "TRIGGER", "SKIP REASON", "DURATION", "MESSAGE")


def _duration(value: dt.timedelta | None) -> str:
    if value is None:
        return "-"
    seconds = value.total_seconds()
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def _shorten(text: str, width: int) -> str:
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= width else line[: width - 1] + "…"


class Command(BaseCommand):
    help = "Print the cron executions (job, slot, run, attempts, status, trigger, skip reason, duration, message)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--job", help="only this job (name)")
        parser.add_argument("--limit", type=int, default=50, help="the latest N executions (default 50)")
        parser.add_argument("--width", type=int, default=60, help="width of the message column")

    def handle(self, *args: Any, **options: Any) -> None:
        found = CronExecution.objects.select_related("job").order_by("-id")
        if options["job"]:
            found = found.filter(task_name=options["job"])
        executions = list(found[: options["limit"]])[::-1]
        if not executions:
            self.stdout.write("No executions recorded yet.")
        else:
            self._table(executions, options["width"])

    def _table(self, executions: list[CronExecution], width: int) -> None:
        rows: list[tuple[str, ...]] = [HEADER]
        for execution in executions:
            local = execution.slot.astimezone(zoneinfo.ZoneInfo(execution.job.timezone))
            message = execution.message
            if execution.error_code:
                message = f"[{execution.error_code}] {message}"
            rows.append((
                execution.task_name,
                f"{local:%Y-%m-%d %H:%M:%S} {local.tzname()}",
                f"#{execution.run_number}",
                str(execution.retry_count + 1),
                execution.status,
                execution.trigger,
                execution.skip_reason or "-",
                _duration(execution.duration),
                _shorten(message, width),
            ))
        for line in table(rows):
            self.stdout.write(line)
