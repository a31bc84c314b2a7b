"""``manage.py demo_schedules JOB... --every SECONDS``: edit jobs' schedules as in the admin.

The demo wants to see a job that runs every half hour run a few times in a minute, so it
does what an operator would do in the admin (Periodic tasks → the job's task → Interval
schedule): it points the job's periodic task at another interval. The beat notices the
edit within a second and moves the job's next slot; ``sync_cron_schedules`` keeps the
edit until the job's declaration in the code changes.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django_celery_beat.models import IntervalSchedule

from cron_celery.models import CronJob


class Command(BaseCommand):
    help = "Run the named jobs every SECONDS seconds, by editing their periodic tasks."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("jobs", nargs="+", metavar="JOB", help="job names")
        parser.add_argument("--every", type=int, required=True, metavar="SECONDS")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["every"] < 1:
            raise CommandError("--every is a number of seconds, at least 1")
        interval, _ = IntervalSchedule.objects.get_or_create(every=options["every"], period=IntervalSchedule.SECONDS)
        for name in options["jobs"]:
            job = CronJob.objects.select_related("periodic_task").filter(name=name).first()
            if job is None or job.periodic_task is None:
                raise CommandError(f"{name}: no scheduled job of that name; run sync_cron_schedules first")
            task = job.periodic_task
            task.interval, task.crontab = interval, None
            task.save()
            self.stdout.write(f"{name}: now every {options['every']} s (periodic task {task.name!r})")
