"""``manage.py reconcile_cron``: one reconciler pass, by hand or from an OS timer."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from cron_celery import reconciler


class Command(BaseCommand):
    help = (
        "Run one reconciler pass: executions whose lease expired become LOST (and are retried if "
        "attempts remain), messages that never reached a worker are sent again or recorded per the "
        "job's catch-up policy, and slots no beat dispatched are recorded MISSED. Workers do this "
        "every RECONCILE['INTERVAL'] seconds; several passes at once are safe."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        report = reconciler.run_pass()
        self.stdout.write(self.style.SUCCESS(f"Reconciled: {report}."))
