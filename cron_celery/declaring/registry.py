"""Job declarations (name, code, policies) and their lookup.

A job is declared once in code with ``@cron_task`` or ``@register_task``; this module
keeps the declarations and refuses two jobs with the same name or code.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import functools
import hashlib
import math
import re
import threading
import zoneinfo
from collections.abc import Mapping
from typing import TypeVar

from django.conf import settings as django_settings

from cron_celery import conf, enums, exceptions, schedules
from cron_celery.declaring import params

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,99}$")
CODE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,49}$")


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
    #: The keyword-only parameters its function (or ``execute``) takes after ``run`` (``params``): read
    #: from the signature once, here; a run's values are checked against them.
    parameters: tuple[params.Param, ...] = ()

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
        """Never two runs at once (overlap ``skip``, or the ``rate_limited`` pattern)."""
        return self.overlap == enums.Overlap.SKIP or self.pattern == enums.ExecutionPattern.RATE_LIMITED

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
        midnight = schedules.slot_for_date(day, self.tzinfo)
        if self.schedule is None:
            return midnight
        slot = self.schedule.next_after(midnight - dt.timedelta(seconds=1))
        return slot if schedules.execution_date(slot, self.tzinfo) == day else None

    def next_slot(self, after: dt.datetime) -> dt.datetime | None:
        return self.schedule.next_after(after) if self.schedule is not None else None


_lock = threading.RLock()
_by_name: dict[str, Job] = {}
_by_code: dict[str, Job] = {}
_by_task: dict[str, Job] = {}
_discovered = False
#: The names that some declared job runs ``after=`` (None: to be worked out again).
_upstreams: frozenset[str] | None = None


E = TypeVar("E", enums.ExecutionPattern, enums.Overlap, enums.CatchUp)


def _choice(enum: type[E], value: object, job: str, what: str) -> E:
    if isinstance(value, enum):
        return value
    if isinstance(value, str):
        for member in enum:
            if value.lower() in (member.value, member.name.lower()):
                return member
    allowed = ", ".join(repr(member.value) for member in enum)
    raise exceptions.ImproperlyDeclared(
        f"{what} must be one of {allowed}, not {value!r}.", job=job
    )


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
    parameters: object = (),
) -> Job:
    """Validate a declaration and build its ``Job``; raises ``ImproperlyDeclared``."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise exceptions.ImproperlyDeclared(
            "the name must be a lower-case slug (letters, digits, '-' or '_'), "
            "at most 100 characters.",
            job=name,
        )
    if not isinstance(code, str) or not CODE_RE.match(code):
        raise exceptions.ImproperlyDeclared(
            "the code must be 1-50 letters, digits, '.', '-' or '_', e.g. 'A001'.", job=name
        )
    tz = timezone or conf.settings.DEFAULT_TIMEZONE or django_settings.TIME_ZONE or "UTC"
    try:
        zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
        raise exceptions.ImproperlyDeclared(
            f"unknown timezone {tz!r} (use an IANA name such as 'Europe/Amsterdam').", job=name
        ) from exc
    parsed: schedules.Schedule | None = None
    if schedule is not None:
        try:
            parsed = _checked(schedules.from_celery(schedule).in_timezone(tz))
        except (exceptions.InvalidSchedule, ValueError) as exc:
            raise exceptions.ImproperlyDeclared(f"its schedule is invalid: {exc}", job=name) from exc
    settings = conf.settings
    retries = _number(name, "max_retries", settings.DEFAULT_MAX_RETRIES if max_retries is None else max_retries,
                      integer=True)
    assert retries is not None
    backoff = retry_backoff if isinstance(retry_backoff, bool) else _number(name, "retry_backoff", retry_backoff)
    backoff_max = _number(name, "retry_backoff_max", retry_backoff_max)
    soft = _number(name, "soft_time_limit",
                   settings.DEFAULT_SOFT_TIME_LIMIT if soft_time_limit is None else soft_time_limit,
                   optional=True, positive=True)
    hard = _number(name, "time_limit", settings.DEFAULT_TIME_LIMIT if time_limit is None else time_limit,
                   optional=True, positive=True)
    if soft is not None and hard is not None and soft >= hard:
        raise exceptions.ImproperlyDeclared(
            f"soft_time_limit ({soft:g} s) must be shorter than time_limit ({hard:g} s), so the job "
            "can stop cleanly before it is killed.", job=name)
    alerts_after = _number(name, "alert_after", alert_after, integer=True, positive=True)
    repeat = _number(name, "alert_repeat", alert_repeat, integer=True, optional=True, positive=True)
    chosen_pattern = _choice(enums.ExecutionPattern, pattern if pattern is not None else conf.settings.DEFAULT_PATTERN,
                             name, "pattern")
    chosen_overlap = _choice(enums.Overlap, overlap if overlap is not None else conf.settings.DEFAULT_OVERLAP,
                             name, "overlap")
    concurrency = _number(name, "max_concurrency", max_concurrency, integer=True, optional=True, positive=True)
    if concurrency is not None and (chosen_overlap == enums.Overlap.SKIP
                                    or chosen_pattern == enums.ExecutionPattern.RATE_LIMITED):
        one = "overlap='skip'" if chosen_overlap == enums.Overlap.SKIP else "the rate_limited pattern"
        raise exceptions.ImproperlyDeclared(
            f"max_concurrency is for jobs declared with overlap='allow': {one} already runs one at a time.",
            job=name)
    group: str | None = None
    if concurrency_group is not None:
        if not (isinstance(concurrency_group, str) and NAME_RE.match(concurrency_group)):
            raise exceptions.ImproperlyDeclared(
                "concurrency_group must name a group of CRON_CELERY['CONCURRENCY_GROUPS'] (a lower-case slug), "
                f"not {concurrency_group!r}.", job=name)
        group = concurrency_group
    upstreams = _after(name, after)
    if upstreams and parsed is not None:
        raise exceptions.ImproperlyDeclared(
            "a job declared with after= has no schedule of its own (its slots are its upstream jobs'): "
            "drop schedule= or after=.", job=name)
    window = _window(name, active_from, active_until)
    if window != (None, None) and (upstreams or parsed is None):
        raise exceptions.ImproperlyDeclared(
            "active_from/active_until limit a job's schedule, and this job has none of its own"
            + (" (its slots are its upstream jobs': give them the window)." if upstreams else ": add schedule=."),
            job=name)
    deadline, longest, shortest = _timing(name, start_deadline, max_runtime, min_runtime)
    if not (isinstance(parameters, tuple) and all(isinstance(item, params.Param) for item in parameters)):
        raise exceptions.ImproperlyDeclared(
            f"parameters must be a tuple of cron_celery.declaring.params.Param (read from the function's signature), "
            f"not {parameters!r}.", job=name)
    return Job(
        parameters=tuple(item for item in parameters if isinstance(item, params.Param)),
        start_deadline=deadline,
        max_runtime=longest,
        min_runtime=shortest,
        active_from=window[0],
        active_until=window[1],
        after=upstreams,
        alert_on_upstream=_alert_on_upstream(name, alert_on_upstream, upstreams),
        jitter=_jitter(name, jitter, parsed),
        max_concurrency=None if concurrency is None else int(concurrency),
        concurrency_group=group,
        notify=_notify(name, notify),
        alert_after=int(alerts_after or 1),
        alert_repeat=None if repeat is None else int(repeat),
        max_retries=int(retries),
        retry_backoff=backoff if backoff is not None else True,
        retry_backoff_max=backoff_max if backoff_max is not None else 600,
        retry_jitter=bool(retry_jitter),
        retry_on=_exception_types(name, retry_on),
        retry_on_failure=bool(retry_on_failure),
        soft_time_limit=soft,
        time_limit=hard,
        schedule=parsed,
        catch_up=_choice(enums.CatchUp, catch_up if catch_up is not None else "latest", name, "catch_up"),
        name=name,
        code=code,
        task_name=task_name,
        pattern=chosen_pattern,
        overlap=chosen_overlap,
        timezone=tz,
        description=description,
    )


def _number(
    job: str, what: str, value: object, *, integer: bool = False, optional: bool = False, positive: bool = False
) -> float | None:
    """A non-negative number option (or None when ``optional``); raises ``ImproperlyDeclared``."""
    if value is None and optional:
        return None
    kinds: tuple[type, ...] = (int,) if integer else (int, float)
    number = float(value) if isinstance(value, kinds) and not isinstance(value, bool) else -1.0  # type: ignore[arg-type]
    if number < 0 or (positive and number == 0):
        kind = "an integer" if integer else "a number of seconds"
        bound = "greater than 0" if positive else "at least 0"
        raise exceptions.ImproperlyDeclared(f"{what} must be {kind} {bound}, not {value!r}.", job=job)
    return number


def _moment(job: str, what: str, value: object) -> dt.datetime | None:
    """An aware datetime option, in UTC; raises ``ImproperlyDeclared`` for anything else."""
    if value is None:
        return None
    if not isinstance(value, dt.datetime) or value.tzinfo is None or value.utcoffset() is None:
        raise exceptions.ImproperlyDeclared(
            f"{what} must be an aware datetime (with a tzinfo, e.g. datetime(2027, 1, 1, "
            f"tzinfo=ZoneInfo('Europe/Amsterdam'))), not {value!r}.", job=job)
    return value.astimezone(dt.UTC)


def _window(job: str, start: object, end: object) -> tuple[dt.datetime | None, dt.datetime | None]:
    """``active_from`` and ``active_until``, checked: aware, and the end after the start."""
    opens, closes = _moment(job, "active_from", start), _moment(job, "active_until", end)
    if opens is not None and closes is not None and closes <= opens:
        raise exceptions.ImproperlyDeclared(
            f"active_until ({closes.isoformat()}) must be later than active_from ({opens.isoformat()}).", job=job)
    return opens, closes


#: The longest timing bound (seconds, about three years): beyond it PostgreSQL's intervals overflow.
LONGEST_BOUND = 1e8


def valid_bound(value: object) -> bool:
    """A timing bound: a finite number of seconds above 0, at most ``LONGEST_BOUND``."""
    return (isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
            and 0 < value <= LONGEST_BOUND)


def _bound(job: str, what: str, value: object) -> float | None:
    if value is None:
        return None
    if not valid_bound(value):
        raise exceptions.ImproperlyDeclared(
            f"{what} must be a number of seconds greater than 0 and at most {LONGEST_BOUND:.0e}, not {value!r}.",
            job=job)
    return float(value)  # type: ignore[arg-type]


def _timing(job: str, start_deadline: object, max_runtime: object,
            min_runtime: object) -> tuple[float | None, float | None, float | None]:
    """``start_deadline`` (``DEFAULT_START_DEADLINE`` when not declared; False: none, whatever the
    default), ``max_runtime`` and ``min_runtime``: seconds, or None; the shortest below the longest."""
    if start_deadline is None:
        configured = conf.settings.DEFAULT_START_DEADLINE  # a bad value is cron_celery.E002
        deadline = float(configured) if valid_bound(configured) else None  # type: ignore[arg-type]
    elif start_deadline is False:
        deadline = None
    else:
        deadline = _bound(job, "start_deadline", start_deadline)
    longest = _bound(job, "max_runtime", max_runtime)
    shortest = _bound(job, "min_runtime", min_runtime)
    if longest is not None and shortest is not None and shortest >= longest:
        raise exceptions.ImproperlyDeclared(
            f"min_runtime ({shortest:g} s) must be shorter than max_runtime ({longest:g} s).", job=job)
    return deadline, longest, shortest


def _alert_on_upstream(job: str, value: object, upstreams: tuple[str, ...]) -> bool:
    if not isinstance(value, bool):
        raise exceptions.ImproperlyDeclared(f"alert_on_upstream must be True or False, not {value!r}.", job=job)
    if value and not upstreams:
        raise exceptions.ImproperlyDeclared(
            "alert_on_upstream is for a job declared with after= (it alerts when an upstream job's failure "
            "skips a slot): add after= or drop alert_on_upstream.", job=job)
    return value


def _after(job: str, value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not items or not all(
            isinstance(item, str) and NAME_RE.match(item) for item in items):
        raise exceptions.ImproperlyDeclared(
            f"after must be a job name or a list of job names (lower-case slugs), not {value!r}.", job=job)
    if job in items:
        raise exceptions.ImproperlyDeclared("a job cannot run after itself (after= names it).", job=job)
    return tuple(dict.fromkeys(items))


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


#: Distinct schedules kept by ``_checked`` (beyond it, a schedule is checked each time and not shared).
_SHARED_UP_TO = 4096
_checked_schedules: dict[tuple[schedules.Schedule, str], schedules.Schedule] = {}


def _checked(schedule: schedules.Schedule) -> schedules.Schedule:
    """``schedule`` once it fires at all (else ``InvalidSchedule``), as one object shared by every job
    declared with an equal schedule (same fields, timezone and label): a hundred thousand jobs on a few
    schedules hold a few schedules, and each distinct one is checked once per process."""
    key = (schedule, getattr(schedule, "label", ""))
    known = _checked_schedules.get(key)
    if known is not None:
        return known
    schedule.next_after(dt.datetime(2000, 1, 1, tzinfo=dt.UTC))  # it must fire at all
    if len(_checked_schedules) >= _SHARED_UP_TO:
        return schedule
    return _checked_schedules.setdefault(key, schedule)


#: Slots sampled to find a declared schedule's shortest interval (what a jitter must stay under).
_GAP_SAMPLE = 48


@functools.lru_cache(maxsize=1024)
def shortest_interval(schedule: schedules.Schedule) -> float:
    """The shortest time between two slots of the schedule, in seconds (an interval's own; a cron
    schedule's sampled over ``_GAP_SAMPLE`` slots from 2001-01-01). Cached per schedule, and asked
    only when a jitter needs it (``_jitter``): it costs some fifty slot computations."""
    if isinstance(schedule, schedules.Interval):
        return float(schedule.seconds)  # epoch-aligned: every gap is the interval
    slot = schedule.next_after(dt.datetime(2001, 1, 1, tzinfo=dt.UTC))
    gaps = []
    for _ in range(_GAP_SAMPLE):
        following = schedule.next_after(slot)
        gaps.append((following - slot).total_seconds())
        slot = following
    return min(gaps)


def _jitter(job: str, value: object, schedule: schedules.Schedule | None) -> float:
    """The declared ``jitter`` (shorter than the schedule's shortest interval), or
    ``DEFAULT_JITTER`` cut to a tenth of that interval; 0 for none. The interval is worked out only
    for a jitter above 0 (every interval is longer than none), so most jobs never pay for it."""
    declared = _number(job, "jitter", value, optional=True)
    if declared is None:
        configured = conf.settings.DEFAULT_JITTER  # a bad value is cron_celery.E002
        valid = isinstance(configured, int | float) and not isinstance(configured, bool) and 0 <= configured < 1e9
        default = float(configured) if valid else 0.0
        return min(default, shortest_interval(schedule) / 10) if schedule is not None and default > 0 else default
    gap = shortest_interval(schedule) if schedule is not None and declared > 0 else None
    if gap is not None and declared >= gap:
        raise exceptions.ImproperlyDeclared(
            f"jitter ({declared:g} s) must be shorter than the schedule's shortest interval ({gap:g} s): "
            "a slot would be sent after the next one is due.", job=job)
    return declared


NOTIFY_KINDS = ("on_failure", "on_recovery", "on_success")


def _notify(job: str, value: object) -> tuple[tuple[str, tuple[str, ...]], ...] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not set(value) <= set(NOTIFY_KINDS) or not all(
        isinstance(names, list | tuple) and all(isinstance(n, str) for n in names) for names in value.values()
    ):
        raise exceptions.ImproperlyDeclared(
            f"notify must be a dict of {', '.join(NOTIFY_KINDS)} to lists of channel names, not {value!r}.", job=job)
    return tuple((kind, tuple(names)) for kind, names in sorted(value.items()))


def _exception_types(job: str, value: object) -> tuple[type[BaseException], ...]:
    if value is None:
        return (Exception,)
    items = value if isinstance(value, list | tuple) else (value,)
    if not all(isinstance(item, type) and issubclass(item, BaseException) for item in items):
        raise exceptions.ImproperlyDeclared(
            f"retry_on must be an exception class or a tuple of them, not {value!r}.", job=job)
    return tuple(items)


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
    """The job with this name (or code); raises ``UnknownJob`` with the known names."""
    autodiscover()
    with _lock:
        job = _by_name.get(name_or_code) or _by_code.get(name_or_code)
        if job is not None:
            return job
        known = ", ".join(sorted(_by_name)) or "(none)"
    raise exceptions.UnknownJob(name=name_or_code, known=known)


def by_task_name(task_name: str) -> Job | None:
    with _lock:
        return _by_task.get(task_name)
