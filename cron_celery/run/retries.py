"""Retry policy: whether a failed attempt is tried again, and after how long.

The numbers follow Celery's own ``retry_backoff`` options, so a job declared with
``max_retries=3, retry_backoff=5`` waits about 5, 10 and 20 seconds (each at most
``retry_backoff_max``; with ``retry_jitter`` a random time up to that). Whether attempts
remain is decided by the database (``finishes.retry``), never by the message alone.
"""

from __future__ import annotations

import datetime as dt
import random

from celery.exceptions import Retry, SoftTimeLimitExceeded, TimeLimitExceeded

from cron_celery import enums, exceptions
from cron_celery.declaring import registry

S = enums.Status

#: Celery's ``default_retry_delay``: the wait when a job turns exponential backoff off.
FIXED_DELAY = 180.0


def wanted(job: registry.Job, status: str, error: BaseException | None, retry_count: int) -> bool:
    """Should this failed attempt be tried again (attempts permitting)?

    An exception retries when it is one of ``retry_on`` (any ``Exception`` by default; the
    soft time limit's ``SoftTimeLimitExceeded`` is one). A reported failure
    (``{"error": True}`` or ``JobFailed``) retries only with ``retry_on_failure``. A run
    interrupted by a worker shutdown is always tried again while attempts remain. Parameter
    values that do not fit the job (``InvalidParams``) are never tried again.
    """
    if retry_count >= job.max_retries or status not in (S.FAILED, S.TIMED_OUT):
        return False
    if isinstance(error, exceptions.InvalidParams):  # the same values would fail the same way
        return False
    if isinstance(error, exceptions.Interrupted):
        return True
    if error is None or isinstance(error, exceptions.JobFailed):
        return job.retry_on_failure
    return isinstance(error, job.retry_on)


def wanted_after_kill(job: registry.Job) -> bool:
    """Retry after the hard time limit killed the worker process (``TimeLimitExceeded``)?"""
    return any(issubclass(TimeLimitExceeded, kind) or issubclass(SoftTimeLimitExceeded, kind)
               for kind in job.retry_on)


def longest_wait(job: registry.Job, retries_done: int) -> float:
    """The most seconds the backoff waits before attempt ``retries_done + 2`` (jitter only
    shortens it)."""
    if job.retry_backoff is False:
        return FIXED_DELAY
    factor = 1.0 if job.retry_backoff is True else float(job.retry_backoff)
    return min(float(job.retry_backoff_max), factor * 2.0 ** retries_done)


def countdown(job: registry.Job, retries_done: int) -> float:
    """Seconds to wait before attempt ``retries_done + 2`` (after ``retries_done`` retries)."""
    wait = longest_wait(job, retries_done)
    return random.uniform(0, wait) if job.retry_jitter and job.retry_backoff is not False else wait


def cause(error: BaseException) -> BaseException:
    """What an attempt failed with: for a tracked task's own ``self.retry(exc=...)`` (Celery's ``Retry``),
    the exception it retries for, else ``error`` itself."""
    found = getattr(error, "exc", None) if isinstance(error, Retry) else None
    return found if isinstance(found, BaseException) else error


def asked_for(error: BaseException | None) -> float | None:
    """A tracked periodic task's own retry (``self.retry()``, ``autoretry_for``: Celery raised
    ``Retry`` once its next message was sent): seconds until that attempt is due; None otherwise."""
    if not isinstance(error, Retry):
        return None
    when = error.when
    if isinstance(when, dt.datetime):
        aware = when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)
        return max(0.0, (aware - dt.datetime.now(dt.UTC)).total_seconds())
    try:
        return max(0.0, float(when)) if when is not None else 0.0
    except (TypeError, ValueError):
        return 0.0
