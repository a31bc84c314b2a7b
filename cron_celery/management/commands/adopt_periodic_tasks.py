"""``manage.py adopt_periodic_tasks``: the tracked periodic tasks, each as the job it would be in code.

With ``--write MODULE`` the declarations are written to a file to review. A job declared with a
tracked task's code (``PT<id>``) takes its history, next slot and periodic task over at the next
deploy, with no gap and no slot twice (see docs/migrating.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from cron_celery.tracking import adoption


class Command(BaseCommand):
    help = "List the tracked periodic tasks with their declarations in code; --write writes them to a module."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("names", nargs="*", help="job names, codes or periodic task names (default: all)")
        parser.add_argument("--write", metavar="MODULE", help="write the declarations to this file (a new one)")

    def handle(self, *args: Any, **options: Any) -> None:
        names = list(options["names"])
        found = adoption.adoptable(names or None)
        missing = [name for name in names if not any(name in (item.job, item.code, item.periodic_task)
                                                     for item in found)]
        if missing:
            raise CommandError(f"not a tracked periodic task: {', '.join(missing)} (see TRACK_PERIODIC_TASKS; "
                               "manage.py list_cron_tasks lists the jobs)")
        if not found:
            self.stdout.write("No periodic task is tracked (set CRON_CELERY['TRACK_PERIODIC_TASKS'] and start a beat).")
            return
        target = options.get("write")
        if target:
            path = Path(target)
            if path.exists():
                raise CommandError(f"{path} exists; choose a new file (nothing was written)")
            path.write_text(adoption.module_text(found), encoding="utf-8")
            self.stdout.write(f"Wrote {len(found)} declaration(s) to {path}. Review it, import it from a tasks "
                              "module, and deploy: each job takes over its tracked history (same code).")
            return
        for item in found:
            self.stdout.write(f"# {item.periodic_task} ({item.task}), {item.schedule}, job {item.job} ({item.code})")
            self.stdout.write(item.declaration)
            self.stdout.write("")
