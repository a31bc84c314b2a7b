"""Slot maths: turning dates and strings into timezone-aware slots, and back."""

from __future__ import annotations

import datetime as dt
import zoneinfo

from cron_celery import exceptions

UTC = dt.UTC


def floor_minute(moment: dt.datetime) -> dt.datetime:
    return moment.replace(second=0, microsecond=0)


def slot_for_date(day: dt.date, tz: zoneinfo.ZoneInfo) -> dt.datetime:
    """The slot a run "for a date" stands for: local midnight of that date, in UTC."""
    return dt.datetime.combine(day, dt.time(0), tzinfo=tz).astimezone(UTC)


def execution_date(slot: dt.datetime, tz: zoneinfo.ZoneInfo) -> dt.date:
    """The slot's local date in the job's timezone (the batch world's "odate")."""
    return slot.astimezone(tz).date()


def iso(slot: dt.datetime) -> str:
    """Canonical text of a slot: ISO-8601 in UTC with a ``Z``, whole seconds."""
    return slot.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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
    return moment.astimezone(UTC).replace(microsecond=0)
