"""Who may change django-celery-beat's rows in the admin when they drive a cron job.

A cron job's periodic task is the job's switch and its settings: ``enabled`` pauses and resumes
the job, ``kwargs`` are its parameters, ``start_time`` and ``expires`` its active window, and
``one_off`` ends it after one run; the crontab, interval, solar or clocked row it points at is its
schedule. Changing any of them is operating the job, so it asks what the jobs dashboard's *Pause*
and *Run now* ask, ``models.OPERATE_PERMISSION``, on top of django-celery-beat's own permission:

- without it such a row's page is read-only, and a POST to change or delete it is a 403;
- a bulk action (*Enable*, *Disable*, *Toggle*, *Run selected tasks*, *Delete selected*) on a
  selection that holds one is refused as a whole, with a message, and changes nothing.

Periodic tasks that drive no cron job, and schedule rows none of them uses, keep django-celery-beat's
permissions. ``OperateGated`` is mixed into django-celery-beat's admins by ``cron_celery.admin``
(through ``Audited``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.db.models import Model, QuerySet
from django.http import HttpRequest
from django_celery_beat import models as beat_models

from cron_celery import models

#: The periodic task's link to each kind of schedule row.
SCHEDULE_LINKS: dict[type[Model], str] = {
    beat_models.CrontabSchedule: "crontab", beat_models.IntervalSchedule: "interval",
    beat_models.SolarSchedule: "solar", beat_models.ClockedSchedule: "clocked",
}
#: How many of the refused selection's rows a message names.
NAMED_AT_MOST = 5


def operates(request: HttpRequest) -> bool:
    return bool(request.user.has_perm(models.OPERATE_PERMISSION))


def _jobs_driven(model: type[Model], keys: Any) -> QuerySet[models.CronJob]:
    """The cron jobs whose periodic task is one of ``keys`` (a task), or points at one (a schedule)."""
    if issubclass(model, beat_models.PeriodicTask):
        return models.CronJob.objects.filter(periodic_task__in=keys)
    link = SCHEDULE_LINKS.get(model)
    if link is None:
        return models.CronJob.objects.none()
    return models.CronJob.objects.filter(**{f"periodic_task__{link}__in": keys})


def drives_a_job(obj: Model) -> bool:
    """Whether changing this row changes a cron job."""
    return _jobs_driven(type(obj), [obj.pk]).exists()


def refusal(request: HttpRequest, queryset: QuerySet[Any]) -> str | None:
    """Why this user may not act on this selection in bulk; None when they may."""
    if operates(request):
        return None
    jobs = list(_jobs_driven(queryset.model, queryset.values("pk")).order_by("name")
                .values_list("name", flat=True)[: NAMED_AT_MOST + 1])
    if not jobs:
        return None
    named = ", ".join(jobs[:NAMED_AT_MOST]) + (", ..." if len(jobs) > NAMED_AT_MOST else "")
    return (f"Nothing was changed: the selection drives the cron jobs {named}, and acting on them needs the "
            f"permission to operate cron jobs ({models.OPERATE_PERMISSION}). Select only rows that drive no "
            "cron job, or ask someone who may operate them.")


def _gated(action: Callable[..., Any]) -> Callable[..., Any]:
    """A bulk action that first refuses, as a whole, a selection this user may not act on."""

    @functools.wraps(action)
    def run(modeladmin: Any, request: HttpRequest, queryset: QuerySet[Any]) -> Any:
        refused = refusal(request, queryset)
        if refused is not None:
            modeladmin.message_user(request, refused, messages.ERROR)
            return None
        return action(modeladmin, request, queryset)

    return run


class OperateGated:
    """Mixed into django-celery-beat's admins: a row that drives a cron job is changed, deleted or
    acted on in bulk only with ``models.OPERATE_PERMISSION`` too (read-only without it)."""

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        allowed = bool(super().has_change_permission(request, obj))  # type: ignore[misc]
        return allowed and (obj is None or operates(request) or not drives_a_job(obj))

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        allowed = bool(super().has_delete_permission(request, obj))  # type: ignore[misc]
        return allowed and (obj is None or operates(request) or not drives_a_job(obj))

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions: dict[str, Any] = super().get_actions(request)  # type: ignore[misc]
        return {name: (_gated(func), name, description) for name, (func, _name, description) in actions.items()}
