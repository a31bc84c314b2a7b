"""Test jobs for admin edits that cannot drive a job and for execution dates across
timezones (imported by tests/jobsapp/tasks.py).

Declared only when CRON_TEST_EDITS is set, so that no other test's beat dispatches them.
"""

from __future__ import annotations

import os

from cron_celery import Run, cron_task
from cron_celery.schedules import cron, every

if os.environ.get("CRON_TEST_EDITS") == "1":

    @cron_task(name="edits-steady", code="E001", schedule=every(seconds=2), pattern="always", overlap="allow")
    def edits_steady(run: Run) -> str:
        """Every two seconds: it must keep its slots whatever happens to another job's schedule."""
        return f"slot {run.slot:%H:%M:%S}"

    @cron_task(name="edits-victim", code="E002", schedule=cron("* * * * *", timezone="UTC"), pattern="always",
               overlap="allow")
    def edits_victim(run: Run) -> str:
        """Every minute, on a crontab the tests edit into one that never fires."""
        return f"slot {run.slot:%H:%M}"

    @cron_task(name="edits-new-year", code="E003", schedule=cron("0 0 1 1 *", timezone="Pacific/Pago_Pago"),
               timezone="Pacific/Kiritimati", catch_up="latest")
    def edits_new_year(run: Run) -> str:
        """Midnight of New Year in Pago Pago (UTC-11) is 01:00 of 2 January in Kiritimati (UTC+14),
        the job's timezone: its execution date is 2 January, whoever writes the row."""
        return f"execution date {run.execution_date}"

    @cron_task(name="edits-params", code="E004", schedule=cron("* * * * *", timezone="UTC"), pattern="always",
               overlap="allow", jitter=5)
    def edits_params(run: Run, *, note: str = "", limit: int = 1) -> str:
        """Every minute, with parameters: the tests write kwargs into its periodic task that jsonb cannot hold."""
        return f"slot {run.slot:%H:%M} {note!r} {limit}"
