"""Which of django-celery-beat's periodic tasks are tracked as jobs: ``TRACK_PERIODIC_TASKS`` read.

``False`` (the default): none. ``True``: every periodic task that is no cron job's. A list (or
tuple, or set) of names: each periodic task whose name or task name is in it. A callable, or the
dotted path of one: called with each ``PeriodicTask``, tracked when it answers true. Over the
setting, a person's yes or no for one periodic task in the admin (``TrackedPeriodicTask``), and its
catch-up policy there over ``TRACKED_CATCH_UP``.

Never tracked, whatever the setting: a cron job's own periodic task; a task of cron_celery's own
or of a job declared in code. A clocked or solar schedule is tracked as it fires (``fires``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery import current_app
from django.core.exceptions import ObjectDoesNotExist
from django.utils.module_loading import import_string

from cron_celery import conf
from cron_celery.declaring import registry

logger = logging.getLogger(__name__)

Chooser = Callable[[Any], bool]


def problem(value: object) -> str:
    """What is wrong with a ``TRACK_PERIODIC_TASKS`` value, in words; '' when nothing is."""
    if value is None or isinstance(value, bool) or callable(value):
        return ""
    if isinstance(value, str):
        try:
            found = import_string(value)
        except ImportError as error:
            return f"{value!r} cannot be imported ({error})"
        return "" if callable(found) else f"{value!r} is not callable"
    if isinstance(value, list | tuple | set | frozenset):
        wrong = [item for item in value if not isinstance(item, str) or not item]
        return f"its names must be non-empty strings, not {wrong[0]!r}" if wrong else ""
    return f"True, False, a list of task or periodic task names, or a callable is needed, not {type(value).__name__}"


def chooser() -> Chooser | None:
    """The setting as a test of one ``PeriodicTask``; None when nothing is tracked. A value
    ``problem`` refuses (the checks name it) tracks nothing."""
    value = conf.settings.TRACK_PERIODIC_TASKS
    if not value or problem(value):
        return None
    if value is True:
        return lambda task: True
    if isinstance(value, str):
        found: Chooser = import_string(value)
        return found
    if callable(value):
        return value  # type: ignore[no-any-return]
    names = frozenset(value)
    return lambda task: task.name in names or task.task in names


def never(task_name: str) -> str:
    """Why a periodic task of this Celery task is never tracked, whatever the setting; '' when it may be."""
    if task_name.startswith("cron_celery."):
        return "a task of cron_celery's own"
    if registry.by_task_name(task_name) is not None:
        return "the task of a job declared in code"
    return ""


def _choice(task: Any) -> Any:
    """The person's choice for ``task`` in the admin (``TrackedPeriodicTask``), None when there is none."""
    try:
        return task.cron_tracking
    except ObjectDoesNotExist:
        return None


def chosen(choose: Chooser | None, task: Any) -> bool:
    """Whether ``task`` is tracked: the admin's yes or no for it, else ``choose`` (None: no); a chooser
    that raises tracks nothing of it (logged)."""
    choice = _choice(task)
    if choice is not None and choice.track is not None:
        return bool(choice.track)
    if choose is None:
        return False
    try:
        return bool(choose(task))
    except Exception:
        logger.exception("cron_celery: TRACK_PERIODIC_TASKS raised for the periodic task %r; it is not tracked",
                         task.name)
        return False


def catch_up(task: Any) -> str:
    """The catch-up policy of a tracked ``task``: the admin's for it, else ``TRACKED_CATCH_UP``."""
    choice = _choice(task)
    return str(choice.catch_up) if choice is not None and choice.catch_up else str(conf.settings.TRACKED_CATCH_UP)


#: Whether this process imported the Celery app's task modules ("done"), and whether that failed.
_imports = {"done": False, "failed": False}


def unregistered(task_name: str) -> str:
    """Why a tracked periodic task's messages cannot run, in words: its task is not one the project's
    Celery app knows (a typo, an app not installed), so every worker drops them. '' when it is known,
    or when this process has no app of the project's to ask (Celery's default app)."""
    app = current_app
    if getattr(app, "main", None) in (None, "default"):
        return ""
    if not _imports["done"]:  # the tasks modules a worker imports at its start (autodiscovery too)
        _imports["done"] = True
        try:
            app.loader.import_default_modules()
        except Exception:  # a module this process cannot import (a worker-only dependency): not this task's fault
            logger.exception("cron_celery: the Celery app's task modules could not all be imported here; tracked "
                             "periodic tasks are not checked against its registered tasks in this process")
            _imports["failed"] = True
    if _imports["failed"] or task_name in app.tasks:
        return ""
    return (f"its task {task_name!r} is not registered with the Celery app (a typo, or an app that is not "
            "installed?): every worker drops its messages")
