"""``manage.py purge_cron_executions --days N [--status S,S] [--batch-size N] [--dry-run]``."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from cron_celery import conf
from cron_celery.reconciler import retention


class Command(BaseCommand):
    help = (
        "Delete executions (and their alerts) whose slot is more than --days old, in batches. "
        "Only final statuses can be deleted: PENDING, RUNNING and RETRYING executions never are."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--days", type=int, required=True, help="keep this many days of history")
        parser.add_argument("--status", default=None,
                            help="comma-separated statuses to delete (default: the RETENTION_STATUSES setting, "
                                 "SUCCEEDED,SKIPPED unless changed)")
        parser.add_argument("--batch-size", type=int, default=1000, help="rows per DELETE (default 1000)")
        parser.add_argument("--dry-run", action="store_true", help="count what would be deleted; delete nothing")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["days"] < 0 or options["batch_size"] < 1:
            raise CommandError("--days must be 0 or more and --batch-size at least 1.")
        try:
            wanted = retention.statuses(options["status"] or conf.settings.RETENTION_STATUSES)
        except ValueError as error:
            raise CommandError(f"--status: {error}.") from None
        before = timezone.now() - dt.timedelta(days=options["days"])
        label = f"{', '.join(wanted)} executions with a slot before {before:%Y-%m-%d %H:%M} UTC"
        if options["dry_run"]:
            self.stdout.write(f"Would delete {retention.count(before, wanted)} {label} (dry run).")
            return
        result = retention.purge(before, wanted, options["batch_size"])
        self.stdout.write(self.style.SUCCESS(
            f"Deleted {result.executions} {label}, and {result.alerts} of their alerts, in {result.batches} batches."
        ))
