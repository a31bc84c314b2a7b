"""The worker's side of a tracked periodic task: its own task, unchanged, claims the slot first.

When a worker starts (``worker_init``, before a prefork pool forks) every task of the app that is
not a cron job's gets two instance attributes over its class's: ``run``, which looks for the
``cron_job`` header (``run.tasks.HEADER_JOB``) and, only when a message carries it, runs the body
through the same claim, lease and fenced final write as a cron job's (``runs.execute``); and
``retry``, which puts the slot's headers on the next attempt's message, so a task's own
``self.retry()`` or ``autoretry_for`` stays an attempt of the same execution; and, where the task
keeps Celery's own request class, ``Request``: the worker's parent then records a child that the hard
time limit killed (``TIMED_OUT``) or that died (``LOST``) at once (``run.parent``). A message without the
header (the application's own ``delay()``) runs exactly as before. Celery's tracer calls ``run``
(or the class's ``__call__``, which calls ``run``), so custom base classes, ``bind=True``, Sentry's
patching and tenant-schemas-celery's ``TenantTask`` sit around it unchanged.

It is installed on every worker, whatever ``TRACK_PERIODIC_TASKS`` says where the worker runs: the
beat decides what is tracked, and a worker that would run a tracked message untracked would leave
its slot for the reconciler to send again.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any

import celery
from celery import signals
from celery.exceptions import Ignore
from celery.worker.request import Request

from cron_celery import enums, exceptions, slots
from cron_celery.declaring import registry
from cron_celery.run import clocks, runs, tasks

logger = logging.getLogger(__name__)
#: Marks a task's ``run`` as wrapped here.
WRAPPED = "__cron_celery_tracked__"
#: The headers a tracked delivery carries, passed on to a retry's message.
PASSED_ON = (tasks.HEADER_JOB, tasks.HEADER_EXECUTION, tasks.HEADER_SLOT, tasks.HEADER_TRIGGER,
             tasks.HEADER_FORCE, tasks.HEADER_RERUN)

#: Celery's own request class, as a task names it; the parent's that records a killed child instead.
CELERY_REQUEST = ("celery.worker.request:Request", Request)
CRON_REQUEST = "cron_celery.run.parent:CronRequest"

_current = threading.local()


def connect() -> None:
    """Wrap the tasks of every worker that starts in this process (``worker_init``)."""
    signals.worker_init.connect(_on_worker_init, weak=False)


def _on_worker_init(sender: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None) or celery.current_app
    wrapped, refused = install(app)
    logger.info("cron_celery: %d task(s) ready to run tracked periodic tasks%s", wrapped,
                f" ({len(refused)} could not be wrapped)" if refused else "")


def install(app: celery.Celery) -> tuple[int, list[str]]:
    """Wrap every task of ``app`` that is not a cron job's: (how many, the names that could not be)."""
    wrapped, refused = 0, []
    for name, task in sorted(app.tasks.items()):
        if isinstance(task, tasks.TrackedTask) or getattr(task.run, WRAPPED, False):
            continue
        try:
            wrap(task)
        except Exception as error:  # loud: its tracked messages would run here without a claim
            logger.error("cron_celery: the task %s cannot be wrapped (%s: %s): a tracked periodic task of it runs "
                         "on this worker without its slot claimed or recorded; leave it out of TRACK_PERIODIC_TASKS "
                         "or give it a run method", name, type(error).__name__, error)
            refused.append(name)
            continue
        wrapped += 1
    return wrapped, refused


def wrap(task: celery.Task) -> None:  # type: ignore[type-arg]
    """Put the tracked ``run`` and ``retry`` on this task instance (see the module doc)."""
    original_run, original_retry = task.run, task.retry

    @functools.wraps(original_run)
    def run(*args: Any, **kwargs: Any) -> Any:
        request = task.request
        code = request.get(tasks.HEADER_JOB) if request is not None else None
        if not code:
            return original_run(*args, **kwargs)
        return run_tracked(task, str(code), original_run, args, kwargs)

    @functools.wraps(original_retry)
    def retry(*args: Any, **options: Any) -> Any:
        passed = getattr(_current, "headers", None)
        if passed:
            options["headers"] = {**(options.get("headers") or {}), **passed}
        return original_retry(*args, **options)

    setattr(run, WRAPPED, True)
    try:
        task.run = run  # type: ignore[method-assign]
        task.retry = retry  # type: ignore[method-assign]
    except (AttributeError, TypeError):  # a class that will not take them on the instance (a read-only property)
        _subclassed(task, run, retry)
    task.__trace__ = None  # a tracer built already called the old run: build it again
    if task.Request in CELERY_REQUEST:  # a request class of the task's own is left alone
        # The parent records a child the hard time limit killed, or that died, at once (``run.parent``).
        task.Request = CRON_REQUEST


def _subclassed(task: celery.Task, run: Any, retry: Any) -> None:  # type: ignore[type-arg]
    """Give ``task`` a class of its own, a subclass of its class whose ``run`` and ``retry`` are the
    wrapped ones (with no slots of its own, so that the instance's layout is the same)."""
    cls: Any = type(task)
    task.__class__ = type(cls.__name__, (cls,), {
        "__slots__": (), "__module__": cls.__module__, "__qualname__": cls.__qualname__,
        "run": staticmethod(run), "retry": staticmethod(retry)})


def run_tracked(task: celery.Task, code: str, body: Any, args: tuple[Any, ...],  # type: ignore[type-arg]
                kwargs: dict[str, Any]) -> Any:
    """One delivery of a tracked periodic task's slot: claimed, its body called with the arguments
    on the execution's row, its outcome written. What the body returned is the task's result, as
    before; a delivery the claim does not let run (a duplicate, a skip) is ``Ignore``d."""
    request = task.request
    job = registry.get(code)
    if not job.tracked:
        raise exceptions.UnknownJob(name=code, known="(not a tracked periodic task)")
    execution_id = request.get(tasks.HEADER_EXECUTION)
    slot_value = request.get(tasks.HEADER_SLOT)
    slot = slots.parse_slot(slot_value, job.tzinfo) if slot_value else slots.floor_minute(clocks.now())
    trigger = request.get(tasks.HEADER_TRIGGER) or enums.Trigger.BEAT
    passed = {name: value for name in PASSED_ON if (value := request.get(name)) is not None}
    returned: list[Any] = []

    def call(run: runs.Run) -> Any:
        values = dict(run.params)
        _current.headers = passed
        try:
            value = body(*values.get("args", args), **values.get("kwargs", kwargs))
        finally:
            _current.headers = None
        returned.append(value)
        return value

    outcome = runs.execute(
        job, slot, call, trigger=trigger, execution_id=int(execution_id) if execution_id else None,
        force=bool(request.get(tasks.HEADER_FORCE)), rerun=bool(request.get(tasks.HEADER_RERUN)),
        celery_task_id=request.id or "", allow_retry=not (request.called_directly or request.is_eager),
    )
    if outcome.exc is not None:
        raise outcome.exc
    if not returned:  # not run here: another delivery ran it, or it was skipped; no result of its own
        raise Ignore(f"{job.name} {slots.iso(slot)}: {outcome.status} {outcome.message}".strip())
    return returned[0]
