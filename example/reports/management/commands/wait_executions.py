"""``manage.py wait_executions``: wait until no execution is pending or running and no alert waits
to be delivered."""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from cron_celery.models import Alert, AlertStatus, CronExecution, Status

from ...processes import alive


class Command(BaseCommand):
    help = "Wait until no execution is pending or running and every alert is delivered."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--timeout", type=float, default=60.0, help="seconds (default 60)")
        parser.add_argument("--worker-pid", type=int, help="fail at once if this process dies")

    def handle(self, *args: Any, **options: Any) -> None:
        deadline = time.monotonic() + options["timeout"]
        worker = options["worker_pid"]
        while unfinished := _unfinished():
            if worker and not alive(worker):
                raise CommandError(f"the worker (pid {worker}) died; unfinished: {', '.join(unfinished)}")
            if time.monotonic() > deadline:
                raise CommandError(f"still unfinished after {options['timeout']:g} s: {', '.join(unfinished)}")
            time.sleep(0.2)


def _unfinished() -> list[str]:
    executions = CronExecution.objects.exclude(status__in=Status.terminal()).values_list("id", flat=True)
    alerts = Alert.objects.filter(status=AlertStatus.PENDING).values_list("id", flat=True)
    return [*(f"execution {pk}" for pk in executions), *(f"alert {pk}" for pk in alerts)]
