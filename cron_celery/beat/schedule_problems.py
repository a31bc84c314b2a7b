"""Why a schedule cannot drive a job, and what happens to that job meanwhile.

A periodic task's schedule row is read as ours (``read_schedule``): it must be a crontab
or an interval of whole seconds that parses and fires at all; its ``kwargs`` must be values of
the job's parameters (``read_kwargs``). ``schedule_sync.apply_edits`` refuses an edit that is
not, for that job alone; ``set_aside`` parks a due job whose stored
schedule the beat cannot plan. Either way the reason is stored in
``CronJob.schedule_problem`` and each new reason is told to the job's failure channels
(``schedule_alerts.schedule_problem``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import logging

from django.db import connection, transaction
from django.db.models import F
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from cron_celery import exceptions, models, schedules, slots
from cron_celery.alerts import schedule_alerts
from cron_celery.decisions import audit, edit_writes, executions
from cron_celery.declaring import params, registry, storable

logger = logging.getLogger(__name__)

JOB = models.CronJob._meta.db_table
TASK = PeriodicTask._meta.db_table

_PERIOD_SECONDS = {
    IntervalSchedule.DAYS: 86400, IntervalSchedule.HOURS: 3600,
    IntervalSchedule.MINUTES: 60, IntervalSchedule.SECONDS: 1,
}


def effective_schedule(
    crontab: tuple[str, str, str, str, str, str] | None, interval: tuple[int, str] | None
) -> schedules.Schedule:
    """Our schedule for a periodic task's crontab row or interval row."""
    if crontab is not None:
        minute, hour, day_of_month, month_of_year, day_of_week, tz = crontab
        return schedules.Cron(minute, hour, day_of_month, month_of_year, day_of_week, timezone=str(tz or "UTC"))
    if interval is not None:
        every, period = interval
        if period not in _PERIOD_SECONDS:
            raise exceptions.InvalidSchedule("intervals of days, hours, minutes or seconds only", value=period)
        return schedules.Interval(int(every) * _PERIOD_SECONDS[period])
    raise exceptions.InvalidSchedule("cron jobs run on a crontab or an interval schedule (not solar or clocked)",
                                     value="")


@dataclasses.dataclass(frozen=True)
class Reading:
    """A periodic task's schedule row read as ours: the schedule and its first slot after
    ``now``, or — when the row cannot drive a job — ``problem``, in words."""

    schedule: schedules.Schedule | None
    first: dt.datetime | None
    problem: str = ""


def read_schedule(crontab: tuple[str, str, str, str, str, str] | None, interval: tuple[int, str] | None,
                  now: dt.datetime) -> Reading:
    """Whether a periodic task's schedule can drive a job: it must parse (fields, timezone,
    a crontab or a whole-second interval of at least a second) and fire at all."""
    try:
        schedule = effective_schedule(crontab, interval)
        return Reading(schedule, schedule.next_after(now))
    except Exception as error:  # whatever the row holds, it must stop this job only
        reason = str(error) if isinstance(error, exceptions.InvalidSchedule) else f"{type(error).__name__}: {error}"
        return Reading(None, None, f"{_row_in_words(crontab, interval)}: {reason}")


def _row_in_words(crontab: tuple[str, str, str, str, str, str] | None, interval: tuple[int, str] | None) -> str:
    if crontab is not None:
        return f"crontab {' '.join(str(field) for field in crontab[:5])} ({crontab[5] or 'UTC'})"
    if interval is not None:
        return f"interval every {interval[0]} {interval[1]}"
    return "a solar or clocked schedule"


def read_kwargs(code: str, kwargs: str | None, stored: dict[str, object] | None
                ) -> tuple[dict[str, object] | None, str, bool]:
    """A periodic task's ``kwargs`` read as the values of its job's scheduled runs, checked against
    the job's parameters: (the values to keep on the job's row, the problem in words or '', whether
    those values can run). Refused kwargs leave the job its ``stored`` values; when even those no
    longer fit (a required parameter without a value, a name the code dropped) nothing can run.
    A job not declared in this process keeps what it has: there is nothing to check against."""
    try:
        job = registry.get(code)
    except exceptions.UnknownJob:
        return stored, "", True
    try:
        values = params.from_kwargs(job.parameters, kwargs or "{}", job=job.name, tz=job.tzinfo)
    except Exception as error:  # InvalidParams, or whatever else the text holds: this job's problem only
        if not isinstance(error, exceptions.InvalidParams):
            error = exceptions.InvalidParams(f"{type(error).__name__}: {error}"[:500], job=job.name, field="kwargs")
        try:
            params.resolve(job.parameters, stored, job=job.name, tz=job.tzinfo)
        except exceptions.InvalidParams:
            return stored, f"kwargs: {error}", False
        return stored, f"kwargs: {error}", True
    return (dict(values) if values else None), "", True


def recheck_params() -> int:
    """At a sync (a beat's start, ``sync_cron_schedules``), after a deploy may have changed the
    jobs' parameters: mark for ``apply_edits`` each linked job whose periodic task's kwargs no
    longer read as the values on its row, or whose refusal is new or gone. Jobs with default
    kwargs, no values and no parameters are not even read. Returns how many were marked."""
    with_parameters = [job.code for job in registry.all_jobs() if job.parameters]
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT job.id, job.code, task.kwargs, job.params, job.schedule_problem
            FROM {JOB} AS job JOIN {TASK} AS task ON task.id = job.periodic_task_id
            WHERE task.kwargs NOT IN ('', '{{}}') OR job.params IS NOT NULL OR job.code = ANY(%s)
            """,
            [with_parameters],
        )
        rows = cursor.fetchall()
    marked = []
    for job_id, code, kwargs, stored, known_problem in rows:
        before = executions.loaded(stored)
        values, refused, _runnable = read_kwargs(code, kwargs, before)
        if (refused not in known_problem) if refused else (values != before or "kwargs: " in known_problem):
            marked.append(job_id)
    if marked:
        models.CronJob.objects.filter(id__in=marked).update(schedule_version=F("schedule_version") + 1)
    return len(marked)


def refuse_past_the_end(next_at: dt.datetime | None, opens: dt.datetime | None, jitter_ms: int) -> None:
    """``InvalidSchedule`` when the job would fall due after the calendar's end: its next slot, or
    its window's start, plus its jitter (``due_at``) is past 9999-12-31."""
    latest = max((moment for moment in (next_at, opens) if moment is not None), default=None)
    if latest is None:
        return
    try:
        latest + dt.timedelta(milliseconds=jitter_ms)
    except OverflowError:
        raise exceptions.InvalidSchedule(f"{slots.iso(latest)} plus its jitter ({jitter_ms} ms) is after the "
                                         "calendar ends", value=slots.iso(latest)) from None


def previous_next(stored: str, stored_tz: str, now: dt.datetime) -> dt.datetime | None:
    """The next slot of the schedule the job had before the refused edit, if it had one."""
    if not stored:
        return None
    try:
        return schedules.parse_expression(stored, stored_tz or None).next_after(now)
    except Exception:  # a stored schedule nothing can plan: the job waits for a usable edit
        return None


def unreadable(kept: edit_writes.Update, *, code: str, name: str, known: str, error: Exception
               ) -> tuple[edit_writes.Update, Problem | None]:
    """A job whose edit could not even be read (``kept``: its row as it is): it keeps everything it
    had, the edit is marked seen, the reason stored and logged, and alerted when it is new."""
    reason = str(error) if isinstance(error, exceptions.CronCeleryError) else f"{type(error).__name__}: {error}"
    problem = storable.shown(f"the edit cannot be applied: {reason}")[:2000]
    logger.error("cron job %s: its periodic task's edit cannot be applied (%s); keeping %r until it is fixed",
                 name, problem, kept.schedule)
    found = None if problem == known else Problem(code=code, name=name, problem=problem,
                                                  kept=f"keeping {kept.schedule!r}")
    return dataclasses.replace(kept, problem=problem), found


@dataclasses.dataclass(frozen=True, kw_only=True)
class Problem:
    """A job whose schedule cannot drive it, newly found: what to tell its failure channels."""

    code: str
    name: str
    problem: str
    kept: str  # what the job does meanwhile: "keeping '<its previous schedule>'", "paused" or "disabled"


def alert(found: list[Problem]) -> None:
    """Tell each job's failure channels, once the rows that say so are committed."""
    for item in found:
        try:
            job: registry.Job | None = registry.get(item.code)
        except exceptions.UnknownJob:
            job = None
        transaction.on_commit(functools.partial(
            schedule_alerts.schedule_problem, job, code=item.code, name=item.name, problem=item.problem,
            state=f"{item.kept} until the schedule is fixed"))


def set_aside(problems: dict[int, str]) -> int:
    """Jobs whose schedule in effect cannot be planned any more (a row written outside the
    sync, say): no next slot, paused, the reason stored and alerted — so they stop being
    due and every other job keeps its slots. Returns how many were set aside."""
    if not problems:
        return 0
    with transaction.atomic(), connection.cursor() as cursor:
        audit.set_author(source=audit.SCHEDULE_PROBLEM, cursor=cursor, keep=True)  # the pause, in the audit log
        cursor.execute(
            f"""
            UPDATE {JOB} AS job
               SET next_run_at = NULL, paused = TRUE, schedule_problem = d.problem
              FROM unnest(%s::bigint[], %s::text[]) AS d(job_id, problem)
             WHERE job.id = d.job_id
            RETURNING job.code, job.name, job.schedule_problem
            """,
            [list(problems), list(problems.values())],
        )
        rows = cursor.fetchall()
    for _code, name, problem in rows:
        logger.error("cron job %s: %s; paused until its schedule is fixed", name, problem)
    alert([Problem(code=code, name=name, problem=problem, kept="paused") for code, name, problem in rows])
    return len(rows)


def log_outstanding() -> int:
    """Say again, when a beat starts, which jobs still have an edit that was not applied."""
    found = list(models.CronJob.objects.exclude(schedule_problem="").values_list("name", "schedule_problem", "paused"))
    for name, problem, paused in found:
        logger.error("cron job %s: its schedule edit is still not applied (%s); %s", name, problem,
                     "paused" if paused else "on its previous schedule")
    return len(found)
