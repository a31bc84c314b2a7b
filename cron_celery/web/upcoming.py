"""What is about to run: the slots of the next hour across all jobs, for the admin's "upcoming"
page. Read from the job rows (the index on ``next_run_at``) and each job's schedule in effect
and window, never from the history; and the one-off runs waiting to be sent in that hour.

The work is bounded whatever the schedules: at most ``PER_JOB`` slots are walked per job, the
rest of its hour is counted (by arithmetic for intervals), jobs that share a schedule, timezone
and next slot share one plan, and a job the beat has left behind is one line saying since when,
not the hours of slots it missed.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from django.db.models import F

from cron_celery import conf, exceptions, models, schedules
from cron_celery.decisions import oneoffs

#: Slots listed per job; a job that runs more often says how many more it has in the hour.
PER_JOB = 5
#: Jobs read at most (the earliest next slots first).
MAX_JOBS = 500
#: Slots counted at most per plan beyond those listed (a cron schedule has at most 60 an hour).
COUNT_UP_TO = 10_000


@dataclasses.dataclass(frozen=True, kw_only=True)
class Slot:
    at: dt.datetime
    job: models.CronJob
    due: bool  # its time has come and the beat has not dispatched it yet (a beat sends it within its tick)
    one_off: int | None = None  # a one-off run recorded ahead: its execution id


@dataclasses.dataclass(frozen=True, kw_only=True)
class More:
    job: models.CronJob
    count: int  # slots of the job in the window beyond those listed
    until: dt.datetime  # the last of them


@dataclasses.dataclass(frozen=True, kw_only=True)
class Behind:
    """A job whose next slot has waited longer than the health endpoint's limit: the beat is
    down or behind. Its catch-up policy decides, when the beat runs again, which of the slots
    it missed are sent (``latest``: the newest; ``all``: each; ``none``: none, recorded MISSED)."""

    job: models.CronJob
    since: dt.datetime


@dataclasses.dataclass(frozen=True, kw_only=True)
class Upcoming:
    now: dt.datetime
    until: dt.datetime
    slots: list[Slot]
    more: list[More]
    behind: list[Behind]
    unplannable: list[tuple[models.CronJob, str]]
    truncated: bool  # more than MAX_JOBS jobs are due within the window
    overdue_after: float  # HEALTH["OVERDUE_SECONDS"]


@dataclasses.dataclass(frozen=True)
class _Plan:
    listed: list[dt.datetime]
    more: int
    last: dt.datetime | None


def _count_after(schedule: schedules.Schedule, after: dt.datetime,
                 until: dt.datetime) -> tuple[int, dt.datetime | None]:
    """How many slots fall in ``(after, until]``, and the last of them."""
    if isinstance(schedule, schedules.Interval):
        first = schedule.next_after(after)
        if first > until:
            return 0, None
        count = int((until - first).total_seconds()) // schedule.seconds + 1
        return count, first + dt.timedelta(seconds=schedule.seconds * (count - 1))
    found = schedules.slots_between(schedule, after, until, limit=COUNT_UP_TO)
    return len(found), (found[-1] if found else None)


def _plan(schedule: schedules.Schedule, start: dt.datetime, included: bool, until: dt.datetime) -> _Plan:
    """The first ``PER_JOB`` slots from ``start`` (itself one of them when ``included``) up to
    ``until``, and a count of the rest."""
    listed = [start] if included else []
    listed += schedules.slots_between(schedule, start, until, limit=PER_JOB - len(listed))
    if not listed:
        return _Plan([], 0, None)
    more, last = _count_after(schedule, listed[-1], until)
    return _Plan(listed, more, last)


def upcoming(now: dt.datetime, window: dt.timedelta = dt.timedelta(hours=1)) -> Upcoming:
    """The unpaused jobs' slots from ``now`` to ``now + window``, in time order. A slot whose time
    has come but that the beat has not sent is listed first, as due; a job left behind longer
    than the health endpoint's limit is named once, with its slots from now on."""
    until = now + window
    late = float(conf.settings.HEALTH["OVERDUE_SECONDS"])
    rows = list(models.CronJob.objects.filter(paused=False, next_run_at__isnull=False, next_run_at__lte=until)
                .exclude(active_until__lte=F("next_run_at"))  # its window has ended: no more slots
                .order_by("next_run_at", "name")[:MAX_JOBS + 1])
    slots: list[Slot] = []
    more: list[More] = []
    behind: list[Behind] = []
    unplannable: list[tuple[models.CronJob, str]] = []
    plans: dict[tuple[str, str, dt.datetime, bool, dt.datetime], _Plan] = {}
    for job in rows[:MAX_JOBS]:
        first = job.next_run_at
        assert first is not None
        # Late from its window's opening when that came after its next slot, as on the health check.
        since = max(first, job.active_from or first)
        left_behind = (now - since).total_seconds() > late
        if left_behind:
            behind.append(Behind(job=job, since=since))
        start, included = (now, False) if left_behind else (first, True)
        zone = job.schedule_timezone or job.timezone
        # Within the job's window: from its opening, and before its end.
        end = until if job.active_until is None else min(until, job.active_until - dt.timedelta(microseconds=1))
        if job.active_from is not None and start < job.active_from:
            start, included = job.active_from - dt.timedelta(microseconds=1), False
        key = (job.schedule, zone, start, included, end)
        if key not in plans:
            try:
                schedule = schedules.parse_expression(job.schedule, zone)
            except (exceptions.InvalidSchedule, ValueError, KeyError) as error:  # shown, not raised
                unplannable.append((job, str(error)))
                continue
            plans[key] = _plan(schedule, start, included, end) if start <= end else _Plan([], 0, None)
        plan = plans[key]
        slots += [Slot(at=at, job=job, due=at <= now) for at in plan.listed]
        if plan.more and plan.last is not None:
            more.append(More(job=job, count=plan.more, until=plan.last))
    waiting = oneoffs.waiting(until)
    by_id = models.CronJob.objects.in_bulk({job_id for _id, job_id, _at in waiting})
    slots += [Slot(at=at, job=by_id[job_id], due=at <= now, one_off=execution_id)
              for execution_id, job_id, at in waiting if job_id in by_id]
    slots.sort(key=lambda slot: (slot.at, slot.job.name))
    return Upcoming(now=now, until=until, slots=slots, more=more, behind=behind, unplannable=unplannable,
                    truncated=len(rows) > MAX_JOBS, overdue_after=late)
