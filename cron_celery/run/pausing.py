"""A person's pause and resume of one job, whichever door they come through (the admin's *Pause…* and
*Resume*, the ``pause/`` and ``resume/`` endpoints).

The periodic task's ``enabled`` is the switch (a job without one: its row's ``paused``), in a
transaction that names the person to the audit log's triggers; a pause then says its note and its
end (``pauses.say``: an end not ahead is refused, and nothing is paused). After a resume commits,
the runs the pause held are sent (``resumes.release``; the reconciler's otherwise).
"""

from __future__ import annotations

import datetime as dt
import zoneinfo

import celery
from django.db import transaction

from cron_celery import exceptions, models
from cron_celery.decisions import audit, pauses
from cron_celery.declaring import registry
from cron_celery.run import resumes


def zone_of(job: models.CronJob) -> zoneinfo.ZoneInfo:
    """The timezone a time typed for this job is read in: its schedule's, else its own, else UTC."""
    try:
        return zoneinfo.ZoneInfo(job.schedule_timezone or job.timezone or "UTC")
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return zoneinfo.ZoneInfo("UTC")


def switch(app: celery.Celery, job: models.CronJob, paused: bool, *, actor: str, source: str, note: str = "",
           until: dt.datetime | None = None) -> None:
    """Pause (with ``note`` and ``until``) or resume ``job`` as ``actor``; ``exceptions.PauseRefused`` (nothing
    changed) for an end that is not ahead."""
    with transaction.atomic():
        audit.set_author(actor=actor, source=source)
        task = job.periodic_task
        if task is not None:  # the periodic task is the switch; the beat follows it
            task.enabled = not paused
            task.save(update_fields=["enabled"])
        else:
            models.CronJob.objects.filter(id=job.id).update(paused=paused)
        if paused:  # what is said of the pause, once it is made (a resume clears it)
            pauses.say(job.id, note=note, until=until, by=actor)
    if not paused:
        try:
            declared = registry.get(job.code)
        except exceptions.UnknownJob:
            return  # not this process's: the reconciler sends what the pause held
        resumes.release(app, declared)
