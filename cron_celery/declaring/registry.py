"""Job declarations (name, code, policies) and their lookup.

A job is declared once in code with ``@cron_task`` or ``@register_task``; this module
keeps the declarations and refuses two jobs with the same name or code.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import hashlib
import threading
import time
import zoneinfo
from collections.abc import Callable, Mapping

from cron_celery import conf, enums, exceptions, schedules, slots
from cron_celery.declaring import options, params

NAME_RE, CODE_RE = options.NAME_RE, options.CODE_RE


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Job:
    """A job's declaration: what it is called and how its slots may run."""

    name: str
    code: str
    task_name: str
    pattern: enums.ExecutionPattern
    overlap: enums.Overlap
    timezone: str
    description: str = ""
    schedule: schedules.Schedule | None = None
    catch_up: enums.CatchUp = enums.CatchUp.LATEST
    #: Seconds: an overdue slot older than this is recorded MISSED whatever ``catch_up`` says (None:
    #: no window; see ``catch_up.plan_catch_up``).
    catch_up_window: float | None = None
    #: Retries (see ``retries``): attempts after the first, the backoff (seconds, True = 1,
    #: False = Celery's ``default_retry_delay``), its cap and jitter, which exceptions
    #: retry, and whether a reported failure (``{"error": True}``, ``JobFailed``) does.
    max_retries: int = 0
    retry_backoff: float | bool = True
    retry_backoff_max: float = 600
    retry_jitter: bool = True
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    retry_on_failure: bool = False
    #: Seconds: the soft limit raises ``SoftTimeLimitExceeded`` in the job, the hard limit
    #: kills the worker process; ``None`` = no limit.
    soft_time_limit: float | None = None
    time_limit: float | None = None
    #: Alerts: channels per kind (``on_failure``...) overriding ``NOTIFICATIONS``, failures in
    #: a row before the first alert, and seconds between repeats of one incident (None: once).
    notify: tuple[tuple[str, tuple[str, ...]], ...] | None = None
    alert_after: int = 1
    alert_repeat: int | None = None
    #: For overlap ``allow`` jobs: at most this many live runs at once (None: no limit).
    max_concurrency: int | None = None
    #: A limit shared with other jobs (``CONCURRENCY_GROUPS[name]`` live runs of all its jobs at
    #: once; see ``groups``); None: the job belongs to no group.
    concurrency_group: str | None = None
    #: Seconds: each slot's message is sent ``jitter_ms`` after the slot (a fixed offset in
    #: ``[0, jitter)`` derived from the code); 0 = at the slot. The slot itself does not move.
    jitter: float = 0
    #: ``after=``: the names of the upstream jobs. Such a job has no schedule of its own: each of
    #: its slots runs once all its upstreams succeeded in it (see ``dependencies``).
    after: tuple[str, ...] = ()
    #: A job declared with ``after=``: a slot skipped because an upstream failed (FAILED, TIMED_OUT,
    #: LOST) alerts this job's failure channels too (event ``UPSTREAM``; see ``alerts``).
    alert_on_upstream: bool = False
    #: The active window (aware, UTC): no slot before ``active_from`` or at/after ``active_until`` is
    #: dispatched or recorded. Written to the periodic task's ``start_time``/``expires``, editable there.
    active_from: dt.datetime | None = None
    active_until: dt.datetime | None = None
    #: Timing alerts (seconds; None: none): a run not started ``start_deadline`` after it was due
    #: alerts LATE, a run still going ``max_runtime`` after it started alerts LONG_RUNNING (it is not
    #: stopped: that is ``time_limit``), a success faster than ``min_runtime`` alerts TOO_FAST.
    start_deadline: float | None = None
    max_runtime: float | None = None
    min_runtime: float | None = None
    #: After this many final failures in a row the job pauses itself, and says so in a PAUSED alert
    #: (``pauses.after_failures``); None: never.
    pause_after_failures: int | None = None
    #: The keyword-only parameters its function (or ``execute``) takes after ``run`` (``params``): read
    #: from the signature once, here; a run's values are checked against them.
    parameters: tuple[params.Param, ...] = ()
    #: A django-celery-beat periodic task tracked as a job (``TRACK_PERIODIC_TASKS``), not declared in
    #: code: its body is the periodic task's own Celery task, run with the periodic task's arguments.
    tracked: bool = False

    @property
    def jitter_ms(self) -> int:
        """This job's dispatch offset in milliseconds: the same on every beat and after every
        deploy (a hash of the code, not of the process), below ``jitter``."""
        span = int(self.jitter * 1000)
        if span <= 0:
            return 0
        return int.from_bytes(hashlib.sha256(self.code.encode()).digest()[:8], "big") % span

    def notify_for(self, kind: str) -> tuple[str, ...] | None:
        """This job's own channels for ``on_failure``/``on_recovery``/``on_success``, if it has any."""
        return dict(self.notify).get(kind) if self.notify is not None else None

    @property
    def exclusive(self) -> bool:
        """Never two runs at once (overlap ``skip`` or ``buffer_one``, or the ``rate_limited`` pattern)."""
        return self.overlap != enums.Overlap.ALLOW or self.pattern == enums.ExecutionPattern.RATE_LIMITED

    @property
    def limit(self) -> int | None:
        """Live runs allowed at once, decided in the claim: 1 for an exclusive job, else its
        ``max_concurrency``; None when any number may run."""
        return 1 if self.exclusive else self.max_concurrency

    @property
    def tzinfo(self) -> zoneinfo.ZoneInfo:
        return zoneinfo.ZoneInfo(self.timezone)

    def first_slot_on(self, day: dt.date) -> dt.datetime | None:
        """The job's first slot on a local date: its schedule's, or local midnight."""
        midnight = slots.slot_for_date(day, self.tzinfo)
        if self.schedule is None:
            return midnight
        slot = self.schedule.next_after(midnight - dt.timedelta(seconds=1))
        return slot if slots.execution_date(slot, self.tzinfo) == day else None

    def next_slot(self, after: dt.datetime) -> dt.datetime | None:
        return self.schedule.next_after(after) if self.schedule is not None else None


_lock = threading.RLock()
_by_name: dict[str, Job] = {}
_by_code: dict[str, Job] = {}
_by_task: dict[str, Job] = {}
_discovered = False
#: Finds a job this process did not declare (a tracked periodic task's, read from its row), by name
#: or code; set once Django is ready (``set_loader``). Such jobs are kept ``_LOADED_SECONDS``.
_loader: Callable[[str], Job | None] | None = None
_loaded: dict[str, tuple[float, Job]] = {}
_LOADED_SECONDS = 5.0
#: The names that some declared job runs ``after=`` (None: to be worked out again).
_upstreams: frozenset[str] | None = None


def declare(
    *,
    name: str,
    code: str,
    task_name: str,
    pattern: object = None,
    overlap: object = None,
    timezone: str | None = None,
    description: str = "",
    schedule: object = None,
    catch_up: object = None,
    catch_up_window: object = None,
    max_retries: object = None,
    retry_backoff: object = True,
    retry_backoff_max: object = 600,
    retry_jitter: object = True,
    retry_on: object = None,
    retry_on_failure: object = False,
    soft_time_limit: object = None,
    time_limit: object = None,
    notify: object = None,
    alert_after: object = 1,
    alert_repeat: object = None,
    max_concurrency: object = None,
    concurrency_group: object = None,
    jitter: object = None,
    after: object = None,
    active_from: object = None,
    active_until: object = None,
    alert_on_upstream: object = False,
    start_deadline: object = None,
    max_runtime: object = None,
    min_runtime: object = None,
    pause_after_failures: object = None,
    parameters: object = (),
) -> Job:
    """Validate a declaration and build its ``Job``; raises ``ImproperlyDeclared``."""
    tz = options.read_identity(name, code, timezone)
    parsed = options.read_schedule(name, schedule, tz)
    retries, backoff, backoff_max, soft, hard = options.read_retry_policy(
        name, max_retries, retry_backoff, retry_backoff_max, soft_time_limit, time_limit)
    alerts_after = options.read_number(name, "alert_after", alert_after, integer=True, positive=True)
    repeat = options.read_number(name, "alert_repeat", alert_repeat, integer=True, optional=True, positive=True)
    chosen_pattern = options.read_choice(
        enums.ExecutionPattern, pattern if pattern is not None else conf.settings.DEFAULT_PATTERN, name, "pattern")
    chosen_overlap = options.read_choice(
        enums.Overlap, overlap if overlap is not None else conf.settings.DEFAULT_OVERLAP, name, "overlap")
    concurrency, group = options.read_limits(name, max_concurrency, concurrency_group, chosen_pattern, chosen_overlap)
    upstreams, window = options.read_after_and_window(name, after, parsed, active_from, active_until)
    deadline, longest, shortest = options.read_timing(name, start_deadline, max_runtime, min_runtime)
    if not (isinstance(parameters, tuple) and all(isinstance(item, params.Param) for item in parameters)):
        raise exceptions.ImproperlyDeclared(
            f"parameters must be a tuple of cron_celery.declaring.params.Param (read from the function's signature), "
            f"not {parameters!r}.", job=name)
    # These checks in the order they always ran: the first bad option of several is the one named.
    on_upstream = options.read_alert_on_upstream(name, alert_on_upstream, upstreams)
    spread = options.read_jitter(name, jitter, parsed)
    channels = options.read_notify(name, notify)
    retry_on_types = options.read_exception_types(name, retry_on)
    policy = options.read_choice(enums.CatchUp, catch_up if catch_up is not None else "latest", name, "catch_up")
    window_seconds = options.read_catch_up_window(name, catch_up_window, policy, parsed)
    pause_after = options.read_number(name, "pause_after_failures", pause_after_failures, integer=True,
                                      optional=True, positive=True)
    return Job(
        name=name, code=code, task_name=task_name, pattern=chosen_pattern, overlap=chosen_overlap, timezone=tz,
        description=description, schedule=parsed, catch_up=policy, catch_up_window=window_seconds,
        max_retries=int(retries), retry_backoff=backoff if backoff is not None else True,
        retry_backoff_max=backoff_max if backoff_max is not None else 600, retry_jitter=bool(retry_jitter),
        retry_on=retry_on_types, retry_on_failure=bool(retry_on_failure),
        soft_time_limit=soft, time_limit=hard, notify=channels,
        alert_after=int(alerts_after or 1), alert_repeat=None if repeat is None else int(repeat),
        max_concurrency=None if concurrency is None else int(concurrency), concurrency_group=group,
        jitter=spread, after=upstreams, alert_on_upstream=on_upstream,
        active_from=window[0], active_until=window[1],
        start_deadline=deadline, max_runtime=longest, min_runtime=shortest,
        pause_after_failures=None if pause_after is None else int(pause_after),
        parameters=tuple(item for item in parameters if isinstance(item, params.Param)),
    )


def cycle_through(job: Job, jobs: Mapping[str, Job]) -> list[str] | None:
    """A cycle of ``after=`` that passes through ``job``, as names from it back to it; None if none."""
    path: list[str] = [job.name]

    def walk(name: str, seen: set[str]) -> list[str] | None:
        for upstream in jobs[name].after if name in jobs else ():
            if upstream == job.name:
                return [*path, job.name]
            if upstream in seen:
                continue
            seen.add(upstream)
            path.append(upstream)
            found = walk(upstream, seen)
            if found:
                return found
            path.pop()
        return None

    return walk(job.name, set())


def register(job: Job) -> Job:
    """Add a job; the same task declared again (a module re-import) replaces itself."""
    with _lock:
        for field, index in (("name", _by_name), ("code", _by_code)):
            existing = index.get(getattr(job, field))
            if existing is not None and existing.task_name != job.task_name:
                raise exceptions.DuplicateJob(
                    field=field,
                    value=getattr(job, field),
                    first=existing.task_name,
                    second=job.task_name,
                )
        if job.after:
            cycle = cycle_through(job, collections.ChainMap({job.name: job}, _by_name))
            if cycle:
                raise exceptions.ImproperlyDeclared(
                    "its after= makes a cycle: " + " runs after ".join(cycle) + ".", job=job.name)
        old = _by_task.get(job.task_name)
        if old is not None:
            _by_name.pop(old.name, None)
            _by_code.pop(old.code, None)
        _by_name[job.name] = job
        _by_code[job.code] = job
        _by_task[job.task_name] = job
        _forget_upstreams()
    return job


def _forget_upstreams() -> None:
    global _upstreams
    _upstreams = None


def has_downstream(name: str) -> bool:
    """Whether a job declared in this process runs ``after=`` the job named ``name``: only then
    does the end of its run look for downstream executions to send (one query saved per run of
    every other job)."""
    global _upstreams
    found = _upstreams
    if found is None:
        with _lock:
            found = _upstreams = frozenset(upstream for job in _by_name.values() for upstream in job.after)
    return name in found


def unregister(name: str) -> None:
    """Forget a job (tests that declare jobs on the fly use this)."""
    with _lock:
        job = _by_name.pop(name, None)
        if job is not None:
            _by_code.pop(job.code, None)
            _by_task.pop(job.task_name, None)
        _forget_upstreams()


def autodiscover() -> None:
    """Import every installed app's ``tasks`` module once, so that all jobs are declared."""
    global _discovered
    if _discovered or not conf.settings.AUTODISCOVER:
        return
    from django.utils.module_loading import autodiscover_modules

    with _lock:
        if not _discovered:
            autodiscover_modules("tasks")
            _discovered = True


def all_jobs() -> list[Job]:
    autodiscover()
    with _lock:
        return sorted(_by_name.values(), key=lambda job: job.name)


def get(name_or_code: str) -> Job:
    """The job with this name (or code) — declared in code, else a tracked periodic task's (the
    loader's); raises ``UnknownJob`` with the known names."""
    autodiscover()
    with _lock:
        job = _by_name.get(name_or_code) or _by_code.get(name_or_code)
        if job is not None:
            return job
        known = ", ".join(sorted(_by_name)) or "(none)"
    job = loaded(name_or_code)
    if job is not None:
        return job
    raise exceptions.UnknownJob(name=name_or_code, known=known)


def set_loader(loader: Callable[[str], Job | None] | None) -> None:
    """Where ``get`` finds the jobs no code declares (tracked periodic tasks): called by name or code."""
    global _loader
    with _lock:
        _loader = loader
        _loaded.clear()


def loaded(name_or_code: str, *, fresh: bool = False) -> Job | None:
    """A job the loader finds by name or code (None: none), read again after ``_LOADED_SECONDS``
    (an admin edit of its periodic task reaches every process within them) or when ``fresh``."""
    loader = _loader
    if loader is None:
        return None
    now = time.monotonic()
    with _lock:
        kept = _loaded.get(name_or_code)
    if kept is not None and not fresh and now - kept[0] < _LOADED_SECONDS:
        return kept[1]
    try:
        job = loader(name_or_code)
    except Exception:  # no database to ask (a process without one, a pure test): no job found there
        return None
    with _lock:
        if job is None:
            _loaded.pop(name_or_code, None)
        else:
            _loaded[name_or_code] = (now, job)
    return job


def by_task_name(task_name: str) -> Job | None:
    with _lock:
        return _by_task.get(task_name)
