"""The schedule in effect for a job, read from its row: the admin's edit if there is one, else the code's
(``in_effect``); the schedule its slots follow, through ``after=`` (``slots_of``); whether the beat would
run a slot as things stand (``runs_at``); and the slot a person means by a day or a time (``slot_for``)."""

from __future__ import annotations

import dataclasses
import datetime as dt

from django.utils import timezone

from cron_celery import exceptions, models, schedules, slots
from cron_celery.declaring import registry


def in_effect(job: registry.Job) -> registry.Job:
    """The job with the schedule in effect: the admin's edit if there is one, else the code's."""
    row = models.CronJob.objects.filter(code=job.code).values("schedule", "schedule_timezone").first()
    if job.schedule is None or row is None or not row["schedule"]:
        return job
    try:
        schedule = schedules.parse_expression(row["schedule"], row["schedule_timezone"] or None)
        schedule.next_after(timezone.now())  # one that never fires is no schedule
    except exceptions.InvalidSchedule:
        return job
    return dataclasses.replace(job, schedule=schedule)


def slots_of(job: registry.Job) -> registry.Job:
    """The job with the schedule its slots follow: its own in effect, or for a job declared with
    ``after=`` that of the first upstream job with a schedule up its chain (they share one)."""
    source = job
    seen = {job.name}
    while source.schedule is None and source.after and source.after[0] not in seen:
        seen.add(source.after[0])
        try:
            source = registry.get(source.after[0])
        except exceptions.UnknownJob:
            return job
    return job if source is job else dataclasses.replace(job, schedule=in_effect(source).schedule)


def runs_at(job: registry.Job, slot: dt.datetime) -> bool:
    """Whether the beat would run this slot of the job as things stand: the job is not paused and
    the slot is inside its active window (the row's, as the admin left it)."""
    row = models.CronJob.objects.filter(code=job.code).values_list("paused", "active_from", "active_until").first()
    paused, opens, closes = row or (False, job.active_from, job.active_until)
    return not paused and (opens is None or slot >= opens) and (closes is None or slot < closes)


def slot_for(job: registry.Job, day: str | None = None, at: str | None = None) -> dt.datetime:
    """The slot a person means: ``at`` (an exact time, checked against ``day`` if both are
    given), else the job's first slot on ``day`` (default: today in the job's timezone) by
    the schedule in effect. Raises ``InvalidSlot`` with what to do instead."""
    if at:
        slot = slots.parse_slot(at, job.tzinfo)
        if day and slots.execution_date(slot, job.tzinfo) != slots.parse_date(day):
            raise exceptions.InvalidSlot(
                f"--at falls on {slots.execution_date(slot, job.tzinfo)} in "
                f"{job.timezone}, not on {day}.", value=at)
        return slot
    date = slots.parse_date(day) if day else dt.datetime.now(job.tzinfo).date()
    try:
        first = slots_of(job).first_slot_on(date)
    except (exceptions.InvalidSchedule, *slots.CALENDAR_ERRORS):  # at either end of the calendar
        raise exceptions.InvalidSlot(f"job {job.name!r} has no slot on {date} {slots.OUTSIDE}.",
                                     value=day or str(date)) from None
    if first is None:
        raise exceptions.InvalidSlot(
            f"job {job.name!r} has no slot on {date} ({job.schedule}); name one with --at.",
            value=day or str(date))
    return first
