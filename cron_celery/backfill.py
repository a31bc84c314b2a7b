"""Backfills: running a job's past slots on purpose (the command and the admin's form).

The slots come from the schedule in effect (the admin may have edited it), between two
local dates of the job's timezone, inclusive. Slots that already succeeded, or are queued
or running, are left out unless forced. Each slot is sent through ``tasks.send_run`` with
trigger BACKFILL, as a deliberate re-run of that slot (the slot check is not applied again).
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from cron_celery import enums, exceptions, models, registry, schedule_sync, schedules, tasks

#: Most slots one backfill sends unless told otherwise.
LIMIT = 1000


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
    slots: list[dt.datetime]  # to send, oldest first
    done: list[dt.datetime]  # left out: they already ran (or run now)


def plan(job: registry.Job, start: str | dt.date, end: str | dt.date, *, force: bool = False,
         limit: int = LIMIT) -> Plan:
    first = start if isinstance(start, dt.date) else schedules.parse_date(start)
    last = end if isinstance(end, dt.date) else schedules.parse_date(end)
    if last < first:
        raise exceptions.InvalidSlot(f"the range ends ({last}) before it starts ({first}).", value=str(end))
    schedule = schedule_sync.in_effect(job).schedule
    if schedule is None:
        raise exceptions.InvalidSlot(f"job {job.name!r} has no schedule; run single slots with run_cron_task --at.",
                                     value=job.name)
    after = schedules.slot_for_date(first, job.tzinfo) - dt.timedelta(microseconds=1)
    until = schedules.slot_for_date(last + dt.timedelta(days=1), job.tzinfo) - dt.timedelta(microseconds=1)
    slots = schedules.slots_between(schedule, after, until, limit=limit + 1)
    if len(slots) > limit:
        raise exceptions.InvalidSlot(
            f"{first}..{last} holds more than {limit} slots of {job.name}; backfill a shorter range (or raise "
            "--limit).", value=f"{first}..{last}")
    if force or not slots:
        return Plan(slots=slots, done=[])
    taken = set(models.CronExecution.objects.filter(
        task_code=job.code, slot__in=slots,
        status__in=[enums.Status.SUCCEEDED, enums.Status.PENDING, enums.Status.RUNNING, enums.Status.RETRYING],
    ).values_list("slot", flat=True))
    return Plan(slots=[slot for slot in slots if slot not in taken], done=sorted(taken))


def send(job: registry.Job, planned: Plan) -> list[tasks.Sent]:
    """Send each planned slot; a failure stops the backfill and says how far it got."""
    sent: list[tasks.Sent] = []
    for slot in planned.slots:
        try:
            sent.append(tasks.send_run(job, slot, enums.Trigger.BACKFILL, rerun=True))
        except exceptions.CronCeleryError as error:
            raise exceptions.BackfillInterrupted(str(error), sent=len(sent), total=len(planned.slots),
                                                 slot=schedules.iso(slot)) from error
    return sent
