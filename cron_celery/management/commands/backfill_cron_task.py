"""``manage.py backfill_cron_task NAME --from DATE --to DATE [--dry-run] [--force]``."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from cron_celery import exceptions
from cron_celery.declaring import registry
from cron_celery.run import backfill


class Command(BaseCommand):
    help = (
        "Send the job's slots between two dates (inclusive, in the job's timezone) to the workers, "
        "oldest first, with trigger BACKFILL. Slots that already ran are skipped unless --force."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("job", help="job name or code")
        parser.add_argument("--from", dest="start", required=True, help="first date, YYYY-MM-DD")
        parser.add_argument("--to", dest="end", required=True, help="last date, YYYY-MM-DD")
        parser.add_argument("--dry-run", action="store_true", help="list the slots; send nothing")
        parser.add_argument("--force", action="store_true", help="also send slots that already ran")
        parser.add_argument("--cascade", action="store_true",
                            help="each slot that succeeds runs the slot of the jobs declared after= it again")
        parser.add_argument("--limit", type=int, default=backfill.LIMIT,
                            help=f"refuse ranges with more slots than this (default {backfill.LIMIT})")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            job = registry.get(options["job"])
            plan = backfill.plan(job, options["start"], options["end"], force=options["force"],
                                 limit=options["limit"], cascade=options["cascade"])
        except exceptions.CronCeleryError as error:
            raise CommandError(str(error)) from None
        skipped = f", {len(plan.done)} already ran" if plan.done else ""
        skipped += f", {plan.outside} outside the job's active window left out" if plan.outside else ""
        if options["dry_run"]:
            for slot in plan.slots:
                self.stdout.write(f"{job.name} {_show(slot)}")
            self.stdout.write(f"Would send {len(plan.slots)} slots of {job.name}{skipped} (dry run).")
            return
        try:
            sent = backfill.send(job, plan)
        except exceptions.CronCeleryError as error:
            raise CommandError(str(error)) from None
        self.stdout.write(self.style.SUCCESS(f"Sent {len(sent)} slots of {job.name} to the workers{skipped}."))


def _show(slot: dt.datetime) -> str:
    return slot.strftime("%Y-%m-%dT%H:%M:%SZ")
