"""Schedules: cron expressions and epoch-aligned intervals, with their DST rules, and the builders
that read like the sentence they mean (``daily(at(6).am())``, ``every(minutes=15)``). Slot maths is in
``cron_celery.slots``, the catch-up after downtime in ``cron_celery.catch_up``."""

from __future__ import annotations

import bisect
import dataclasses
import datetime as dt
import functools
import re
import zoneinfo

from cron_celery import exceptions, slots

UTC = dt.UTC


# --- schedules: cron expressions and epoch-aligned intervals --------------------------------

_FIELDS = (  # name, Celery parser bounds (max_, min_)
    ("minute", 60, 0),
    ("hour", 24, 0),
    ("day_of_month", 31, 1),
    ("month_of_year", 12, 1),
    ("day_of_week", 7, 0),
)
_DAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
#: A day's full English name, as ``weekly`` also takes it.
_FULL_DAY_NAMES = {full: full[:3] for full in
                   ("sunday", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday")}
_SEARCH_DAYS = 366 * 8 + 2  # a cron that matches at all matches within 8 years (Feb 29)


@functools.lru_cache(maxsize=1024)
def _field_values(max_: int, min_: int, text: str) -> tuple[frozenset[int], tuple[int, ...]]:
    """One cron field's values (Celery's parser), as a set and in order. Cached: the many jobs
    (and the copies ``in_timezone`` makes) that spell a field alike share one parse and one set."""
    from celery.schedules import crontab_parser

    values = crontab_parser(max_, min_).parse(text)
    return frozenset(values), tuple(sorted(values))


@dataclasses.dataclass(frozen=True)
class Cron:
    """A five-field cron schedule read in an IANA timezone (Celery's crontab semantics:
    day of month AND day of week must both match; 0 or 'sun' is Sunday).

    DST: a local time that does not exist (spring forward) fires once, at the first valid
    instant after it; a local time that occurs twice (fall back) fires once, the first time.
    """

    minute: str = "*"
    hour: str = "*"
    day_of_month: str = "*"
    month_of_year: str = "*"
    day_of_week: str = "*"
    timezone: str | None = None
    label: str = dataclasses.field(default="", compare=False)

    def __post_init__(self) -> None:
        for name, max_, min_ in _FIELDS:
            text = str(getattr(self, name)).strip().lower()
            object.__setattr__(self, name, text)
            try:
                values, ordered = _field_values(max_, min_, text)
            except (ValueError, KeyError, IndexError) as exc:
                raise exceptions.InvalidSchedule(f"{name} {text!r}: {exc}", value=self.expression) from exc
            if not values:
                raise exceptions.InvalidSchedule(f"{name} {text!r} matches nothing", value=self.expression)
            object.__setattr__(self, f"_{name}", values)
            if name == "minute":
                object.__setattr__(self, "_minutes", ordered)
            elif name == "hour":
                object.__setattr__(self, "_hours", ordered)
        if self.timezone is not None:
            _zone(self.timezone)

    @property
    def expression(self) -> str:
        """The canonical five-field cron string (what is stored and shown)."""
        return " ".join(str(getattr(self, name)) for name, _, _ in _FIELDS)

    @property
    def tz(self) -> zoneinfo.ZoneInfo:
        return _zone(self.timezone or "UTC")

    def in_timezone(self, timezone: str) -> Cron:
        return self if self.timezone else dataclasses.replace(self, timezone=timezone)

    def _date_matches(self, day: dt.date) -> bool:
        return (
            day.day in self._day_of_month  # type: ignore[attr-defined]
            and day.month in self._month_of_year  # type: ignore[attr-defined]
            and (day.weekday() + 1) % 7 in self._day_of_week  # type: ignore[attr-defined]
        )

    def next_after(self, moment: dt.datetime) -> dt.datetime:
        """The first slot strictly after ``moment`` (aware), in UTC; ``InvalidSchedule`` when there is
        none (it never fires, or not before the calendar ends)."""
        try:
            return self._next_after(moment)
        except slots.CALENDAR_ERRORS:
            raise exceptions.InvalidSchedule(f"no slot after {moment.isoformat()} before the calendar ends",
                                             value=self.expression) from None

    def _next_after(self, moment: dt.datetime) -> dt.datetime:
        tz = self.tz
        moment = moment.astimezone(UTC)
        wall = moment.astimezone(tz).replace(tzinfo=None)
        earlier = moment - dt.timedelta(hours=3)
        if earlier.astimezone(tz).utcoffset() == moment.astimezone(tz).utcoffset():
            # No clock change in the last three hours: a wall time not after ``wall`` is
            # not after ``moment``.
            floor, strict = wall, True
        else:  # around a change, wall times up to three hours back may still be later
            floor, strict = wall - dt.timedelta(hours=3), False
        hours = self._hours  # type: ignore[attr-defined]
        minutes = self._minutes  # type: ignore[attr-defined]
        first_day = floor.date()
        for offset in range(_SEARCH_DAYS):
            day = first_day + dt.timedelta(days=offset)
            if not self._date_matches(day):
                continue
            start_hour = bisect.bisect_left(hours, floor.hour) if offset == 0 else 0
            for hour in hours[start_hour:]:
                for minute in minutes:
                    local = dt.datetime.combine(day, dt.time(hour, minute))
                    if local < floor or (strict and local == floor):
                        continue
                    instant = slots.resolve_local(day, hour, minute, tz)
                    if instant > moment:
                        return instant
        raise exceptions.InvalidSchedule("it never fires", value=self.expression)

    def __str__(self) -> str:
        zone = self.timezone or "UTC"
        if self.label:
            return f"{self.label} ({zone})"
        try:
            from cron_descriptor import get_description  # type: ignore[import-untyped]

            text = str(get_description(self.expression))
        except Exception:  # any failure to describe falls back to the expression
            text = f"cron {self.expression}"
        return f"{text} ({zone})"


@dataclasses.dataclass(frozen=True)
class Interval:
    """Every ``seconds`` seconds, aligned to the Unix epoch so that every beat agrees."""

    seconds: int
    timezone: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.seconds, int) or isinstance(self.seconds, bool) or self.seconds < 1:
            raise exceptions.InvalidSchedule("an interval is a whole number of seconds >= 1", value=self.seconds)

    @property
    def expression(self) -> str:
        return f"every {self.seconds}s"

    def in_timezone(self, timezone: str) -> Interval:
        return self if self.timezone else dataclasses.replace(self, timezone=timezone)

    def next_after(self, moment: dt.datetime) -> dt.datetime:
        try:
            epoch = int(moment.astimezone(UTC).timestamp())
            return dt.datetime.fromtimestamp((epoch // self.seconds + 1) * self.seconds, tz=UTC)
        except slots.CALENDAR_ERRORS:
            raise exceptions.InvalidSchedule(f"no slot after {moment.isoformat()} before the calendar ends",
                                             value=self.expression) from None

    def __str__(self) -> str:
        for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
            if self.seconds % size == 0:
                count = self.seconds // size
                return f"every {unit}" if count == 1 else f"every {count} {unit}s"
        return "every second" if self.seconds == 1 else f"every {self.seconds} seconds"


Schedule = Cron | Interval


def slots_between(
    schedule: Schedule, after: dt.datetime, until: dt.datetime, limit: int = 100_000
) -> list[dt.datetime]:
    """Slots in ``(after, until]``, at most ``limit`` of them (the earliest)."""
    found: list[dt.datetime] = []
    moment = after
    while len(found) < limit:
        moment = schedule.next_after(moment)
        if moment > until:
            break
        found.append(moment)
    return found


def _zone(name: str) -> zoneinfo.ZoneInfo:
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
        raise exceptions.InvalidSchedule("unknown timezone (use an IANA name such as 'Europe/Amsterdam')",
                                         value=name) from exc


# --- builders that read like the sentence they mean ----------------------------------------


@dataclasses.dataclass(frozen=True)
class Time:
    """A time of day on the 24-hour clock; build it with ``at24(15)`` or ``at(3).pm()``."""

    hour: int
    minute: int = 0

    def __post_init__(self) -> None:
        if not (0 <= self.hour <= 23 and 0 <= self.minute <= 59):
            raise ValueError(f"no such time of day: {self.hour:02d}:{self.minute:02d}")

    def __str__(self) -> str:
        half = "AM" if self.hour < 12 else "PM"
        return f"{(self.hour % 12) or 12}:{self.minute:02d} {half}"


@dataclasses.dataclass(frozen=True)
class TwelveHourClock:
    """``at(3)``: not a time yet — say ``.am()`` or ``.pm()``."""

    hour: int
    minute: int = 0

    def __post_init__(self) -> None:
        if not (1 <= self.hour <= 12 and 0 <= self.minute <= 59):
            raise ValueError(f"at() takes a twelve-hour time (1-12), not {self.hour}:{self.minute:02d}; "
                             "use at24() for the 24-hour clock")

    def am(self) -> Time:
        return Time(self.hour % 12, self.minute)

    def pm(self) -> Time:
        return Time(self.hour % 12 + 12, self.minute)


def at(hour: int, minute: int = 0) -> TwelveHourClock:
    """A time on the twelve-hour clock, to finish with ``.am()`` or ``.pm()``.

    ``at(3)`` is not a time of day yet: ``.am()`` or ``.pm()`` turns it into the ``Time`` that
    ``daily``, ``weekly`` and ``monthly`` take (``at(12).am()`` is midnight, ``at(12).pm()`` noon).
    Passing ``at(3)`` itself to a builder raises ``TypeError``. For the 24-hour clock use ``at24``.

    ```python
    daily(at(6, 30).am())  # every day at 06:30
    ```

    :param hour: The hour, 1 to 12.
    :param minute: The minute, 0 to 59.
    :returns: A twelve-hour time whose ``.am()`` and ``.pm()`` return a ``Time``.
    :raises ValueError: ``hour`` is not 1-12 or ``minute`` not 0-59.
    """
    return TwelveHourClock(hour, minute)


def at24(hour: int, minute: int = 0) -> Time:
    """A time of day on the 24-hour clock, for ``daily``, ``weekly`` and ``monthly``.

    ```python
    daily(at24(15))  # every day at 15:00
    ```

    :param hour: The hour, 0 to 23.
    :param minute: The minute, 0 to 59.
    :returns: The time of day.
    :raises ValueError: ``hour`` is not 0-23 or ``minute`` not 0-59.
    """
    return Time(hour, minute)


def _time(value: object, builder: str) -> Time:
    if isinstance(value, TwelveHourClock):
        raise TypeError(f"{builder}(at({value.hour})) is ambiguous: say at({value.hour}).am() or "
                        f"at({value.hour}).pm(), or use at24()")
    if not isinstance(value, Time):
        raise TypeError(f"{builder}() needs a time such as at(3).pm() or at24(15), not {value!r}")
    return value


def daily(at: Time, *, timezone: str | None = None) -> Cron:
    """A schedule that fires once a day at a time of day: the cron ``"M H * * *"``.

    The time is read on the wall clock of ``timezone``, by the DST rules of ``Cron`` (a time
    skipped by the clocks fires at the first instant after it, a repeated one fires once).

    ```python
    daily(at(6).am(), timezone="Europe/Amsterdam")  # "0 6 * * *", daily at 6:00 AM
    ```

    :param at: The time of day: ``at(6).am()``, ``at(3).pm()`` or ``at24(15)``.
    :param timezone: An IANA timezone name; ``None``: the timezone of the job it is declared
        on (UTC when the schedule is used on its own).
    :returns: The cron schedule, labelled "daily at 6:00 AM".
    :raises TypeError: ``at`` is not a ``Time``, e.g. ``at(6)`` without ``.am()`` or ``.pm()``.
    :raises cron_celery.exceptions.InvalidSchedule: ``timezone`` is not a known IANA name.
    """
    time_ = _time(at, "daily")
    return Cron(str(time_.minute), str(time_.hour), timezone=timezone, label=f"daily at {time_}")


def weekly(on: str, at: Time, *, timezone: str | None = None) -> Cron:
    """A schedule that fires on some days of the week at a time of day: the cron ``"M H * * D"``.

    ```python
    weekly("mon,thu", at(9).am())  # "0 9 * * mon,thu", weekly on Mon, Thu at 9:00 AM
    ```

    :param on: Day names separated by commas (``"mon"``, ``"mon,thu"``), each its three letters
        or its full English name (``"Monday"``); case does not matter. For ranges such as Monday
        to Friday use ``cron("0 9 * * mon-fri")``.
    :param at: The time of day: ``at(9).am()`` or ``at24(9)``.
    :param timezone: An IANA timezone name; ``None``: the timezone of the job it is declared
        on (UTC when the schedule is used on its own).
    :returns: The cron schedule, labelled "weekly on Mon, Thu at 9:00 AM".
    :raises TypeError: ``at`` is not a ``Time``, e.g. ``at(9)`` without ``.am()`` or ``.pm()``.
    :raises ValueError: a part of ``on`` is not a day name (``"mon-fri"`` and ``"thur"`` are
        refused, not read as Monday and Thursday).
    :raises cron_celery.exceptions.InvalidSchedule: ``timezone`` is not a known IANA name.
    """
    time_ = _time(at, "weekly")
    days = [_FULL_DAY_NAMES.get(part.strip().lower(), part.strip().lower()) for part in on.split(",")]
    wrong = [part.strip() for part, day in zip(on.split(","), days, strict=True) if day not in _DAY_NAMES]
    if wrong:
        raise ValueError(f"weekly(on=...) takes day names such as 'mon', 'monday' or 'mon,thu', not {on!r} "
                         f"({', '.join(map(repr, wrong))}); for a range of days use cron(), "
                         "e.g. cron('0 9 * * mon-fri')")
    names = ", ".join(day.capitalize() for day in days)
    return Cron(str(time_.minute), str(time_.hour), day_of_week=",".join(days), timezone=timezone,
                label=f"weekly on {names} at {time_}")


def monthly(day: int, at: Time, *, timezone: str | None = None) -> Cron:
    """A schedule that fires on one day of every month at a time of day: the cron ``"M H D * *"``.

    A month without that day is skipped, not moved to its last day: ``monthly(31, ...)`` fires
    only in the seven months that have a 31st, and ``monthly(29, ...)`` skips February except
    in leap years.

    ```python
    monthly(1, at24(6, 30))  # "30 6 1 * *", monthly on day 1 at 6:30 AM
    ```

    :param day: The day of the month, 1 to 31.
    :param at: The time of day: ``at(6, 30).am()`` or ``at24(6, 30)``.
    :param timezone: An IANA timezone name; ``None``: the timezone of the job it is declared
        on (UTC when the schedule is used on its own).
    :returns: The cron schedule, labelled "monthly on day 1 at 6:30 AM".
    :raises TypeError: ``at`` is not a ``Time``, e.g. ``at(6)`` without ``.am()`` or ``.pm()``.
    :raises ValueError: ``day`` is not 1-31.
    :raises cron_celery.exceptions.InvalidSchedule: ``timezone`` is not a known IANA name.
    """
    time_ = _time(at, "monthly")
    if not 1 <= day <= 31:
        raise ValueError(f"monthly(day=...) takes 1-31, not {day}")
    return Cron(str(time_.minute), str(time_.hour), str(day), timezone=timezone,
                label=f"monthly on day {day} at {time_}")


def every(*, seconds: int = 0, minutes: int = 0, hours: int = 0, days: int = 0) -> Interval:
    """A schedule that fires at a fixed interval: the sum of the arguments.

    Its slots are the multiples of the interval since the Unix epoch, so every beat on any
    server computes the same ones, and it ignores time zones and DST: ``every(days=1)`` fires
    at 00:00 UTC and ``every(hours=1)`` at the start of each UTC hour. For a time of day in a
    timezone use ``daily``.

    ```python
    every(minutes=15)  # "every 900s": at :00, :15, :30 and :45
    ```

    :param seconds: Seconds to add to the interval.
    :param minutes: Minutes to add to the interval.
    :param hours: Hours to add to the interval.
    :param days: Days (of 86,400 seconds) to add to the interval.
    :returns: The interval schedule.
    :raises cron_celery.exceptions.InvalidSchedule: the total is not a whole number of seconds
        of at least one (``every()``, ``every(hours=1.5)``: say ``every(minutes=90)``).
    """
    total = seconds + 60 * minutes + 3600 * hours + 86400 * days
    return Interval(total)


def cron(expression: str, *, timezone: str | None = None) -> Cron:
    """A schedule from a five-field cron string: minute, hour, day of month, month, day of week.

    The fields are read by Celery's ``crontab`` parser, as django-celery-beat reads them: day
    of month and day of week must both match, and ``0`` or ``sun`` is Sunday. Times are read on
    the wall clock of ``timezone``, by the DST rules of ``Cron``.

    ```python
    cron("*/15 9-17 * * mon-fri")  # every 15 minutes from 9:00 to 17:45, Monday to Friday
    ```

    :param expression: Five fields separated by spaces, e.g. ``"0 15 * * *"``.
    :param timezone: An IANA timezone name; ``None``: the timezone of the job it is declared
        on (UTC when the schedule is used on its own).
    :returns: The cron schedule; its ``expression`` is the canonical, lower-case form.
    :raises cron_celery.exceptions.InvalidSchedule: the expression has not five fields, a field
        does not parse or matches nothing, or ``timezone`` is not a known IANA name.
    """
    parts = expression.split()
    if len(parts) != 5:
        raise exceptions.InvalidSchedule("a cron expression has five fields: minute hour day month weekday",
                                         value=expression)
    minute, hour, day_of_month, month_of_year, day_of_week = parts
    return Cron(minute, hour, day_of_month, month_of_year, day_of_week, timezone=timezone)


def parse_expression(expression: str, timezone: str | None = None) -> Schedule:
    """The inverse of ``schedule.expression``: ``"0 15 * * *"`` or ``"every 900s"``."""
    match = re.fullmatch(r"every (\d+)s", expression.strip())
    if match:
        return Interval(int(match.group(1)), timezone)
    return cron(expression, timezone=timezone)


def from_celery(value: object, timezone: str | None = None) -> Schedule:
    """Accept our schedules, Celery's ``crontab(...)`` and ``timedelta`` intervals."""
    from celery.schedules import crontab, schedule

    if isinstance(value, Cron | Interval):
        return value
    if isinstance(value, crontab):
        minute, hour, day_of_month, month_of_year, day_of_week = (
            str(getattr(value, f"_orig_{name}")) for name, _, _ in _FIELDS)
        return Cron(minute, hour, day_of_month, month_of_year, day_of_week, timezone=timezone)
    if isinstance(value, dt.timedelta):
        return Interval(int(value.total_seconds()), timezone)
    if isinstance(value, schedule):
        return Interval(int(getattr(value, "run_every").total_seconds()), timezone)  # noqa: B009
    if isinstance(value, str):
        return cron(value, timezone=timezone)
    raise exceptions.InvalidSchedule("expected crontab(...), a cron string, every(...) or a timedelta",
                                     value=repr(value))
