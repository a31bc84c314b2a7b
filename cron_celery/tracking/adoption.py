"""What a tracked periodic task looks like as a job declared in code (``adopt_periodic_tasks``).

The declaration keeps the tracked job's code (``PT<id>``): declared with it, the job takes over the
tracked row — its history, its next slot, its periodic task (see ``rows``) — with no gap and no
slot twice. Its body calls the task's own function with the periodic task's arguments. It is a
starting point for a person to review, not code run as it is written: a task that retries itself
(``self.retry()``) wants the declaration's retry policy instead.
"""

from __future__ import annotations

import dataclasses
import json
import keyword
import re
from typing import Any

from django.db.models import Q
from django_celery_beat.models import PeriodicTask

from cron_celery.decisions import tracked
from cron_celery.models import CronJob

_UNITS = {"days": "days", "hours": "hours", "minutes": "minutes", "seconds": "seconds"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Adoptable:
    """A tracked periodic task and its job: what ``adopt_periodic_tasks`` lists."""

    job: str
    code: str
    periodic_task: str
    task: str
    schedule: str
    declaration: str


def adoptable(names: list[str] | None = None) -> list[Adoptable]:
    """Every tracked periodic task on a crontab or an interval (those named by job name, code or periodic
    task name, when given). A clocked or solar one has no declaration: a job in code runs on a crontab or
    an interval (a clocked run is a one-off: ``run_cron_task NAME --at ... --schedule``)."""
    on_a_schedule = Q(periodic_task__crontab__isnull=False) | Q(periodic_task__interval__isnull=False)
    rows = (CronJob.objects.filter(on_a_schedule, task__startswith=tracked.ALIAS, periodic_task__isnull=False)
            .select_related("periodic_task__crontab", "periodic_task__interval").order_by("name"))
    found = []
    for row in rows:
        task = row.periodic_task
        assert task is not None
        if names and not {row.name, row.code, task.name} & set(names):
            continue
        found.append(Adoptable(job=row.name, code=row.code, periodic_task=task.name, task=task.task,
                               schedule=_schedule(task), declaration=declaration(row, task)))
    return found


def _schedule(task: PeriodicTask) -> str:
    """The schedule as the declaration writes it: a cron string, or ``every(...)``."""
    if task.crontab is not None:
        fields = (task.crontab.minute, task.crontab.hour, task.crontab.day_of_month, task.crontab.month_of_year,
                  task.crontab.day_of_week)
        return json.dumps(" ".join(str(field) for field in fields))
    assert task.interval is not None
    return f"every({_UNITS.get(task.interval.period, 'seconds')}={int(task.interval.every)})"


def _identifier(name: str) -> str:
    found = re.sub(r"\W", "_", name).strip("_").lower() or "job"
    found = f"job_{found}" if found[0].isdigit() else found
    return f"{found}_" if keyword.iskeyword(found) else found


def _arguments(task: PeriodicTask) -> str:
    values: list[str] = []
    try:
        args: Any = json.loads(task.args or "[]")
        kwargs: Any = json.loads(task.kwargs or "{}")
    except ValueError:
        return "*[], **{}  # its args and kwargs are not JSON: fill them in"
    values += [repr(value) for value in (args if isinstance(args, list) else [])]
    for key, value in (kwargs if isinstance(kwargs, dict) else {}).items():
        values.append(f"{key}={value!r}" if str(key).isidentifier() else f"**{{{key!r}: {value!r}}}")
    return ", ".join(values)


def declaration(row: CronJob, task: PeriodicTask) -> str:
    """The declaration of ``row``'s job in code, keeping its code, schedule, timezone, catch-up and routing."""
    function = _identifier(row.name)
    module, _, name = task.task.rpartition(".")
    options = [f"name={row.name!r}", f"code={row.code!r}", f"schedule={_schedule(task)}"]
    if task.crontab is not None:
        options.append(f"timezone={str(task.crontab.timezone or 'UTC')!r}")
    options += [f"catch_up={row.catch_up!r}", 'overlap="allow"']
    for field in ("queue", "exchange", "routing_key", "priority"):
        value = getattr(task, field, None)
        if value not in (None, ""):
            options.append(f"{field}={value!r}")
    head = f"@cron_task({', '.join(options)})"
    imported = f"from {module} import {name} as _{function}_task" if module else f"# import the task {task.task}"
    return "\n".join([
        imported,
        "",
        "",
        head,
        f"def {function}(run: Run) -> object:",
        f'    """Was the periodic task {task.name!r} ({task.task}), tracked as {row.code}."""',
        f"    return _{function}_task.run({_arguments(task)})",
    ])


def module_text(found: list[Adoptable]) -> str:
    """A module of declarations for ``--write``: review it, import it from a tasks module, deploy."""
    parts = ['"""Jobs declared from tracked periodic tasks by adopt_periodic_tasks: review before deploying."""',
             "", "from cron_celery import Run, cron_task", "from cron_celery.schedules import every  # noqa: F401",
             ""]
    for item in found:
        parts += ["", item.declaration, ""]
    return "\n".join(parts).rstrip() + "\n"
