"""Backfills: running a job's past slots on purpose (the command and the admin's form).

The slots come from the schedule in effect (the admin may have edited it), between two
local dates of the job's timezone, inclusive. Slots that already succeeded, or are queued
or running, are left out unless forced. Every slot is first recorded, PENDING with trigger
BACKFILL, as a deliberate re-run of that slot (the slot check is not applied again), all in
one statement; then their messages are published. Nothing is lost when publishing stops
half way (the broker refuses, the process dies): the reconciler sends a PENDING execution
again once ``PENDING_GRACE`` has passed.

The command publishes every slot itself. The admin's form publishes the first ``IN_REQUEST``
and hands the rest to a worker in one message (``publish_backfill``), so a large backfill
never holds an HTTP request for long; the page says how many were recorded and sent, and
the history shows each one as it runs.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging

from celery import current_app, shared_task

from cron_celery import enums, exceptions, models, schedules, slots
from cron_celery.decisions import dispatch, in_effect, jobs
from cron_celery.declaring import registry
from cron_celery.run import tasks

logger = logging.getLogger(__name__)
#: Most slots one backfill sends unless told otherwise.
LIMIT = 1000
#: Slots the admin's form publishes within its request; a worker publishes the rest.
IN_REQUEST = 20


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
    slots: list[dt.datetime]  # to send, oldest first
    done: list[dt.datetime]  # left out: they already ran (or run now)
    cascade: bool = False  # each slot's success runs the downstream jobs' slot again
    outside: int = 0  # slots of the range left out: outside the job's active window (never its slots)


def plan(job: registry.Job, start: str | dt.date, end: str | dt.date, *, force: bool = False,
         limit: int = LIMIT, cascade: bool = False) -> Plan:
    first = start if isinstance(start, dt.date) else slots.parse_date(start)
    last = end if isinstance(end, dt.date) else slots.parse_date(end)
    if last < first:
        raise exceptions.InvalidSlot(f"the range ends ({last}) before it starts ({first}).", value=str(end))
    schedule = in_effect.in_effect(job).schedule
    if schedule is None and job.after:
        raise exceptions.InvalidSlot(f"job {job.name!r} runs after {', '.join(job.after)}: backfill them with "
                                     "cascade, and it runs after each slot they succeed in.", value=job.name)
    if schedule is None:
        raise exceptions.InvalidSlot(f"job {job.name!r} has no schedule; run single slots with run_cron_task --at.",
                                     value=job.name)
    begins = slots.slot_for_date(first, job.tzinfo)
    ends = slots.slot_for_date(last + dt.timedelta(days=1), job.tzinfo)  # the range: [begins, ends)
    opens, closes = models.CronJob.objects.filter(code=job.code).values_list("active_from", "active_until").first() \
        or (job.active_from, job.active_until)
    lower, upper = max(begins, opens or begins), min(ends, closes or ends)  # inside the job's active window
    tick = dt.timedelta(microseconds=1)
    chosen = schedules.slots_between(schedule, lower - tick, upper - tick, limit=limit + 1) if lower < upper else []
    outside = 0
    if (lower, upper) != (begins, ends):  # the window's slots only: those outside it were never the job's
        outside = len(schedules.slots_between(schedule, begins - tick, ends - tick, limit=10 * limit)) - len(chosen)
    if len(chosen) > limit:
        raise exceptions.InvalidSlot(
            f"{first}..{last} holds more than {limit} slots of {job.name}; backfill a shorter range (or raise "
            "--limit).", value=f"{first}..{last}")
    if force or not chosen:
        return Plan(slots=chosen, done=[], cascade=cascade, outside=outside)
    taken = set(models.CronExecution.objects.filter(  # a run with parameters a person gave is not the slot's run
        task_code=job.code, slot__in=chosen, params_given=False,
        status__in=[enums.Status.SUCCEEDED, enums.Status.PENDING, enums.Status.RUNNING, enums.Status.RETRYING],
    ).values_list("slot", flat=True))
    return Plan(slots=[slot for slot in chosen if slot not in taken], done=sorted(taken), cascade=cascade,
                outside=outside)


def record(job: registry.Job, planned: Plan) -> list[dispatch.ToPublish]:
    """Record every planned slot PENDING (trigger BACKFILL, forced), in one statement."""
    return dispatch.enqueue_many(job=job, job_id=jobs.job_id(job), slots=planned.slots,
                                 trigger=enums.Trigger.BACKFILL, forced=True, cascade=planned.cascade)


def publish(job: registry.Job, rows: list[dispatch.ToPublish], total: int | None = None) -> int:
    """Publish these recorded slots in order; returns how many. A refusal stops it and says how far
    it got (the rest stay PENDING: the reconciler sends them once the broker answers)."""
    for done, row in enumerate(rows):
        try:
            tasks.send(current_app, job.task_name, execution_id=row.execution_id, slot=row.slot,
                       trigger=row.trigger, celery_task_id=row.celery_task_id, rerun=True)
        except Exception as error:
            raise exceptions.BackfillInterrupted(
                f"({type(error).__name__}: {error})", sent=done, total=total or len(rows),
                slot=slots.iso(row.slot)) from error
    return len(rows)


def send(job: registry.Job, planned: Plan) -> list[dispatch.ToPublish]:
    """Record the planned slots, then publish them all (the command)."""
    rows = record(job, planned)
    publish(job, rows)
    return rows


@dataclasses.dataclass(frozen=True, kw_only=True)
class Started:
    """What the admin's form did: slots recorded, published now, and handed to a worker."""

    recorded: int
    sent: int
    handed_over: int


def start(job: registry.Job, planned: Plan) -> Started:
    """Record the planned slots, publish the first ``IN_REQUEST``, and hand the rest to a worker
    in one message (the admin's form). If that message cannot be sent either, the reconciler
    sends the rest after ``PENDING_GRACE``: ``BackfillInterrupted`` says so."""
    rows = record(job, planned)
    now, later = rows[:IN_REQUEST], rows[IN_REQUEST:]
    sent = publish(job, now, total=len(rows))
    if later:
        try:
            publish_backfill.apply_async((job.code, [row.execution_id for row in later]), ignore_result=True)
        except Exception as error:
            raise exceptions.BackfillInterrupted(
                f"({type(error).__name__}: {error})", sent=sent, total=len(rows),
                slot=slots.iso(later[0].slot)) from error
    return Started(recorded=len(rows), sent=sent, handed_over=len(later))


@shared_task(name="cron_celery.publish_backfill", ignore_result=True)
def publish_backfill(code: str, execution_ids: list[int]) -> int:
    """Publish the recorded slots of a backfill that still wait for their message, oldest first.
    Sent again (a redelivery) it publishes only those still waiting; a duplicate message is
    harmless, since the claim runs an execution once."""
    job = registry.get(code)
    rows = dispatch.pending(execution_ids)
    try:
        return publish(job, rows)
    except exceptions.BackfillInterrupted as stopped:
        logger.warning("%s; the reconciler sends the rest", stopped)
        return 0
