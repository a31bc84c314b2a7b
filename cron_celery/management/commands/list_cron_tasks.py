"""``manage.py list_cron_tasks``: the registered jobs, their policies and last execution."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand
from django.utils import timezone

from cron_celery import enums, models, registry


class Command(BaseCommand):
    help = "List the registered cron jobs with their schedule, policies, next slot and last execution."

    def handle(self, *args: Any, **options: Any) -> None:
        jobs = registry.all_jobs()
        if not jobs:
            self.stdout.write("No cron jobs are registered (declare them in an app's tasks.py).")
            return
        last: dict[str, models.CronExecution] = {}
        for found in (
            models.CronExecution.objects.filter(task_name__in=[job.name for job in jobs])
            .exclude(status=enums.Status.SKIPPED)
            .order_by("task_name", "-created_at", "-id")
            .distinct("task_name")
        ):
            last[found.task_name] = found
        rows_by_code = {row.code: row for row in models.CronJob.objects.filter(code__in=[job.code for job in jobs])}
        now = timezone.now()
        header = ("NAME", "CODE", "SCHEDULE", "PATTERN", "OVERLAP", "TIMEZONE", "NEXT SLOT", "LAST SLOT",
                  "LAST STATUS")
        rows = [header]
        for job in jobs:
            execution = last.get(job.name)
            state = rows_by_code.get(job.code)
            schedule = job.schedule.expression if job.schedule else "-"
            upcoming = job.next_slot(now)
            if state is not None and state.schedule:  # the schedule in effect (it may be edited in the admin)
                schedule, upcoming = state.schedule, state.next_run_at
            rows.append((
                job.name,
                job.code,
                schedule,
                job.pattern.value,
                job.overlap.value,
                job.timezone,
                "paused" if state is not None and state.paused else f"{upcoming:%Y-%m-%d %H:%M}Z" if upcoming else "-",
                f"{execution.slot:%Y-%m-%d %H:%M}Z" if execution else "-",
                execution.status if execution else "never run",
            ))
        widths = [max(len(str(row[i])) for row in rows) for i in range(len(header))]
        for row in rows:
            self.stdout.write("  ".join(str(cell).ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
