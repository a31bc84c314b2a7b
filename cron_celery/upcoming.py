"""What is about to run: the slots of the next hour across all jobs, for the admin's "upcoming"
page. Read from the job rows (the index on ``next_run_at``) and each job's schedule in effect,
never from the history."""

from __future__ import annotations

import dataclasses
import datetime as dt

from cron_celery import conf, models, schedules

#: Slots listed per job; a job that runs more often says how many more it has in the hour.
PER_JOB = 5
#: Jobs read at most (the earliest next slots first).
MAX_JOBS = 500


@dataclasses.dataclass(frozen=True, kw_only=True)
class Slot:
    at: dt.datetime
    job: models.CronJob
    due: bool  # its time has come and the beat has not dispatched it yet (a beat sends it within its tick)
    overdue: bool  # due for longer than the health endpoint's OVERDUE_SECONDS: the beat is down or behind


@dataclasses.dataclass(frozen=True, kw_only=True)
class More:
    job: models.CronJob
    count: int  # slots of the job in the window beyond those listed
    until: dt.datetime


@dataclasses.dataclass(frozen=True, kw_only=True)
class Upcoming:
    now: dt.datetime
    until: dt.datetime
    slots: list[Slot]
    more: list[More]
    unplannable: list[tuple[models.CronJob, str]]
    truncated: bool  # more than MAX_JOBS jobs are due within the window
    overdue_after: float  # HEALTH["OVERDUE_SECONDS"]


def upcoming(now: dt.datetime, window: dt.timedelta = dt.timedelta(hours=1)) -> Upcoming:
    """The unpaused jobs' slots from ``now`` to ``now + window``, in time order; a job's slot
    that is already due but not dispatched is listed first, as due (or overdue, past the health
    endpoint's limit)."""
    until = now + window
    late = float(conf.settings.HEALTH["OVERDUE_SECONDS"])
    rows = list(models.CronJob.objects.filter(paused=False, next_run_at__isnull=False, next_run_at__lte=until)
                .order_by("next_run_at", "name")[:MAX_JOBS + 1])
    slots: list[Slot] = []
    more: list[More] = []
    unplannable: list[tuple[models.CronJob, str]] = []
    for job in rows[:MAX_JOBS]:
        first = job.next_run_at
        assert first is not None
        try:
            schedule = schedules.parse_expression(job.schedule, job.schedule_timezone or job.timezone)
            later = schedules.slots_between(schedule, first, until, limit=10_000)
        except Exception as error:  # a stored schedule that cannot be planned is shown, not raised
            unplannable.append((job, str(error)))
            continue
        every = [first, *later]
        slots += [Slot(at=at, job=job, due=at <= now, overdue=(now - at).total_seconds() > late)
                  for at in every[:PER_JOB]]
        if len(every) > PER_JOB:
            more.append(More(job=job, count=len(every) - PER_JOB, until=every[-1]))
    slots.sort(key=lambda slot: (slot.at, slot.job.name))
    return Upcoming(now=now, until=until, slots=slots, more=more, unplannable=unplannable,
                    truncated=len(rows) > MAX_JOBS, overdue_after=late)
