"""The job rows of tracked periodic tasks, kept in line with the periodic tasks and the setting.

``sync`` runs when a beat starts, on ``sync_cron_schedules``, and whenever django-celery-beat says a
periodic task changed (the beat's ``all_as_schedule``): each tracked periodic task gets a job row
linked to it (``decisions.tracked.link``), so the beat dispatches its slots as a job's and
django-celery-beat's own scheduler leaves it alone; a row whose periodic task is gone or no longer
tracked is unlinked, keeps its history, and its periodic task is sent untracked again.
"""

from __future__ import annotations

import dataclasses
import logging

from django.db.models import Q
from django.db.models.signals import post_delete, post_save
from django_celery_beat.models import PeriodicTask, PeriodicTasks

from cron_celery import conf
from cron_celery.decisions import tracked
from cron_celery.declaring import registry
from cron_celery.models import TrackedPeriodicTask
from cron_celery.tracking import selection

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Report:
    linked: list[str] = dataclasses.field(default_factory=list)
    unlinked: list[str] = dataclasses.field(default_factory=list)


def candidates(declared_codes: frozenset[str] = frozenset()) -> list[tracked.Candidate]:
    """The periodic tasks the setting tracks, of every schedule type, and no cron job's: a crontab or an
    interval gets its slots computed ahead; a clocked or solar one is recorded as it fires (``fires``).
    One whose job's code a job declared in code now takes (``adopt_periodic_tasks``) is that job's
    from now on."""
    choose = selection.chooser()
    found = []
    mine = Q(cron_job__isnull=True) | Q(cron_job__task__startswith=tracked.ALIAS)
    tasks = PeriodicTask.objects.filter(mine)
    if choose is None:  # only those a person chose in the admin
        tasks = tasks.filter(cron_tracking__track=True)
    for task in tasks.select_related("crontab", "cron_tracking").order_by("id"):
        if tracked.code_for(task.id) in declared_codes:
            continue
        if selection.never(task.task) or not selection.chosen(choose, task):
            continue
        own = task.crontab.timezone if task.crontab is not None else None  # a crontab's own timezone
        zone = str(own) if own else conf.default_timezone()
        found.append(tracked.Candidate(periodic_task_id=task.id, name=task.name, task=task.task, timezone=zone,
                                       catch_up=selection.catch_up(task)))
    return found


def in_use() -> bool:
    """Whether anything is or was tracked: the setting, a person's yes in the admin, or a tracked row."""
    return (selection.chooser() is not None or TrackedPeriodicTask.objects.filter(track=True).exists()
            or tracked.any_rows())


def sync(*, source: str) -> Report:
    """Link every tracked periodic task to its job row and unlink the rest (see the module doc)."""
    if not in_use():  # nothing to link or unlink: django-celery-beat's read goes on untouched
        return Report()
    jobs = registry.all_jobs()
    codes = frozenset(job.code for job in jobs)
    chosen = candidates(codes)
    report = Report(linked=tracked.link(chosen, source=source, reserved=frozenset(job.name for job in jobs)),
                    unlinked=tracked.unlink_others({c.periodic_task_id for c in chosen}, source=source,
                                                   spare=codes))
    if report.linked:
        logger.warning("cron_celery: %d periodic task(s) tracked as jobs from now on: %s", len(report.linked),
                       ", ".join(report.linked[:20]))
    if report.unlinked:
        logger.warning("cron_celery: %d periodic task(s) no longer tracked (gone, or left out by "
                       "TRACK_PERIODIC_TASKS); their history stays: %s", len(report.unlinked),
                       ", ".join(report.unlinked[:20]))
    if report.linked or report.unlinked:
        PeriodicTasks.update_changed()  # django-celery-beat's own scheduler reads which ones it sends again
    return report


def connect() -> None:
    """A person's tracking choice saved in the admin reaches a running beat as a periodic task's edit does:
    django-celery-beat is told its tasks changed, and the beat links or unlinks at its next tick."""
    for signal in (post_save, post_delete):
        signal.connect(_choice_changed, sender=TrackedPeriodicTask, weak=False,
                       dispatch_uid=f"cron_celery.tracking.{signal is post_save}")


def _choice_changed(**_: object) -> None:
    PeriodicTasks.update_changed()
