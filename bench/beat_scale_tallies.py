"""The beat scale benchmark's clock and tallies: minute boundaries, percentiles, resident memory, and
counts of the SQL statements, log records and publishes that a scheduler makes."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import gc
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from bench.common import resident_mib


def next_boundary(after: float | None = None) -> float:
    """The first whole minute (epoch seconds) strictly after ``after`` (default: now)."""
    moment = time.time() if after is None else after
    return (math.floor(moment / 60) + 1) * 60.0


def utc(moment: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(moment, tz=dt.UTC)


def percentile(values: list[float], share: float) -> float:
    """Nearest-rank percentile (``share`` in 0..1) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(share * len(ordered)))
    return ordered[rank - 1]


@dataclasses.dataclass
class SqlTally:
    """Statements sent through Django and the rows they returned or changed."""

    statements: int = 0
    rows_read: int = 0  # rows returned (SELECT, or anything with RETURNING)
    rows_written: int = 0  # rows changed by statements that return none
    paused: bool = False  # the bench's own checks are not counted

    def as_dict(self) -> dict[str, int]:
        return {"statements": self.statements, "rows_read": self.rows_read, "rows_written": self.rows_written}


@contextlib.contextmanager
def tallying_sql(tally: SqlTally) -> Iterator[SqlTally]:
    """Count every statement of the default connection into ``tally`` (``execute_wrapper``)."""
    from django.db import connection

    def wrapper(execute: Callable[..., Any], statement: str, params: Any, many: bool,
                context: dict[str, Any]) -> Any:
        result = execute(statement, params, many, context)
        if not tally.paused:
            cursor = context["cursor"]
            rows = max(int(cursor.rowcount or 0), 0)  # -1: not known
            tally.statements += 1
            if cursor.description is not None:
                tally.rows_read += rows
            else:
                tally.rows_written += rows
        return result

    with connection.execute_wrapper(wrapper):
        yield tally


@contextlib.contextmanager
def uncounted(tally: SqlTally) -> Iterator[None]:
    tally.paused = True
    try:
        yield
    finally:
        tally.paused = False


class LogTally(logging.Filter):
    """Counts the records that reach the ``cron_celery`` logger's handlers; shows only errors.

    A record per job (e.g. "schedule ...; next slot ..." at the first sync, should its level
    be raised to WARNING) would otherwise flood the output at N = 10,000; the counts go into
    the results instead.
    """

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def filter(self, record: logging.LogRecord) -> bool:
        self.counts[f"{record.levelname} {record.name}"] += 1
        return record.levelno >= logging.ERROR

    def take(self) -> dict[str, int]:
        counts = dict(self.counts)
        self.counts.clear()
        return counts


class PublishLog:
    """Notes when each message was published: Celery's ``after_task_publish`` signal, which its
    ``send_task_message`` sends after every publish, whichever path built the message
    (DatabaseScheduler's ``send_task``, or the cron_celery beat's own round sender)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.times: list[float] = []

    def published(self, sender: Any = None, **kwargs: Any) -> None:
        self.times.append(time.time())

    @contextlib.contextmanager
    def installed(self) -> Iterator[PublishLog]:
        from celery.signals import after_task_publish

        after_task_publish.connect(self.published, weak=False)
        try:
            yield self
        finally:
            after_task_publish.disconnect(self.published)


def resident() -> float | None:
    """This process's resident memory in MiB, once the garbage collector has run (not timed)."""
    gc.collect()
    return resident_mib()
