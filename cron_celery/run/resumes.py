"""A resumed job's held runs, sent again.

A pause holds the runs somebody asked for (a backfill, a catch-up, a run sent with
``--enqueue``, the run endpoint or the admin, a one-off run, a downstream slot): each that
reaches the paused job waits, unsent, for it to be resumed (``claims.waits_its_turn``,
``waiting.mark``). When the admin's *Resume* commits, ``release`` sends them: for a job with a
limit (overlap ``skip``, ``max_concurrency``, a concurrency group) the oldest one, and each run
that ends sends the next, as after any live run (``tasks.send_waiting``); for a job that runs any
number at once, every one. A resume made anywhere else (django-celery-beat's own admin, the ORM,
SQL), a send that is lost, or a worker killed in between: the reconciler sends them at its next
pass (``repairs.stranded``): the oldest for a job with a limit, and the chain goes on from there;
every one for a job without.
"""

from __future__ import annotations

import logging

import celery

from cron_celery.decisions import groups, jobs, waiting
from cron_celery.declaring import registry
from cron_celery.run import tasks

logger = logging.getLogger(__name__)


def release(app: celery.Celery, job: registry.Job) -> None:
    """Send what the pause held of this job, now that it is resumed. A send that fails is logged:
    the reconciler sends it instead."""
    grouped = job.concurrency_group is not None and groups.limit(job.concurrency_group) is not None
    if job.limit is not None or grouped:
        tasks.send_waiting(app, job)  # the oldest; each run that ends sends the next
        return
    try:
        for item in waiting.every_one(jobs.job_id(job)):
            tasks.send(app, item.task_name, execution_id=item.execution_id, slot=item.slot, trigger=item.trigger,
                       celery_task_id=item.celery_task_id or None)
    except Exception:  # the pause is lifted either way; the reconciler sends what is left
        logger.exception("could not send the runs of %s that waited for it to be resumed", job.name)


def release_job(app: celery.Celery, job_id: int) -> None:
    """``release`` for the job with this row id (a pause that ended by itself); a job this process
    does not declare is left to the reconciler, which sends what its pause held at its next pass."""
    job = jobs.job_for_row(job_id)
    if job is not None:
        release(app, job)
