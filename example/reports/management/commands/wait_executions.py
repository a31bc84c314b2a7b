"""``manage.py wait_executions``: wait until no execution is pending or running and no alert waits
to be delivered (then show the latest executions)."""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from cron_celery.models import Alert, AlertStatus, CronExecution, Status

from ...processes import alive

UNFINISHED = (Status.PENDING, Status.RUNNING, Status.RETRYING)


class Command(BaseCommand):
    help = ("Wait until no execution is pending or running and every alert is delivered; "
            "optionally print the latest outcomes.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--timeout", type=float, default=60.0, help="seconds (default 60)")
        parser.add_argument("--worker-pid", type=int, help="fail at once if this process dies")
        parser.add_argument("--show-last", type=int, default=0, metavar="N",
                            help="then print the outcome of the N latest executions")

    def handle(self, *args: Any, **options: Any) -> None:
        deadline = time.monotonic() + options["timeout"]
        worker = options["worker_pid"]
        while unfinished := _unfinished():
            if worker and not alive(worker):
                raise CommandError(f"the worker (pid {worker}) died; unfinished: {', '.join(unfinished)}")
            if time.monotonic() > deadline:
                raise CommandError(f"still unfinished after {options['timeout']:g} s: {', '.join(unfinished)}")
            time.sleep(0.2)
        latest = list(CronExecution.objects.order_by("-id")[: options["show_last"]])
        for execution in reversed(latest):
            code = f" [{execution.error_code}]" if execution.error_code else ""
            self.stdout.write(
                f"   -> {execution.task_name} run #{execution.run_number}: "
                f"{execution.status}{code} {execution.message}".rstrip()
            )


def _unfinished() -> list[str]:
    executions = CronExecution.objects.filter(status__in=UNFINISHED).values_list("id", flat=True)
    alerts = Alert.objects.filter(status=AlertStatus.PENDING).values_list("id", flat=True)
    return [*(f"execution {pk}" for pk in executions), *(f"alert {pk}" for pk in alerts)]
