"""The schedules of ``bench/latency.py``'s jobs, as plain arithmetic on epoch seconds (UTC).

Shared by the script (which counts the slots it expects) and by ``bench/latency_jobs.py``
(which declares the jobs in the beats and workers): no Django, no Celery.

Two mixes:

  ``minute``  every job runs every minute;
  ``mix``     of every ten jobs, seven run every minute, one every 10 s, one hourly at :00 and
              one daily at 00:00 UTC (those two have a slot in a run only if it spans the hour
              or midnight).
"""

from __future__ import annotations

import math
from collections import Counter

MINUTE = "minute"
EVERY_10S = "10s"
HOURLY = "hourly"
DAILY = "daily"
KINDS = (MINUTE, EVERY_10S, HOURLY, DAILY)
MIXES = ("minute", "mix")

#: Seconds between two slots of each kind: every slot is a multiple of it since the epoch
#: (cron_celery's ``every(seconds=10)`` is aligned to the epoch; the crontabs are UTC).
PERIOD = {MINUTE: 60, EVERY_10S: 10, HOURLY: 3600, DAILY: 86_400}
#: The crontab of each cron kind (both schedulers); the 10 s kind is an interval.
CRON = {MINUTE: "* * * * *", HOURLY: "0 * * * *", DAILY: "0 0 * * *"}
#: In the mix, job ``i`` has the kind ``_MIX[i % 10]``.
_MIX = (MINUTE,) * 7 + (EVERY_10S, HOURLY, DAILY)


def kind_of(index: int, mix: str) -> str:
    """The schedule kind of job ``index`` in ``mix``."""
    if mix == "minute":
        return MINUTE
    if mix == "mix":
        return _MIX[index % len(_MIX)]
    raise ValueError(f"unknown mix {mix!r}: choose from {', '.join(MIXES)}")


def kinds(n: int, mix: str) -> Counter[str]:
    """How many of ``n`` jobs have each kind."""
    return Counter(kind_of(i, mix) for i in range(n))


def job_name(index: int, kind: str) -> str:
    """The job's (and the periodic task's) name; its kind can be read back (``kind_from_name``)."""
    return f"latency-{kind}-{index:05d}"


def kind_from_name(name: str) -> str | None:
    parts = name.split("-")
    return parts[1] if len(parts) == 3 and parts[0] == "latency" and parts[1] in KINDS else None


def slots_between(kind: str, start: float, end: float) -> list[float]:
    """The slots of one job of ``kind`` in ``[start, end)``."""
    period = PERIOD[kind]
    first = math.ceil(start / period) * period
    return [float(moment) for moment in range(int(first), math.ceil(end), period) if moment < end]


def next_slot(kind: str, after: float) -> float:
    """The first slot of ``kind`` strictly after ``after``."""
    period = PERIOD[kind]
    return float((math.floor(after / period) + 1) * period)


def expected_per_minute(n: int, mix: str, start: float, minutes: int) -> dict[float, int]:
    """Slots all ``n`` jobs have in each minute of ``minutes`` whole minutes from ``start`` (a
    minute boundary), by the minute's start."""
    counts = kinds(n, mix)
    result: dict[float, int] = {}
    for m in range(minutes):
        begin = start + 60 * m
        result[begin] = sum(count * len(slots_between(kind, begin, begin + 60)) for kind, count in counts.items())
    return result
