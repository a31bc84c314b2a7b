"""The two ways to declare a job: ``cron_task`` (a function taking a ``Run``) and ``register_task`` (a
``TrackedTask`` subclass with ``execute``); the options they take, and the mistakes they refuse."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar, overload

import celery
from celery import shared_task

from cron_celery import exceptions, spelling
from cron_celery.declaring import params, registry
from cron_celery.run import runs
from cron_celery.run.tasks import TrackedTask

F = TypeVar("F", bound=Callable[..., Any])

#: The declaration's own keywords (named parameters of ``cron_task`` and ``register_task``).
DECLARATION_OPTIONS = ("name", "code", "pattern", "execution_pattern", "overlap", "timezone", "description",
                       "schedule", "catch_up")
#: Job options that ``cron_task`` and ``register_task`` take besides Celery's own.
JOB_OPTIONS = ("max_retries", "retry_backoff", "retry_backoff_max", "retry_jitter", "retry_on",
               "retry_on_failure", "soft_time_limit", "time_limit", "notify", "alert_after", "alert_repeat",
               "max_concurrency", "concurrency_group", "jitter", "after", "active_from", "active_until",
               "alert_on_upstream", "start_deadline", "max_runtime", "min_runtime", "catch_up_window",
               "pause_after_failures")



#: Celery's own options that a job's task cannot take, and what to use instead (None: nothing).
#: Celery task options a cron job refuses, and why (what to use instead).
REFUSED_OPTIONS = {
    "autoretry_for": "use retry_on= instead", "dont_autoretry_for": "use retry_on= instead",
    "retry_kwargs": "use max_retries= instead",
    "acks_late": "cron jobs always acknowledge late, safely",
    "reject_on_worker_lost": "cron jobs always acknowledge late, safely",
    "acks_on_failure_or_timeout": "cron jobs always acknowledge late, safely",
    "default_retry_delay": "a job's retries wait by retry_backoff=, retry_backoff_max= and retry_jitter=",
    "Request": "a cron job's task keeps cron_celery's request class, which records killed and revoked runs",
}
#: Names from other schedulers and habits, and the option they mean here.
MEANT = {"timeout": "time_limit", "soft_timeout": "soft_time_limit", "retries": "max_retries",
         "backoff": "retry_backoff", "tz": "timezone", "cron": "schedule", "retry_delay": "retry_backoff",
         "execution_pattern": "pattern"}
#: Options of Celery's task decorator and of sending that are not attributes of its Task class.
DECORATOR_OPTIONS = ("base", "bind", "shared", "lazy", "filter", "pydantic", "pydantic_strict", "pydantic_context",
                     "pydantic_dump_kwargs", "queue", "exchange", "exchange_type", "routing_key", "delivery_mode",
                     "compression", "store_eager_result", "task_name")
#: Attributes of Celery's Task class that are not options.
NOT_OPTIONS = ("app", "request", "request_stack", "from_config", "abstract", "job")


@functools.cache
def celery_options() -> frozenset[str]:
    """The task options Celery accepts: its Task class's settable attributes and the decorator's
    own, less those a cron job refuses."""
    found = {key for key in dir(celery.Task) if not key.startswith("_") and key[0].islower()
             and not isinstance(inspect.getattr_static(celery.Task, key), classmethod | staticmethod)
             and not callable(inspect.getattr_static(celery.Task, key))}
    return frozenset(found | set(DECORATOR_OPTIONS)) - set(NOT_OPTIONS) - set(REFUSED_OPTIONS) - set(JOB_OPTIONS)


def _split_options(job: str, options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(Celery's task options, the job's retry, time-limit and alert policy). Anything else is a
    mistake (``max_retry=`` for ``max_retries=``) and refused, naming the closest known option:
    Celery would keep it as a task attribute and the job would silently run without it."""
    for refused, why in REFUSED_OPTIONS.items():
        if refused in options:
            raise exceptions.ImproperlyDeclared(f"{refused}= is not a cron job option ({why}).", job=job)
    known = celery_options() | set(JOB_OPTIONS)
    unknown = sorted(key for key in options if key not in known)
    if unknown:
        key = unknown[0]
        # cron_task's execution_pattern= (register_task's name for it) reaches here: it means pattern=.
        near = key if key in MEANT else spelling.closest(key, known | set(DECLARATION_OPTIONS) | set(MEANT))
        close = [near] if near else []
        hint = f"did you mean {MEANT.get(close[0], close[0])}=?" if close else \
            f"the job options are {', '.join(DECLARATION_OPTIONS + JOB_OPTIONS)}, besides Celery's task options"
        raise exceptions.ImproperlyDeclared(
            f"{key}= is neither a cron job option nor a Celery task option ({hint}).", job=job)
    policy = {key: options[key] for key in JOB_OPTIONS if key in options}
    rest = {key: value for key, value in options.items() if key not in policy}
    return rest, policy


def _base_class(job: str, base: object) -> type[TrackedTask]:
    """``cron_task(base=...)``: a ``TrackedTask`` subclass (a project's own base class)."""
    if not (isinstance(base, type) and issubclass(base, TrackedTask)):
        raise exceptions.ImproperlyDeclared(
            f"base= must be a subclass of cron_celery.TrackedTask, not {base!r} (a job's task "
            "records its runs through TrackedTask; derive your base class from it).", job=job)
    return base


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

        @cron_task(name="calc-commission", code="A001", schedule="0 2 * * *", max_retries=2)
        def calc_commission(run: Run) -> str: ...

    The result is a Celery task (base class ``TrackedTask``). Keyword-only parameters after ``run``
    are the job's parameters (typed; valued by the periodic task's kwargs or per run). A misspelt
    option is refused, naming the closest one. The options, each with its default:

    Naming and scheduling:

    - ``name=``: the job's name, a lower-case slug (default: the function's name, ``_`` as ``-``).
    - ``code=``: a short stable code, required (``"A001"``); the job's identity across renames.
    - ``schedule=``: a cron string, ``crontab(...)`` or a builder (``daily(at(6).am())``,
      ``every(minutes=15)``), read in the job's timezone (default: none, run only when asked).
    - ``timezone=``: an IANA name (default ``DEFAULT_TIMEZONE``, else Django's ``TIME_ZONE``).
    - ``catch_up=``: ``"latest"`` (default), ``"none"`` or ``"all"``: slots missed while no beat ran.
    - ``catch_up_window=``: a ``timedelta`` or seconds: a missed slot older than this is recorded
      ``MISSED`` whatever ``catch_up`` says (default: none).
    - ``pattern=``: ``"standard"`` (default: once per slot), ``"rerun_on_failure"``, ``"always"`` or
      ``"rate_limited"``.
    - ``overlap=``: ``"skip"`` (default: a slot meeting a live run is skipped) or ``"allow"``.
    - ``description=``: shown in listings (default: the function's docstring).
    - ``task_name=``: the Celery task's name (default ``module.function``).
    - ``jitter=``: seconds; each slot is sent a fixed offset in ``[0, jitter)`` after it, from the
      job's code (default ``DEFAULT_JITTER``).
    - ``active_from=``, ``active_until=``: aware datetimes bounding the slots that run (default: always).
    - ``after=``: a job name or a list of them: no schedule; each slot runs once all of them succeeded
      in it, and is skipped when one did not (default: none).

    Running and retrying:

    - ``max_retries=``: attempts after the first (default ``DEFAULT_MAX_RETRIES``, 0).
    - ``retry_on=``: the exception classes that retry (default ``Exception``).
    - ``retry_on_failure=``: also retry a reported failure (``JobFailed``) (default ``False``).
    - ``retry_backoff=``: seconds of the first wait, doubled each retry (default ``True``: 1 s;
      ``False``: a fixed 180 s).
    - ``retry_backoff_max=``: the longest wait in seconds (default 600).
    - ``retry_jitter=``: each wait a random time up to the computed one (default ``True``).
    - ``soft_time_limit=``: seconds; the body gets ``SoftTimeLimitExceeded`` (default: none).
    - ``time_limit=``: seconds; the process is killed, the attempt ``TIMED_OUT`` (default: none).
    - ``max_concurrency=``: for ``overlap="allow"``, at most this many live runs (default: none).
    - ``concurrency_group=``: a group of ``CONCURRENCY_GROUPS`` whose limit the job shares (default: none).

    Alerting:

    - ``notify=``: this job's channels, ``{"on_failure": [...], "on_recovery": [...],
      "on_success": [...]}`` (default: the settings' lists).
    - ``alert_after=``: failures in a row before an incident's first alert (default 1).
    - ``alert_repeat=``: seconds after which a still-failing job alerts again (default: once).
    - ``alert_on_upstream=``: with ``after=``, a slot skipped because an upstream failed alerts this
      job's failure channels too (default ``False``).
    - ``start_deadline=``: seconds; a run not started this long after it was due alerts ``LATE``.
    - ``max_runtime=``: seconds; a run going this long alerts ``LONG_RUNNING`` (it is not stopped).
    - ``min_runtime=``: seconds; a success faster than this alerts ``TOO_FAST``.
    - ``pause_after_failures=``: after this many final failures in a row the job pauses itself and
      alerts ``PAUSED``, listing them; a person resumes it (default: never).

    Any other keyword is a Celery task option (``queue=``, ``priority=``, ``bind=``, ``base=`` a
    ``TrackedTask`` subclass...). Each option in full: docs/configuration.md, "Per-job options".
    """

    def decorator(fn: F) -> Any:
        job_name = name or fn.__name__.replace("_", "-")
        if code is None:
            raise exceptions.ImproperlyDeclared("give it a short stable code, e.g. code='A001'.",
                                                job=job_name)
        tname = task_name or _task_name(fn)
        options, policy = _split_options(job_name, celery_options)
        base = _base_class(job_name, options.pop("base", TrackedTask))
        # Its parameters: keyword-only, after ``run`` (after ``self, run`` for a bound task).
        declared = params.from_signature(fn, skip=2 if options.get("bind") else 1, job=job_name)
        job = registry.register(registry.declare(
            name=job_name, code=code, task_name=tname, pattern=pattern, overlap=overlap,
            timezone=timezone, description=description or (fn.__doc__ or "").strip(),
            schedule=schedule, catch_up=catch_up, parameters=declared, **policy,
        ))
        return shared_task(name=tname, base=base, job=job, **options, **_celery_limits(job))(fn)  # type: ignore[no-untyped-call]

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
        if "base" in options:
            raise exceptions.ImproperlyDeclared(
                "base= is not a register_task option: the class it decorates is the task's base class.", job=name)
        tname = options.pop("task_name", None) or _task_name(cls)
        job = registry.register(registry.declare(
            name=name, code=code, task_name=tname, pattern=execution_pattern or pattern,
            overlap=overlap, timezone=timezone,
            description=description or (cls.__doc__ or "").strip(),
            schedule=schedule, catch_up=catch_up, parameters=params.from_signature(cls.execute, skip=2, job=name),
            **policy,
        ))

        def entry(self: TrackedTask, run: runs.Run, *args: Any, **kwargs: Any) -> Any:
            return self.execute(run.execution_date, **run.params)

        entry.__name__ = cls.__name__  # type: ignore[assignment]
        entry.__qualname__ = cls.__qualname__
        entry.__module__ = cls.__module__
        entry.__doc__ = cls.__doc__
        return shared_task(name=tname, base=cls, bind=True, job=job, **options, **_celery_limits(job))(entry)  # type: ignore[no-untyped-call]

    return decorator
