"""Slot maths: turning dates and strings into timezone-aware slots, and back: a slot's execution date,
its ISO text and run key, the slot a person means by a date or a time, and the ends of the calendar."""

from __future__ import annotations

import datetime as dt
import zoneinfo

from cron_celery import exceptions

UTC = dt.UTC
#: Said of a time that Python's datetimes cannot hold, in UTC or in the job's timezone.
OUTSIDE = "outside the calendar (years 1 to 9999, in UTC and in the job's timezone)"
#: What date arithmetic past year 1 or 9999 raises (``date value out of range``, ``year 10000 is out of range``).
CALENDAR_ERRORS = (OverflowError, ValueError)


def floor_minute(moment: dt.datetime) -> dt.datetime:
    return moment.replace(second=0, microsecond=0)


def slot_for_date(day: dt.date, tz: zoneinfo.ZoneInfo) -> dt.datetime:
    """The slot a run "for a date" stands for: local midnight of that date, in UTC."""
    try:
        return dt.datetime.combine(day, dt.time(0), tzinfo=tz).astimezone(UTC)
    except CALENDAR_ERRORS:
        raise exceptions.InvalidSlot(f"its midnight in {tz} is {OUTSIDE}.", value=str(day)) from None


def execution_date(slot: dt.datetime, tz: zoneinfo.ZoneInfo) -> dt.date:
    """The slot's local date in the job's timezone (the batch world's "odate")."""
    return slot.astimezone(tz).date()


def iso(slot: dt.datetime) -> str:
    """Canonical text of a slot: ISO-8601 in UTC with a ``Z``, whole seconds."""
    # What strftime("%Y-%m-%dT%H:%M:%SZ") writes (the year unpadded, as glibc's %Y), a tenth the cost:
    # every run formats its slot (its log context and key).
    u = slot.astimezone(UTC)
    return f"{u.year}-{u.month:02d}-{u.day:02d}T{u.hour:02d}:{u.minute:02d}:{u.second:02d}Z"


def run_key(code: str, slot: dt.datetime) -> str:
    """The idempotency key handed to the job: ``"{code}:{slot ISO-8601 UTC}"``."""
    return f"{code}:{iso(slot)}"


def parse_date(value: str) -> dt.date:
    try:
        return dt.date.fromisoformat(value.strip())
    except (ValueError, AttributeError) as exc:
        raise exceptions.InvalidSlot("expected a date such as 2026-11-29.", value=value) from exc


def parse_slot(value: object, tz: zoneinfo.ZoneInfo) -> dt.datetime:
    """A slot from a datetime, a date (local midnight) or an ISO-8601 string.

    Naive times are read in the job's timezone; the result is aware, in UTC, with
    microseconds dropped (slots are whole seconds).
    """
    moment: dt.datetime
    if isinstance(value, dt.datetime):
        moment = value
    elif isinstance(value, dt.date):
        return slot_for_date(value, tz)
    elif isinstance(value, str):
        text = value.strip()
        if "\x00" in text or not text.isascii():  # a time is ASCII: fromisoformat would skip a NUL
            raise exceptions.InvalidSlot("expected an ISO-8601 time such as 2026-11-29T01:00, in ASCII.",
                                         value=ascii(value)[1:-1])
        if len(text) == 10:
            return slot_for_date(parse_date(text), tz)
        try:
            moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError as exc:
            raise exceptions.InvalidSlot(
                "expected an ISO-8601 time such as 2026-11-29T01:00 or 2026-11-29T01:00Z.",
                value=value,
            ) from exc
    else:
        raise exceptions.InvalidSlot("expected a datetime, a date or a string.", value=value)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=tz)
    try:
        slot = moment.astimezone(UTC).replace(microsecond=0)
        slot.astimezone(tz)  # its execution date, in the job's timezone, must exist too
    except CALENDAR_ERRORS:
        raise exceptions.InvalidSlot(f"the time is {OUTSIDE}.", value=str(value)) from None
    return slot


def resolve_local(day: dt.date, hour: int, minute: int, tz: zoneinfo.ZoneInfo) -> dt.datetime:
    """The UTC instant of a local wall-clock time, by the DST rules of ``schedules.Cron``: a time
    that does not exist (the spring gap) is the next one that does; a time that exists twice is the first."""
    naive = dt.datetime.combine(day, dt.time(hour, minute))
    for step in range(24 * 60):
        candidate = naive + dt.timedelta(minutes=step)
        instant = candidate.replace(tzinfo=tz, fold=0).astimezone(UTC)
        if instant.astimezone(tz).replace(tzinfo=None) == candidate:
            return instant  # exists; fold=0 is the first of two occurrences
    raise exceptions.InvalidSchedule(f"no valid local time after {naive} in {tz.key}", value=str(naive))
