"""Tracked periodic tasks whose slots cannot be computed ahead: a clocked one-off and a solar schedule.
They are recorded as they fire.

``DatabaseScheduler`` keeps deciding when such a task is due. A clocked one is due at its clocked
time, and once. A solar one is due at the sun's event, which Celery computes with ``ephem``. The
leading beat sends it once per due time (``beat.plain_tasks``). When it sends a tracked one, the
send is a run of the tracked job: ``send`` records a PENDING execution of the slot, then publishes
the periodic task's own message with our headers. The worker claims it before the body, records
its outcome and keeps its retries as attempts, as for every tracked job.

What this gives up beside a crontab or an interval, whose slots are computed ahead:
- a due time the beat was down for is sent late once, or not at all, as ``DatabaseScheduler`` decides;
  no MISSED row is written for it and no catch-up policy applies;
- the health check cannot say a fire is overdue, and no start deadline is measured from a fire
  that never came.
The slot of a clocked task is its clocked time. The slot of a solar fire is the second the beat
sent it.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

import celery
from django.db.models import Q
from django.utils import timezone

from cron_celery import enums, exceptions
from cron_celery.decisions import dispatch, jobs, tracked
from cron_celery.declaring import registry
from cron_celery.run import tasks

logger = logging.getLogger(__name__)

#: A periodic task (``PeriodicTask`` lookups) tracked and recorded as it fires.
TRACKED_FIRES = Q(cron_job__task__startswith=tracked.ALIAS, crontab__isnull=True, interval__isnull=True)


def fires(periodic_task: Any) -> bool:
    """Whether ``periodic_task`` (a ``PeriodicTask``) has a schedule whose slots cannot be computed ahead."""
    return periodic_task.crontab_id is None and periodic_task.interval_id is None


def slot_of(periodic_task: Any) -> dt.datetime:
    """The slot of this fire: a clocked task's clocked time, else this second."""
    clocked = getattr(periodic_task, "clocked", None) if periodic_task.clocked_id is not None else None
    if clocked is not None and clocked.clocked_time is not None:
        return clocked.clocked_time.replace(microsecond=0)  # type: ignore[no-any-return]
    return timezone.now().replace(microsecond=0)


def send(app: celery.Celery, periodic_task: Any) -> dispatch.ToPublish | None:
    """Send this fire of a tracked periodic task as a run of its job (see the module doc); None when the
    periodic task is not tracked (``DatabaseScheduler`` sends it as it always has). Its execution is
    recorded first, with its Celery task id: a message the broker refuses leaves it PENDING, and the
    reconciler sends it after ``PENDING_GRACE``, as any slot recorded and not sent."""
    code = tracked.linked_code(periodic_task.pk)
    if code is None:
        return None
    job = registry.loaded(code, fresh=True)
    if job is None:
        raise exceptions.UnknownJob(name=code, known="(its tracked job row could not be read)")
    slot = slot_of(periodic_task)
    clocked = periodic_task.clocked_id is not None
    # A clocked one fires at one slot, its clocked time: a second fire of it (enabled again in the admin)
    # is a run of that slot again. A one-off is disabled by django-celery-beat once it fired, which
    # pauses its job: its run goes past that pause.
    recorded = dispatch.enqueue_many(job=job, job_id=jobs.job_id(job), slots=[slot], trigger=enums.Trigger.BEAT,
                                     forced=clocked, force=bool(periodic_task.one_off))[0]
    try:
        tasks.send(app, job.task_name, execution_id=recorded.execution_id, slot=slot, trigger=recorded.trigger,
                   celery_task_id=recorded.celery_task_id)
    except Exception as error:
        logger.warning("cron_celery beat: periodic task %r fired, but its message could not be sent (%s: %s); "
                       "execution %d stays PENDING for the reconciler to send", periodic_task.name,
                       type(error).__name__, error, recorded.execution_id)
        return recorded
    logger.info("cron_celery beat: periodic task %r fired: slot %s of %s sent (execution %d)", periodic_task.name,
                slot.isoformat(), code, recorded.execution_id)
    return recorded
