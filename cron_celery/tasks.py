"""``TrackedTask`` (the Celery base class of every job) and the two ways to declare a job."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar, overload

import celery
from celery import shared_task

from cron_celery import claims, exceptions, models, registry, runs, schedules

logger = logging.getLogger(__name__)

#: Message headers that beat and ``run_cron_task --enqueue`` put on a job's message.
HEADER_SLOT = "cron_slot"
HEADER_EXECUTION = "cron_execution_id"
HEADER_TRIGGER = "cron_trigger"
HEADER_FORCE = "cron_force"
HEADER_RERUN = "cron_rerun"

F = TypeVar("F", bound=Callable[..., Any])

#: Job options that ``cron_task`` and ``register_task`` take besides Celery's own.
JOB_OPTIONS = ("max_retries", "retry_backoff", "retry_backoff_max", "retry_jitter", "retry_on",
               "retry_on_failure", "soft_time_limit", "time_limit", "notify", "alert_after", "alert_repeat")


def headers(execution_id: int, slot: dt.datetime, trigger: str, *, force: bool = False,
            rerun: bool = False) -> dict[str, Any]:
    """The message headers that point a delivery at its execution row."""
    values: dict[str, Any] = {HEADER_SLOT: schedules.iso(slot), HEADER_EXECUTION: execution_id,
                              HEADER_TRIGGER: trigger}
    if force:
        values[HEADER_FORCE] = True
    if rerun:
        values[HEADER_RERUN] = True
    return values


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sent:
    """A run sent to the workers on request: its PENDING execution and Celery task."""

    execution_id: int
    run_number: int
    celery_task_id: str


def send_run(job: registry.Job, slot: dt.datetime, trigger: str, *, force: bool = False,
             rerun: bool = False) -> Sent:
    """Send one run of a slot to the workers (``run_cron_task --enqueue``, the API, the admin,
    backfills): a PENDING execution, then its message. If the broker refuses the message the
    execution is closed FAILED (``PUBLISH_FAILED``) and ``PublishFailed`` is raised."""
    from celery import current_app

    execution_id, run_number = claims.enqueue(
        job=job, job_id=runs.job_id(job), slot=slot, execution_date=schedules.execution_date(slot, job.tzinfo),
        trigger=trigger, forced=force or rerun,
    )
    try:
        result = current_app.send_task(job.task_name, headers=headers(execution_id, slot, trigger, force=force,
                                                                      rerun=rerun))
    except Exception as exc:
        # Nothing was sent: close the PENDING row so it does not block the slot.
        claims.abandon(execution_id, f"Could not send the run to the broker: {exc}")
        raise exceptions.PublishFailed(f"({type(exc).__name__}: {exc})") from None
    claims.set_celery_task_id(execution_id, result.id)
    return Sent(execution_id=execution_id, run_number=run_number, celery_task_id=str(result.id))


def send(app: celery.Celery, task_name: str, *, execution_id: int, slot: dt.datetime, trigger: str,
         countdown: float | None = None, celery_task_id: str | None = None) -> None:
    """Send a message for an existing execution (a retry, or the reconciler re-sending one)."""
    app.send_task(task_name, task_id=celery_task_id, headers=headers(execution_id, slot, trigger),
                  countdown=countdown)


class TrackedTask(celery.Task):  # type: ignore[type-arg]
    """A Celery task that runs one slot of a job exactly once and records it.

    Called by a worker with the slot headers (from beat or ``--enqueue``) it claims that
    execution; called without them (``task.delay(slot=...)``, ``task()``) it creates one
    for the given slot (``slot=`` or ``execution_date=``; default: the current minute).
    """

    #: The job's declaration; set when the task is declared.
    job: ClassVar[registry.Job | None] = None
    #: Acknowledge after the run, and requeue if the worker dies: safe, because the
    #: database claim refuses a second run of the same execution.
    acks_late = True
    reject_on_worker_lost = True
    #: The worker's parent records a child killed by the hard time limit or lost (``parent``).
    Request = "cron_celery.parent:CronRequest"
    #: Jobs take a ``Run``, not the message's arguments: do not check call signatures.
    typing = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        job = self.job or registry.by_task_name(self.name)
        if job is None:
            raise exceptions.UnknownJob(name=self.name, known="(not declared as a job)")
        request = self.request
        execution_id = request.get(HEADER_EXECUTION)
        slot_value = kwargs.pop("slot", None) or request.get(HEADER_SLOT)
        day = kwargs.pop("execution_date", None)
        force = bool(kwargs.pop("force", False) or request.get(HEADER_FORCE))
        rerun = bool(kwargs.pop("rerun", False) or request.get(HEADER_RERUN))
        if slot_value is None and day is not None:
            slot_value = day if isinstance(day, dt.date) else schedules.parse_date(str(day))
        if slot_value is None:
            slot = schedules.floor_minute(dt.datetime.now(dt.UTC))
        else:
            slot = schedules.parse_slot(slot_value, job.tzinfo)
        trigger = request.get(HEADER_TRIGGER) or (
            models.Trigger.BEAT if execution_id is not None else models.Trigger.DIRECT
        )
        on_worker = not (request.called_directly or request.is_eager)
        outcome = runs.execute(
            job, slot, lambda run: runs.call_job(self.run, run, *args, **kwargs),
            trigger=trigger, execution_id=int(execution_id) if execution_id else None,
            force=force, rerun=rerun, celery_task_id=request.id or "", allow_retry=on_worker,
        )
        if outcome.status == models.Status.RETRYING and outcome.execution_id is not None:
            # The lock is released and the row says RETRYING; the new message claims it.
            raise self.retry(
                countdown=outcome.countdown, exc=outcome.exc if isinstance(outcome.exc, Exception) else None,
                max_retries=job.max_retries,
                headers=headers(outcome.execution_id, slot, trigger, force=force, rerun=rerun),
            )
        if outcome.exc is not None:
            raise outcome.exc
        return {
            "execution_id": outcome.execution_id,
            "status": outcome.status,
            "message": outcome.message[:500],
            "result": outcome.result,
        }

    def run(self, run: runs.Run, *args: Any, **kwargs: Any) -> Any:
        """Class-style jobs implement ``execute(date)``; this calls it."""
        return self.execute(run.execution_date)

    def execute(self, date: dt.date) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define execute(self, date)")


def _split_options(job: str, options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(Celery's task options, the job's retry, time-limit and alert policy)."""
    for refused, instead in (("autoretry_for", "retry_on"), ("acks_late", None), ("reject_on_worker_lost", None)):
        if refused in options:
            hint = f"use {instead}= instead" if instead else "cron jobs always acknowledge late, safely"
            raise exceptions.ImproperlyDeclared(f"{refused}= is not a cron job option ({hint}).", job=job)
    policy = {key: options[key] for key in JOB_OPTIONS if key in options}
    rest = {key: value for key, value in options.items() if key not in policy}
    return rest, policy


def _celery_limits(job: registry.Job) -> dict[str, Any]:
    """What Celery itself must know of the policy: its time limits and retry cap."""
    limits: dict[str, Any] = {"max_retries": job.max_retries}
    if job.soft_time_limit is not None:
        limits["soft_time_limit"] = job.soft_time_limit
    if job.time_limit is not None:
        limits["time_limit"] = job.time_limit
    return limits


def _task_name(obj: Any) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


@overload
def cron_task(func: F, /) -> Any: ...
@overload
def cron_task(
    func: None = None, /, *, name: str | None = None, code: str | None = None, **options: Any
) -> Callable[[F], Any]: ...


def cron_task(
    func: F | None = None,
    /,
    *,
    name: str | None = None,
    code: str | None = None,
    pattern: object = None,
    overlap: object = None,
    timezone: str | None = None,
    description: str = "",
    task_name: str | None = None,
    schedule: object = None,
    catch_up: object = None,
    **celery_options: Any,
) -> Any:
    """Declare a job from a function that takes a ``Run``::

        @cron_task(name="calc-commission", code="A001", pattern="rerun_on_failure")
        def calc_commission(run: Run) -> str: ...

    The result is a Celery task (base class ``TrackedTask``). Extra keyword arguments
    are Celery task options (``queue=``, ``time_limit=``...).
    """

    def decorator(fn: F) -> Any:
        job_name = name or fn.__name__.replace("_", "-")
        if code is None:
            raise exceptions.ImproperlyDeclared("give it a short stable code, e.g. code='A001'.",
                                                job=job_name)
        tname = task_name or _task_name(fn)
        options, policy = _split_options(job_name, celery_options)
        job = registry.register(registry.declare(
            name=job_name, code=code, task_name=tname, pattern=pattern, overlap=overlap,
            timezone=timezone, description=description or (fn.__doc__ or "").strip(),
            schedule=schedule, catch_up=catch_up, **policy,
        ))
        return shared_task(name=tname, base=TrackedTask, job=job, **options, **_celery_limits(job))(fn)  # type: ignore[no-untyped-call]

    if func is not None:
        return decorator(func)
    return decorator


def register_task(
    name: str,
    code: str,
    *,
    execution_pattern: object = None,
    pattern: object = None,
    overlap: object = None,
    timezone: str | None = None,
    description: str = "",
    schedule: object = None,
    catch_up: object = None,
    **celery_options: Any,
) -> Callable[[type[TrackedTask]], Any]:
    """Declare a job in the class style: a ``TrackedTask`` subclass with ``execute(date)``."""

    def decorator(cls: type[TrackedTask]) -> Any:
        if not (isinstance(cls, type) and issubclass(cls, TrackedTask)):
            raise exceptions.ImproperlyDeclared(
                "@register_task decorates a subclass of cron_celery.TrackedTask.", job=name
            )
        options, policy = _split_options(name, celery_options)
        tname = options.pop("task_name", None) or _task_name(cls)
        job = registry.register(registry.declare(
            name=name, code=code, task_name=tname, pattern=execution_pattern or pattern,
            overlap=overlap, timezone=timezone,
            description=description or (cls.__doc__ or "").strip(),
            schedule=schedule, catch_up=catch_up, **policy,
        ))

        def entry(self: TrackedTask, run: runs.Run, *args: Any, **kwargs: Any) -> Any:
            return self.execute(run.execution_date)

        entry.__name__ = cls.__name__  # type: ignore[assignment]
        entry.__qualname__ = cls.__qualname__
        entry.__module__ = cls.__module__
        entry.__doc__ = cls.__doc__
        return shared_task(name=tname, base=cls, bind=True, job=job, **options, **_celery_limits(job))(entry)  # type: ignore[no-untyped-call]

    return decorator
