"""``manage.py show_executions``: the recorded executions as a table, oldest first."""

from __future__ import annotations

import datetime as dt
import zoneinfo
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from cron_celery.models import CronExecution

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
        parser.add_argument(
            "--expect", action="append", default=[], metavar="JOB=STATUS,STATUS",
            help="fail unless JOB's executions, by run number, have these statuses (repeatable)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        found = CronExecution.objects.select_related("job").order_by("-id")
        if options["job"]:
            found = found.filter(task_name=options["job"])
        executions = list(found[: options["limit"]])[::-1]
        if not executions:
            self.stdout.write("No executions recorded yet.")
        else:
            self._table(executions, options["width"])
        problems = [problem for spec in options["expect"] if (problem := self._check(spec))]
        if problems:
            raise CommandError("unexpected outcome: " + "; ".join(problems))
        if options["expect"]:
            self.stdout.write(self.style.SUCCESS("All executions ended as expected."))

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
        widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
        for index, row in enumerate(rows):
            line = "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip()
            self.stdout.write(line)
            if index == 0:
                self.stdout.write("  ".join("-" * w for w in widths))

    def _check(self, spec: str) -> str:
        job, _, statuses = spec.partition("=")
        wanted = [status.strip().upper() for status in statuses.split(",") if status.strip()]
        got = list(
            CronExecution.objects.filter(task_name=job.strip())
            .order_by("slot", "run_number")
            .values_list("status", flat=True)
        )
        if got != wanted:
            return f"{job}: expected {','.join(wanted) or 'no executions'}, got {','.join(got) or 'none'}"
        return ""
