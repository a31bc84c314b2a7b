"""django-celery-beat's ``DatabaseScheduler`` as ``bench/latency.py`` runs it: unchanged, except
that it notes when each entry it sends was due, and when it is ready.

``celery -A bench.celery_app beat -S bench.latency_beat:DueScheduler``

The instant an entry was due is worked out as DatabaseScheduler itself decides it: the entry's
``last_run_at`` (the time it was last sent, or when the bench armed it) and its schedule, the
first slot of its crontab after that, or ``last_run_at`` + 10 s for the interval. It is handed to
the publish note (``bench.latency_jobs.STAMPS.due``) for the message being sent.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from django_celery_beat.schedulers import DatabaseScheduler

from bench import latency_jobs, latency_mix


def due_of(name: str, last_run_at: dt.datetime) -> float | None:
    """When the entry ``name`` (a ``latency_mix.job_name``) was due, given its ``last_run_at``."""
    kind = latency_mix.kind_from_name(name)
    if kind is None:
        return None
    last = last_run_at if last_run_at.tzinfo is not None else last_run_at.replace(tzinfo=dt.UTC)
    if kind == latency_mix.EVERY_10S:  # an interval: due a period after it last ran
        return last.timestamp() + latency_mix.PERIOD[kind]
    return latency_mix.next_slot(kind, last.timestamp())


class DueScheduler(DatabaseScheduler):  # type: ignore[misc]
    def setup_schedule(self) -> None:
        super().setup_schedule()
        self.schedule  # noqa: B018 - read every entry now, not at the first tick
        latency_jobs.client().set(f"{latency_jobs.KEY}:ready:dbs", repr(time.time()))

    def apply_async(self, entry: Any, producer: Any = None, advance: bool = True, **kwargs: Any) -> Any:
        latency_jobs.STAMPS.due = due_of(entry.name, entry.last_run_at)
        try:
            return super().apply_async(entry, producer, advance, **kwargs)
        finally:
            latency_jobs.STAMPS.due = None
