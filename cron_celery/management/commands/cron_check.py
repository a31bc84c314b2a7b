"""``manage.py cron_check``: exit 0 when healthy, else 1 with one line per problem."""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand

from cron_celery.beat import health


class Command(BaseCommand):
    help = (
        "Check what the health endpoint checks — a leading beat seen recently, no job overdue — "
        "and exit 1 with one line per problem (for shell monitoring), 0 when all is well."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        report = health.check()
        if report.ok:
            self.stdout.write(self.style.SUCCESS("cron: ok"))
            return
        for reason in report.reasons:
            self.stderr.write(f"cron: {reason}")
        sys.exit(1)
