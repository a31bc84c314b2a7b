"""The variants ``bench/overhead.py`` times, the tag that names this run's keys, and the slots its
tracked runs take. Importing it changes nothing outside this process (``overhead.py`` sets the
environment at import, from ``PREFIX``).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import uuid

#: A tag of this run: its queues, counters, nodes and bindings carry it, and only those are swept.
TAG = uuid.uuid4().hex[:10]
PREFIX = f"cron-celery-bench-{TAG}"

#: The timed runs' slots: from a week ago, a minute apart, so that each run's final write updates
#: the hourly and duration rollups as a live job's does (a slot older than their 8-day horizon
#: skips them). Each phase empties the tables first, so phases may reuse slots; a phase of more
#: than 10,080 runs reaches slots in the future, which changes nothing here.
SLOT_BASE = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0) - dt.timedelta(days=7)
WARMUP_BASE = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)


@dataclasses.dataclass(frozen=True)
class Variant:
    key: str
    label: str
    task: str  # the task's name
    result_backend: str  # "" = none
    table: str = ""  # the table whose rows mark completion ("" = the Redis counter only)
    done_status: str = ""
    reuse: bool = True  # False: the worker runs without CELERY_DB_REUSE_MAX
    once: bool = False  # celery-once: done when the counter is complete and no lock is left
    commit: str = ""  # "off": the worker's connections run with synchronous_commit = off
    tracked_plain: bool = False  # a plain task's message as the beat sends a tracked periodic task's


VARIANTS = (
    Variant("bare", "(i)   bare Celery task", "bench.noop", ""),
    Variant("results", "(ii)  + django-celery-results", "bench.noop", "django-db",
            "django_celery_results_taskresult", "SUCCESS"),
    Variant("tracked", "(iii) cron_task (tracked)", "bench.tracked_noop", "",
            "cron_celery_cronexecution", "SUCCEEDED"),
    Variant("once", "(iv)  celery-once QueueOnce", "bench.once_noop", "", once=True),
    Variant("plain-tracked", "(v)   plain task, tracked", "bench.noop", "", "cron_celery_cronexecution", "SUCCEEDED",
            tracked_plain=True),
)
#: With ``--also-without-reuse``: (ii) and (iii) again, without CELERY_DB_REUSE_MAX.
NO_REUSE_VARIANTS = (
    Variant("results-noreuse", "(ii')  (ii) without DB_REUSE_MAX", "bench.noop", "django-db",
            "django_celery_results_taskresult", "SUCCESS", reuse=False),
    Variant("tracked-noreuse", "(iii') (iii) without DB_REUSE_MAX", "bench.tracked_noop", "",
            "cron_celery_cronexecution", "SUCCEEDED", reuse=False),
)
#: With ``--also-commit-off``: (ii) and (iii) again, their worker's connections with
#: ``synchronous_commit = off`` (a commit returns before its WAL is flushed): the commit cost
#: taken out on both sides, so that what is left between them is code.
COMMIT_OFF_VARIANTS = (
    Variant("results-commit-off", "(ii*)  (ii), synchronous_commit off", "bench.noop", "django-db",
            "django_celery_results_taskresult", "SUCCESS", commit="off"),
    Variant("tracked-commit-off", "(iii*) (iii), synchronous_commit off", "bench.tracked_noop", "",
            "cron_celery_cronexecution", "SUCCEEDED", commit="off"),
)
ALL_VARIANTS = VARIANTS + NO_REUSE_VARIANTS + COMMIT_OFF_VARIANTS


def parse_variants(text: str) -> tuple[str, ...]:
    """``--variants``: the keys named, comma-separated, each one of ``ALL_VARIANTS``."""
    keys = tuple(key.strip() for key in text.split(",") if key.strip())
    known = {v.key for v in ALL_VARIANTS}
    unknown = [key for key in keys if key not in known]
    if unknown or not keys:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(sorted(known))} (got {text!r})")
    return keys


def chosen_variants(only: tuple[str, ...] | None, *, without_reuse: bool, commit_off: bool) -> tuple[Variant, ...]:
    """The variants to time, in turn: the five, then the extra ones asked for; ``only`` (the keys of
    ``--variants``), when given, picks from all of them instead."""
    variants = VARIANTS + (NO_REUSE_VARIANTS if without_reuse else ()) + (COMMIT_OFF_VARIANTS if commit_off else ())
    if only:
        variants = tuple(v for v in ALL_VARIANTS if v.key in only)
    return variants
