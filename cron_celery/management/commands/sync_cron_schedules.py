"""``manage.py sync_cron_schedules``: write the schedules declared in code to django-celery-beat."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from cron_celery.beat import schedule_sync
from cron_celery.decisions import audit, leadership


class Command(BaseCommand):
    help = (
        "Give every scheduled cron job its django-celery-beat periodic task. A schedule edited in "
        "the admin is kept unless the job's declaration in code changed since the last sync; jobs "
        "removed from the code are disabled, not deleted. A beat does this when it starts."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        # The database's clock, as the beat's; the audit log names this command as the source.
        report = schedule_sync.sync(leadership.database_now(), source=audit.DEPLOY_COMMAND)
        for title, names in (("created", report.created), ("updated from code", report.updated),
                             ("disabled (gone from the code)", report.disabled)):
            for name in names:
                self.stdout.write(f"{title}: {name}")
        self.stdout.write(self.style.SUCCESS(f"Schedules synced: {report}."))
