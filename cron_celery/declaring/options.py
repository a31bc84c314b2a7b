"""Each option of a job's declaration checked and made into its ``Job`` field: the name, code and
timezone, the schedule (checked once and shared), the retry policy, the limits, ``after=`` and the
window, the timing bounds, jitter, channels and the exceptions that retry. A bad value raises
``ImproperlyDeclared`` saying what to write instead."""

from __future__ import annotations

import datetime as dt
import functools
import math
import re
import zoneinfo
from typing import TypeVar

from cron_celery import catch_up, conf, enums, exceptions, schedules

#: A job's name: a lower-case slug; a code: letters, digits, '.', '-' or '_'.
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,99}$")
CODE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,49}$")

E = TypeVar("E", enums.ExecutionPattern, enums.Overlap, enums.CatchUp)


def read_choice(enum: type[E], value: object, job: str, what: str) -> E:
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


def read_identity(name: object, code: object, timezone: str | None) -> str:
    """The name and code checked; the job's timezone (its own, else the settings', else Django's)."""
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
    tz = timezone or conf.default_timezone()
    try:
        zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
        raise exceptions.ImproperlyDeclared(
            f"unknown timezone {tz!r} (use an IANA name such as 'Europe/Amsterdam').", job=name
        ) from exc
    return tz


def read_schedule(name: str, schedule: object, tz: str) -> schedules.Schedule | None:
    if schedule is None:
        return None
    try:
        return read_checked(schedules.from_celery(schedule).in_timezone(tz))
    except (exceptions.InvalidSchedule, ValueError) as exc:
        raise exceptions.ImproperlyDeclared(f"its schedule is invalid: {exc}", job=name) from exc


def read_retry_policy(name: str, max_retries: object, retry_backoff: object, retry_backoff_max: object,
                  soft_time_limit: object, time_limit: object
                  ) -> tuple[float, float | bool | None, float | None, float | None, float | None]:
    """(max retries, backoff, longest backoff, soft time limit, time limit), the settings' defaults
    filled in; a soft limit must come before the hard one."""
    settings = conf.settings
    retries = read_number(name, "max_retries", settings.DEFAULT_MAX_RETRIES if max_retries is None else max_retries,
                      integer=True)
    assert retries is not None
    backoff = retry_backoff if isinstance(retry_backoff, bool) else read_number(name, "retry_backoff", retry_backoff)
    backoff_max = read_number(name, "retry_backoff_max", retry_backoff_max)
    soft = read_number(name, "soft_time_limit",
                   settings.DEFAULT_SOFT_TIME_LIMIT if soft_time_limit is None else soft_time_limit,
                   optional=True, positive=True)
    hard = read_number(name, "time_limit", settings.DEFAULT_TIME_LIMIT if time_limit is None else time_limit,
                   optional=True, positive=True)
    if soft is not None and hard is not None and soft >= hard:
        raise exceptions.ImproperlyDeclared(
            f"soft_time_limit ({soft:g} s) must be shorter than time_limit ({hard:g} s), so the job "
            "can stop cleanly before it is killed.", job=name)
    return retries, backoff, backoff_max, soft, hard


def read_limits(name: str, max_concurrency: object, concurrency_group: object, pattern: enums.ExecutionPattern,
            overlap: enums.Overlap) -> tuple[float | None, str | None]:
    """(max_concurrency, concurrency_group): a limit only for jobs that may run beside themselves."""
    concurrency = read_number(name, "max_concurrency", max_concurrency, integer=True, optional=True, positive=True)
    if concurrency is not None and (overlap != enums.Overlap.ALLOW or pattern == enums.ExecutionPattern.RATE_LIMITED):
        one = f"overlap={overlap.value!r}" if overlap != enums.Overlap.ALLOW else "the rate_limited pattern"
        raise exceptions.ImproperlyDeclared(
            f"max_concurrency is for jobs declared with overlap='allow': {one} already runs one at a time.",
            job=name)
    if concurrency_group is not None and not (isinstance(concurrency_group, str) and NAME_RE.match(concurrency_group)):
        raise exceptions.ImproperlyDeclared(
            "concurrency_group must name a group of CRON_CELERY['CONCURRENCY_GROUPS'] (a lower-case slug), "
            f"not {concurrency_group!r}.", job=name)
    return concurrency, concurrency_group if isinstance(concurrency_group, str) else None


def read_after_and_window(name: str, after: object, parsed: schedules.Schedule | None, active_from: object,
                      active_until: object) -> tuple[tuple[str, ...], tuple[dt.datetime | None, dt.datetime | None]]:
    """The upstream jobs (``after=``: then no schedule of its own) and the active window (only on a
    schedule of its own)."""
    upstreams = read_after(name, after)
    if upstreams and parsed is not None:
        raise exceptions.ImproperlyDeclared(
            "a job declared with after= has no schedule of its own (its slots are its upstream jobs'): "
            "drop schedule= or after=.", job=name)
    window = read_window(name, active_from, active_until)
    if window != (None, None) and (upstreams or parsed is None):
        raise exceptions.ImproperlyDeclared(
            "active_from/active_until limit a job's schedule, and this job has none of its own"
            + (" (its slots are its upstream jobs': give them the window)." if upstreams else ": add schedule=."),
            job=name)
    return upstreams, window


def read_number(
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


def read_moment(job: str, what: str, value: object) -> dt.datetime | None:
    """An aware datetime option, in UTC; raises ``ImproperlyDeclared`` for anything else."""
    if value is None:
        return None
    if not isinstance(value, dt.datetime) or value.tzinfo is None or value.utcoffset() is None:
        raise exceptions.ImproperlyDeclared(
            f"{what} must be an aware datetime (with a tzinfo, e.g. datetime(2027, 1, 1, "
            f"tzinfo=ZoneInfo('Europe/Amsterdam'))), not {value!r}.", job=job)
    return value.astimezone(dt.UTC)


def read_window(job: str, start: object, end: object) -> tuple[dt.datetime | None, dt.datetime | None]:
    """``active_from`` and ``active_until``, checked: aware, and the end after the start."""
    opens, closes = read_moment(job, "active_from", start), read_moment(job, "active_until", end)
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


def read_bound(job: str, what: str, value: object) -> float | None:
    if value is None:
        return None
    if not valid_bound(value):
        raise exceptions.ImproperlyDeclared(
            f"{what} must be a number of seconds greater than 0 and at most {LONGEST_BOUND:.0e}, not {value!r}.",
            job=job)
    return float(value)  # type: ignore[arg-type]


def read_timing(job: str, start_deadline: object, max_runtime: object,
            min_runtime: object) -> tuple[float | None, float | None, float | None]:
    """``start_deadline`` (``DEFAULT_START_DEADLINE`` when not declared; False: none, whatever the
    default), ``max_runtime`` and ``min_runtime``: seconds, or None; the shortest below the longest."""
    if start_deadline is None:
        configured = conf.settings.DEFAULT_START_DEADLINE  # a bad value is cron_celery.E002
        deadline = float(configured) if valid_bound(configured) else None  # type: ignore[arg-type]
    elif start_deadline is False:
        deadline = None
    else:
        deadline = read_bound(job, "start_deadline", start_deadline)
    longest = read_bound(job, "max_runtime", max_runtime)
    shortest = read_bound(job, "min_runtime", min_runtime)
    if longest is not None and shortest is not None and shortest >= longest:
        raise exceptions.ImproperlyDeclared(
            f"min_runtime ({shortest:g} s) must be shorter than max_runtime ({longest:g} s).", job=job)
    return deadline, longest, shortest


def read_catch_up_window(job: str, value: object, policy: enums.CatchUp,
                         schedule: schedules.Schedule | None) -> float | None:
    """``catch_up_window``: a ``timedelta`` or seconds, or None. Only for a job with a schedule of its own
    whose overdue slots may run late (``latest``, ``all``), and no shorter than the lateness within
    which the schedule's slots count as on time."""
    if value is None:
        return None
    raw = value.total_seconds() if isinstance(value, dt.timedelta) else value
    if not valid_bound(raw):
        raise exceptions.ImproperlyDeclared(
            f"catch_up_window must be a timedelta or a number of seconds greater than 0 and at most "
            f"{LONGEST_BOUND:.0e} s, not {value!r}.", job=job)
    if schedule is None:
        raise exceptions.ImproperlyDeclared(
            "catch_up_window is for a job with a schedule of its own (a job run after= its upstreams, or "
            "only on demand, has no overdue slots of its own).", job=job)
    if policy == enums.CatchUp.NONE:
        raise exceptions.ImproperlyDeclared(
            "catch_up_window has no effect with catch_up='none' (no overdue slot runs late): use 'latest' or "
            "'all', or drop the window.", job=job)
    seconds = float(raw)  # type: ignore[arg-type]
    shortest = catch_up.shortest_window(schedule).total_seconds()
    if seconds < shortest:
        raise exceptions.ImproperlyDeclared(
            f"catch_up_window ({seconds:g} s) must be at least {shortest:g} s: this schedule's slots count as "
            "on time when sent that late, and a shorter window would record them MISSED.", job=job)
    return seconds


def read_alert_on_upstream(job: str, value: object, upstreams: tuple[str, ...]) -> bool:
    if not isinstance(value, bool):
        raise exceptions.ImproperlyDeclared(f"alert_on_upstream must be True or False, not {value!r}.", job=job)
    if value and not upstreams:
        raise exceptions.ImproperlyDeclared(
            "alert_on_upstream is for a job declared with after= (it alerts when an upstream job's failure "
            "skips a slot): add after= or drop alert_on_upstream.", job=job)
    return value


def read_after(job: str, value: object) -> tuple[str, ...]:
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


#: Distinct schedules kept by ``checked`` (beyond it, a schedule is checked each time and not shared).
_SHARED_UP_TO = 4096
_checked_schedules: dict[tuple[schedules.Schedule, str], schedules.Schedule] = {}


def read_checked(schedule: schedules.Schedule) -> schedules.Schedule:
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
    only when a jitter needs it (``jitter``): it costs some fifty slot computations."""
    if isinstance(schedule, schedules.Interval):
        return float(schedule.seconds)  # epoch-aligned: every gap is the interval
    slot = schedule.next_after(dt.datetime(2001, 1, 1, tzinfo=dt.UTC))
    gaps = []
    for _ in range(_GAP_SAMPLE):
        following = schedule.next_after(slot)
        gaps.append((following - slot).total_seconds())
        slot = following
    return min(gaps)


def read_jitter(job: str, value: object, schedule: schedules.Schedule | None) -> float:
    """The declared ``jitter`` (shorter than the schedule's shortest interval), or
    ``DEFAULT_JITTER`` cut to a tenth of that interval; 0 for none. The interval is worked out only
    for a jitter above 0 (every interval is longer than none), so most jobs never pay for it."""
    declared = read_number(job, "jitter", value, optional=True)
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


def read_notify(job: str, value: object) -> tuple[tuple[str, tuple[str, ...]], ...] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not set(value) <= set(NOTIFY_KINDS) or not all(
        isinstance(names, list | tuple) and all(isinstance(n, str) for n in names) for names in value.values()
    ):
        raise exceptions.ImproperlyDeclared(
            f"notify must be a dict of {', '.join(NOTIFY_KINDS)} to lists of channel names, not {value!r}.", job=job)
    return tuple((kind, tuple(names)) for kind, names in sorted(value.items()))


def read_exception_types(job: str, value: object) -> tuple[type[BaseException], ...]:
    if value is None:
        return (Exception,)
    items = value if isinstance(value, list | tuple) else (value,)
    if not all(isinstance(item, type) and issubclass(item, BaseException) for item in items):
        raise exceptions.ImproperlyDeclared(
            f"retry_on must be an exception class or a tuple of them, not {value!r}.", job=job)
    return tuple(items)
