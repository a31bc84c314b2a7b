"""``manage.py reset_demo``: forget every recorded run and empty the Celery queue.

Only for the demo's own database: it deletes all ``CronJob`` and ``CronExecution`` rows.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from cron_celery.models import CronExecution, CronJob


class Command(BaseCommand):
    help = "Delete all cron jobs and executions of this (demo) database and purge the Celery queue."

    def handle(self, *args: Any, **options: Any) -> None:
        from celery import current_app

        executions = CronExecution.objects.count()
        # Job rows are recreated from their declarations on the next run; ids keep growing,
        # so a stale message can never claim a new execution.
        CronJob.objects.all().delete()
        purged = current_app.control.purge()
        queue = current_app.conf.task_default_queue
        self.stdout.write(f"Deleted {executions} executions; purged {purged} messages from queue {queue!r}.")
