"""How the beat scales with the number of jobs: django-celery-beat against cron_celery.

Two schedulers, side by side, each given N jobs that all run every minute:

  DatabaseScheduler  django-celery-beat's own: N ``PeriodicTask`` rows of the task
                     ``bench.noop`` sharing one every-minute ``CrontabSchedule`` (inserted in
                     bulk before the clock starts);
  cron_celery        ``cron_celery.beat.Scheduler``: N jobs declared in this process with
                     ``cron("* * * * *")``, each with a task name of its own; its start-up
                     (``schedule_sync.sync``) creates their ``CronJob`` rows, periodic tasks
                     and ``next_run_at``.

For every N (``--sizes``; 10, 1,000 and 10,000 by default) and both schedulers, one after
the other, with the tables emptied in between:

  build      constructing the scheduler and reading its schedule (``.schedule``): the first
             time (cron_celery: empty tables; DatabaseScheduler: right after the rows were
             inserted) and again as on a restart (every row already there);
  idle tick  median and p95 of ``tick()`` while nothing is due (at least 50 back-to-back
             ticks inside one minute, every job's next slot being the next minute);
  edit       one job's crontab changed as the admin form does it (``PeriodicTask.save()``
             with another ``CrontabSchedule``): the ticks until the scheduler has taken it in,
             their time, SQL statements and the rows those returned; the edit is then
             undone the same way; last, the shared ``CrontabSchedule`` row itself is edited
             (minute ``*`` to ``*/1``: the same slots, but a change for all N jobs);
  burst      all N slots fall due at the same real minute boundary; the scheduler ticks as
             beat does (sleeping what ``tick()`` returns, at most 1 s) until all N are
             published or ``--burst-cap`` seconds have passed since the boundary (then the
             time for all N is extrapolated from the rate so far). Reported: the time from the
             slot's instant to the first and to the last publish, and publishes per second
             over the time to the last one;
  memory     this process's resident memory (``VmRSS``, after a garbage collection) before the N
             jobs are put in place, once they are (declared, for cron_celery), with the first
             scheduler built and open, and after the burst;
  sync       (cron_celery) ``manage.py sync_cron_schedules`` with everything already in place:
             its time, SQL statements and rows;
  pages      (cron_celery) the admin's index, the jobs dashboard's first page, the history's
             first page (the burst's N executions in it), one job's history, a job's page and the
             Upcoming page, as a logged-in superuser through Django's test client: one warm-up
             request, then five timed ones (median), their SQL statements and rows. The job and
             execution tables are analyzed first, as autovacuum would have done by then.

``--alone-from N`` measures sizes of N jobs and more with the cron_celery scheduler alone, e.g.
``--sizes 10,1000,10000,100000 --alone-from 100000`` (the full run's).

Every message goes to a queue nobody consumes, ``beat-scale-<pid>`` (Celery's default queue
in this process, ``BENCH_DEFAULT_QUEUE``). Publishes are counted with Celery's
``after_task_publish`` signal (both schedulers' messages send it) and checked against the
queue's length in Redis; the queue is
emptied after each burst and deleted, with its bindings, at the end. The cron_celery scheduler
leads without a lock (``CRON_CELERY_BEAT_ALWAYS_LEAD=1``).

Usage, from the repository root::

    ./.venv-dj60/bin/python bench/beat_scale.py                # N = 10, 1000, 10000
    ./.venv-dj60/bin/python bench/beat_scale.py --quick        # N = 10, 1000
    ./.venv-dj60/bin/python bench/beat_scale.py --sizes 10,5000

A run waits for a minute boundary once per N and scheduler, so it takes a few minutes (about
ten for the default sizes). Needs Redis (REDIS_URL, default redis://127.0.0.1:6379/0) and
PostgreSQL (DATABASE_URL; its host, port and user are used with the database ``BENCH_DB``,
default ``cron_celery_bench``, created and migrated here; only that database's periodic-task and
cron_celery tables are emptied). Settings: ``bench/beat_scale_settings.py`` (the benchmark's, with
the admin).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import gc
import io
import logging
import math
import os
import platform
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make ``bench`` and ``cron_celery`` importable
    sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    BenchError,
    broker_client,
    log,
    log_machine,
    resident_mib,
    run,
    setup_django,
    stop_on_sigterm,
    write_results,
)

QUEUE = f"beat-scale-{os.getpid()}"
#: Set by ``main`` (never at import: a test importing this module must not change its environment),
#: read when Django and Celery configure themselves (bench/beat_scale_settings.py, cron_celery.beat).
ENVIRONMENT = {"DJANGO_SETTINGS_MODULE": "bench.beat_scale_settings", "BENCH_DEFAULT_QUEUE": QUEUE,
               "CRON_CELERY_BEAT_ALWAYS_LEAD": "1"}

DEFAULT_SIZES = (10, 1000, 10_000)
QUICK_SIZES = (10, 1000)
MIN_IDLE_TICKS = 50
PRIORITY_SEP = "\x06\x16"  # kombu's Redis transport names priority lists "queue\x06\x16<n>"

EVERY_MINUTE = "* * * * *"
EDITED = "*/2 * * * *"  # the crontab one job is moved to
SHARED_EDIT = "*/1"  # the shared row's new minute field: the same slots, a different row


# ------------------------------------------------------------------------------- helpers


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


# -------------------------------------------------------------------------------- redis


def purge_queue(client: redis.Redis) -> None:
    client.delete(QUEUE, *(f"{QUEUE}{PRIORITY_SEP}{p}" for p in (3, 6, 9)))


def drop_queue(client: redis.Redis) -> int:
    """Delete the queue's lists and bindings; members naming it in shared sets are removed."""
    purge_queue(client)
    removed = 0
    for key in client.scan_iter(match=f"*{QUEUE}*", count=500):
        removed += int(client.delete(key))
    for pattern in ("_kombu.binding.*", "_kombu.binding_permanent.*"):
        for key in client.scan_iter(match=pattern, count=500):
            if client.type(key) == b"set":
                members = [m for m in client.smembers(key) if QUEUE.encode() in m]
                if members:
                    removed += int(client.srem(key, *members))
    if client.type("_kombu.binding_deadlines") == b"zset":
        stale = [m for m, _ in client.zscan_iter("_kombu.binding_deadlines") if QUEUE.encode() in m]
        if stale:
            removed += int(client.zrem("_kombu.binding_deadlines", *stale))
    return removed


# ----------------------------------------------------------------------------- database


def reset_tables() -> None:
    """Empty the periodic-task and cron_celery tables of the bench database (and only it)."""
    from django.conf import settings
    from django.db import connection

    from bench import settings as bench_settings

    if connection.settings_dict["NAME"] != bench_settings.BENCH_DB or settings.DATABASES["default"]["NAME"] != \
            bench_settings.BENCH_DB:
        raise BenchError(f"refusing to empty tables outside {bench_settings.BENCH_DB}")
    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE cron_celery_cronexecution, cron_celery_cronjob, django_celery_beat_periodictask,"
            " django_celery_beat_crontabschedule, django_celery_beat_periodictasks RESTART IDENTITY CASCADE"
        )


def pg_version() -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        row = cursor.fetchone()
    return str(row[0]) if row else "?"


def crontab(minute: str = "*", hour: str = "*") -> Any:
    from django_celery_beat.models import CrontabSchedule

    return CrontabSchedule.objects.create(minute=minute, hour=hour, day_of_month="*", month_of_year="*",
                                          day_of_week="*", timezone="UTC")


# ----------------------------------------------------------------------------- variants


class Variant:
    """One scheduler with N every-minute jobs: what differs between the two."""

    key = ""
    label = ""

    def __init__(self, app: Any, n: int) -> None:
        self.app = app
        self.n = n

    def prepare(self) -> None:
        """Put the N jobs in place (not part of the build time)."""
        raise NotImplementedError

    def construct(self) -> Any:
        raise NotImplementedError

    def arm(self, boundary: float) -> None:
        """Make every job's next slot ``boundary`` (the next minute) and nothing due before."""
        raise NotImplementedError

    def edit_target(self) -> Any:
        """The ``PeriodicTask`` of the job whose crontab is edited."""
        raise NotImplementedError

    def has_crontab(self, scheduler: Any, task: Any, row: Any, expression: str) -> bool:
        """Whether the scheduler now runs the edited job on ``row`` (``expression``)."""
        raise NotImplementedError

    def all_on_minute(self, scheduler: Any, minute: str) -> bool:
        """Whether the scheduler runs all N jobs with this minute field."""
        raise NotImplementedError

    def burst_rows(self, boundary: float) -> int | None:
        """Executions recorded for the burst's slot (None: this scheduler records none)."""
        return None

    def teardown(self) -> None:
        pass

    def build(self) -> Any:
        scheduler = self.construct()
        scheduler.schedule  # noqa: B018 - the first read of the schedule is part of the build
        return scheduler

    @staticmethod
    def close(scheduler: Any) -> None:
        """Close without writing back the run times of entries that are thrown away."""
        dirty = getattr(scheduler, "_dirty", None)
        if isinstance(dirty, set):
            dirty.clear()
        try:
            scheduler.close()
        finally:
            finalize = getattr(scheduler, "_finalize", None)
            if finalize is not None:
                finalize.cancel()  # its sync() would otherwise run at exit, on emptied tables


class CeleryBeatVariant(Variant):
    key = "dbs"
    label = "DatabaseScheduler"

    def name(self, index: int) -> str:
        return f"dbs-{index:06d}"

    def prepare(self) -> None:
        from django_celery_beat.models import PeriodicTask, PeriodicTasks

        self.shared = crontab()
        self.other = crontab(minute="*/2")
        PeriodicTask.objects.bulk_create(
            [PeriodicTask(name=self.name(i), task="bench.noop", crontab=self.shared, enabled=True)
             for i in range(self.n)],
            batch_size=2000,
        )
        PeriodicTasks.update_changed()  # bulk_create sends no signal

    def construct(self) -> Any:
        from django_celery_beat.schedulers import DatabaseScheduler

        return DatabaseScheduler(app=self.app)

    def arm(self, boundary: float) -> None:
        from django.utils import timezone
        from django_celery_beat.models import PeriodicTask

        if next_boundary() != boundary:
            raise BenchError("arming past the minute")
        # Last run "now": each entry's next slot is the next minute (no signal: not a change).
        PeriodicTask.objects.update(last_run_at=timezone.now())

    def edit_target(self) -> Any:
        from django_celery_beat.models import PeriodicTask

        return PeriodicTask.objects.get(name=self.name(self.n // 2))

    def has_crontab(self, scheduler: Any, task: Any, row: Any, expression: str) -> bool:
        entry = scheduler._schedule.get(task.name)
        return entry is not None and entry.model.crontab_id == row.id

    def all_on_minute(self, scheduler: Any, minute: str) -> bool:
        ours = [entry for name, entry in scheduler._schedule.items() if name.startswith("dbs-")]
        return len(ours) == self.n and all(entry.model.crontab.minute == minute for entry in ours)


class CronCeleryVariant(Variant):
    key = "cron_celery"
    label = "cron_celery"

    def prepare(self) -> None:
        from cron_celery import schedules
        from cron_celery.declaring import registry

        every_minute = schedules.cron(EVERY_MINUTE)
        self.names: list[str] = []
        started = time.perf_counter()
        for i in range(self.n):
            job = self.declare(i, every_minute)
            registry.register(job)
            self.names.append(job.name)
        self.declare_seconds = time.perf_counter() - started
        self.other = crontab(minute="*/2")  # an insert: no job's version moves

    def declare(self, i: int, schedule: Any) -> Any:
        from cron_celery.declaring import registry

        return registry.declare(name=f"beat-scale-{i:06d}", code=f"BS-{i:06d}",
                                task_name=f"bench.beat_scale.job_{i:06d}", schedule=schedule)

    def construct(self) -> Any:
        from cron_celery.beat import Scheduler

        return Scheduler(app=self.app)

    def arm(self, boundary: float) -> None:
        from cron_celery.models import CronJob

        if next_boundary() != boundary:
            raise BenchError("arming past the minute")
        CronJob.objects.filter(code__startswith="BS-").update(next_run_at=utc(boundary))

    def edit_target_job_id(self) -> int:
        from cron_celery.models import CronJob

        return int(CronJob.objects.values_list("id", flat=True).get(code=f"BS-{self.n // 2:06d}"))

    def edit_target(self) -> Any:
        from cron_celery.models import CronJob

        job = CronJob.objects.select_related("periodic_task").get(code=f"BS-{self.n // 2:06d}")
        if job.periodic_task is None:
            raise BenchError(f"job {job.name} has no periodic task after the sync")
        return job.periodic_task

    def has_crontab(self, scheduler: Any, task: Any, row: Any, expression: str) -> bool:
        from cron_celery.models import CronJob

        job = CronJob.objects.get(periodic_task_id=task.id)
        return job.schedule == expression and job.schedule_version == job.schedule_seen

    def all_on_minute(self, scheduler: Any, minute: str) -> bool:
        from django.db.models import F

        from cron_celery.models import CronJob

        jobs = CronJob.objects.filter(code__startswith="BS-")
        expression = f"{minute} * * * *"
        return (not jobs.exclude(schedule_version=F("schedule_seen")).exists()
                and jobs.filter(schedule=expression).count() == self.n)

    def burst_rows(self, boundary: float) -> int | None:
        from cron_celery.models import CronExecution

        return CronExecution.objects.filter(slot=utc(boundary), status="PENDING",
                                            task_code__startswith="BS-").count()

    def teardown(self) -> None:
        from cron_celery.declaring import registry

        for name in getattr(self, "names", []):
            registry.unregister(name)


class JitterVariant(CronCeleryVariant):
    """The same N jobs with ``jitter=30``: each slot sent a fixed offset below 30 s after it, so
    the burst spreads over half a minute; the idle tick must stay what it was."""

    key = "cron_celery_jitter"
    label = "cron_celery, jitter=30"
    jitter = 30

    def declare(self, i: int, schedule: Any) -> Any:
        from cron_celery.declaring import registry

        return registry.declare(name=f"beat-scale-{i:06d}", code=f"BS-{i:06d}",
                                task_name=f"bench.beat_scale.job_{i:06d}", schedule=schedule, jitter=self.jitter)


class DependentsVariant(CronCeleryVariant):
    """The same N jobs and 1,000 more declared ``after=`` them (job i after job i mod N): they have
    no schedule, so the beat never dispatches them; the idle tick must stay what it was."""

    key = "cron_celery_after"
    label = "cron_celery + 1,000 after="
    dependents = 1000

    def prepare(self) -> None:
        from cron_celery.declaring import registry

        super().prepare()
        started = time.perf_counter()
        for i in range(self.dependents):
            job = registry.declare(name=f"beat-scale-after-{i:06d}", code=f"BA-{i:06d}",
                                   task_name=f"bench.beat_scale.after_{i:06d}", after=[self.names[i % self.n]])
            registry.register(job)
            self.names.append(job.name)
        self.declare_seconds += time.perf_counter() - started


VARIANTS: tuple[type[Variant], ...] = (CeleryBeatVariant, CronCeleryVariant, JitterVariant, DependentsVariant)
#: The variants the page compares with DatabaseScheduler row by row (the first two are the pair).
CRON_VARIANTS = ("cron_celery", "cron_celery_jitter", "cron_celery_after")


# ------------------------------------------------------------------------------- phases


def timed_build(variant: Variant, logs: LogTally) -> tuple[Any, dict[str, Any]]:
    tally = SqlTally()
    with tallying_sql(tally):
        started = time.perf_counter()
        scheduler = variant.build()
        seconds = time.perf_counter() - started
    return scheduler, {"seconds": seconds, **tally.as_dict(), "log_records": logs.take()}


def idle_phase(scheduler: Any, ticks: int, stop_at: float) -> dict[str, Any]:
    """Back-to-back ticks while nothing is due, until ``ticks`` or ``stop_at``."""
    durations: list[float] = []
    tally = SqlTally()
    with tallying_sql(tally):
        while len(durations) < ticks and time.time() < stop_at:
            started = time.perf_counter()
            scheduler.tick()
            durations.append(time.perf_counter() - started)
    if not durations:
        raise BenchError("no time was left for idle ticks")
    if len(durations) < MIN_IDLE_TICKS:
        log(f"    warning: only {len(durations)} idle ticks fitted before the minute")
    return {
        "ticks": len(durations), "median_ms": statistics.median(durations) * 1000,
        "p95_ms": percentile(durations, 0.95) * 1000, "max_ms": max(durations) * 1000,
        "first_ms": durations[0] * 1000,
        "statements_per_tick": tally.statements / len(durations),
        "rows_read_per_tick": tally.rows_read / len(durations),
    }


def pickup(scheduler: Any, taken_in: Callable[[], bool], max_ticks: int) -> dict[str, Any]:
    """Tick until ``taken_in()``; the ticks' time, statements and rows (the checks excluded)."""
    tally = SqlTally()
    durations: list[float] = []
    done = False
    with tallying_sql(tally):
        while len(durations) < max_ticks and not done:
            started = time.perf_counter()
            scheduler.tick()
            durations.append(time.perf_counter() - started)
            with uncounted(tally):
                done = taken_in()
    if not done:
        raise BenchError(f"the edit was not taken in after {max_ticks} ticks")
    return {"ticks": len(durations), "ms": sum(durations) * 1000, "first_tick_ms": durations[0] * 1000,
            **tally.as_dict()}


def edit_phase(variant: Variant, scheduler: Any) -> dict[str, Any]:
    """One job moved to another crontab, moved back, then the shared crontab row edited."""
    task = variant.edit_target()
    shared = task.crontab
    task.crontab = variant.other
    task.save()  # what the admin's change form does
    single = pickup(scheduler, lambda: variant.has_crontab(scheduler, task, variant.other, EDITED), 5)
    task.crontab = shared
    task.save()
    undo = pickup(scheduler, lambda: variant.has_crontab(scheduler, task, shared, EVERY_MINUTE), 5)
    shared.minute = SHARED_EDIT
    shared.save()  # the admin's crontab change form: every task on the row changes
    whole = pickup(scheduler, lambda: variant.all_on_minute(scheduler, SHARED_EDIT), 100)
    return {"single": single, "undo": undo, "shared_row": whole}


def burst_phase(variant: Variant, scheduler: Any, publishes: PublishLog, client: redis.Redis,
                boundary: float, cap: float) -> dict[str, Any]:
    """Tick as beat does through ``boundary`` until every slot is published, or ``cap`` after it."""
    n = variant.n
    purge_queue(client)
    publishes.times.clear()
    deadline = boundary + cap
    ticks = 0
    while len(publishes.times) < n and time.time() < deadline:
        delay = float(scheduler.tick())
        ticks += 1
        if len(publishes.times) >= n:
            break
        time.sleep(max(0.0, min(delay, 1.0, deadline - time.time())))
    times = list(publishes.times)
    early = sum(1 for moment in times if moment < boundary)
    queued = int(client.llen(QUEUE))
    purge_queue(client)
    if queued != len(times):
        raise BenchError(f"{len(times)} publishes counted but {queued} messages in {QUEUE}")
    published = len(times)
    complete = published >= n
    last = times[-1] - boundary if times else float("nan")
    rate = published / last if times and last > 0 else float("nan")
    result: dict[str, Any] = {
        "published": published, "n": n, "complete": complete, "cap_seconds": cap, "ticks": ticks,
        "early": early, "first_s": times[0] - boundary if times else None, "last_s": last, "rate_per_s": rate,
        "time_to_all_s": last if complete else (n / rate if rate > 0 else None),
        "extrapolated": not complete, "queued": queued, "rows": variant.burst_rows(boundary),
    }
    if early:
        log(f"    warning: {early} publishes before the minute")
    if result["rows"] is not None and result["rows"] != published:
        log(f"    warning: {result['rows']} PENDING executions for {published} publishes")
    return result


def resident() -> float | None:
    """This process's resident memory in MiB, once the garbage collector has run (not timed)."""
    gc.collect()
    return resident_mib()


def sync_phase() -> dict[str, Any]:
    """``manage.py sync_cron_schedules`` with every job, row and periodic task already in place (and
    the shared crontab's edit kept): its time, statements and rows."""
    from django.core.management import call_command

    out = io.StringIO()
    tally = SqlTally()
    with tallying_sql(tally):
        started = time.perf_counter()
        call_command("sync_cron_schedules", stdout=out)
        seconds = time.perf_counter() - started
    said = [line for line in out.getvalue().splitlines() if line.strip()]
    return {"seconds": seconds, **tally.as_dict(), "report": said[-1] if said else ""}


def analyze_tables() -> None:
    """Fresh planner statistics for the job and execution tables, filled seconds ago: the state
    autovacuum leaves them in within minutes of a bulk load, in which the admin's pages are read
    (the dashboard's count, for one, is PostgreSQL's estimate past 10,000 jobs)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE cron_celery_cronjob, cron_celery_cronexecution")


#: The admin pages requested at each size (cron_celery only), as (key, what the page is, path); the
#: job's own page and one job's history are filled in with the edited job's id.
PAGES = (
    ("index", "the admin's index", "/admin/"),
    ("dashboard", "jobs dashboard, first page", "/admin/cron_celery/cronjob/"),
    ("history", "history, first page", "/admin/cron_celery/cronexecution/"),
    ("history_job", "one job's history", "/admin/cron_celery/cronexecution/?job={job}"),
    ("job", "a job's page", "/admin/cron_celery/cronjob/{job}/change/"),
    ("upcoming", "upcoming, the next hour", "/admin/cron_celery/cronjob/upcoming/"),
)
PAGE_REPEAT = 5


def pages_phase(job_id: int, repeat: int = PAGE_REPEAT) -> dict[str, Any]:
    """Each of ``PAGES`` as a logged-in superuser through Django's test client: one warm-up request,
    then ``repeat`` timed ones (median and slowest), their statements and the rows those returned."""
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.test.utils import override_settings

    users = get_user_model().objects
    user = users.filter(username="bench").first() or users.create_superuser(
        "bench", "bench@example.com", "bench-password-not-secret")
    client = Client()
    client.force_login(user)
    pages: dict[str, Any] = {}
    with override_settings(ALLOWED_HOSTS=["testserver"]):
        for key, title, path in PAGES:
            url = path.format(job=job_id)
            durations: list[float] = []
            tally = SqlTally()
            size = 0
            for index in range(repeat + 1):
                counted = SqlTally()
                with tallying_sql(counted):
                    started = time.perf_counter()
                    response = client.get(url)
                    elapsed = time.perf_counter() - started
                if response.status_code != 200:
                    raise BenchError(f"{url} answered {response.status_code}")
                if index:  # the first request warms the caches
                    durations.append(elapsed)
                    tally = counted
                    size = len(response.content)
            pages[key] = {"page": title, "url": url, "median_ms": statistics.median(durations) * 1000,
                          "max_ms": max(durations) * 1000, "bytes": size, **tally.as_dict()}
    return pages


def window_needed(restart_s: float, n: int) -> float:
    """Seconds to leave before the minute for a rebuild, the idle ticks and the edits."""
    return min(55.0, 4 + restart_s * 1.5 + 6 + 3 * restart_s + n / 2000)


def measure(variant: Variant, client: redis.Redis, publishes: PublishLog, logs: LogTally,
            args: argparse.Namespace) -> dict[str, Any]:
    n = variant.n
    reset_tables()
    memory: dict[str, float | None] = {"before_mib": resident()}
    started = time.perf_counter()
    variant.prepare()
    result: dict[str, Any] = {"scheduler": variant.label, "n": n,
                              "prepare_s": time.perf_counter() - started, "memory": memory}
    if isinstance(variant, CronCeleryVariant):
        result["declare_s"] = variant.declare_seconds
    memory["declared_mib"] = resident()
    logs.take()

    scheduler, result["build_first"] = timed_build(variant, logs)
    memory["built_mib"] = resident()  # the scheduler still open, its schedule read
    variant.close(scheduler)
    scheduler, result["build_restart"] = timed_build(variant, logs)
    variant.close(scheduler)
    restart_s = result["build_restart"]["seconds"]
    log(f"  {variant.label:<18} N={n:<6} build first {result['build_first']['seconds']:.3f} s, "
        f"restart {restart_s:.3f} s")

    # A rebuild, the idle ticks and the edits must all fit before the next minute.
    need = window_needed(restart_s, n)
    if next_boundary() - time.time() < need:
        time.sleep(max(0.0, next_boundary() - time.time()) + 0.2)
    for _attempt in range(3):
        boundary = next_boundary()
        variant.arm(boundary)
        scheduler, result["build_armed"] = timed_build(variant, logs)
        try:
            edit_reserve = max(3.0, need - 6 - restart_s * 1.5)
            result["idle"] = idle_phase(scheduler, args.idle_ticks, boundary - edit_reserve)
            result["edit"] = edit_phase(variant, scheduler)
            result["edit"]["log_records"] = logs.take()
            if time.time() < boundary - 0.5:
                break
            log("    the minute came before the edits were done: measuring again at the next one")
        except BaseException:
            variant.close(scheduler)
            raise
        variant.close(scheduler)
        time.sleep(max(0.0, next_boundary() - time.time()) + 0.2)
    else:
        raise BenchError("could not fit the idle ticks and the edits inside a minute")

    try:
        idle, edit = result["idle"], result["edit"]
        log(f"  {'':<18} {'':<8} idle tick median {idle['median_ms']:.2f} ms ({idle['ticks']} ticks), "
            f"edit picked up in {edit['single']['ms']:.1f} ms ({edit['single']['rows_read']} rows read); "
            f"waiting for {utc(boundary):%H:%M:%S}")
        result["burst"] = burst_phase(variant, scheduler, publishes, client, boundary, args.burst_cap)
        result["burst"]["log_records"] = logs.take()
        memory["burst_mib"] = resident()
    finally:
        variant.close(scheduler)
    burst = result["burst"]
    log(f"  {'':<18} {'':<8} burst: {burst['published']}/{n} published, last "
        f"{burst['last_s']:.2f} s after the slot, {burst['rate_per_s']:.1f}/s")
    before = memory["before_mib"]
    log(f"  {'':<18} {'':<8} resident memory {before} MiB before the jobs, {memory['declared_mib']} declared, "
        f"{memory['built_mib']} built, {memory['burst_mib']} after the burst")
    if variant.key == "cron_celery":  # the command and the pages, with the burst's executions in place
        result["sync_command"] = sync_phase()
        analyze_tables()
        sync = result["sync_command"]
        log(f"  {'':<18} {'':<8} sync_cron_schedules {sync['seconds']:.3f} s, {sync['statements']:,} statements, "
            f"{sync['rows_read']:,} rows read ({sync['report']})")
        job_id = variant.edit_target_job_id()
        result["pages"] = pages_phase(job_id)
        for page in result["pages"].values():
            log(f"  {'':<18} {'':<8} {page['page']:<28} {page['median_ms']:9.2f} ms median, "
                f"{page['statements']:3} statements, {page['rows_read']:,} rows read")
    return result


# ------------------------------------------------------------------------------ report


def ratio(ours: float | None, theirs: float | None) -> str:
    if ours is None or theirs is None or not theirs or math.isnan(ours) or math.isnan(theirs):
        return "-"
    return f"{ours / theirs:.3g}"


def burst_time(burst: dict[str, Any]) -> str:
    value = burst["time_to_all_s"]
    if value is None:
        return "-"
    return f"{value:.2f} s" if burst["complete"] else f"~{value:.0f} s (extrap.)"


def table(n: int, dbs: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    def row(label: str, left: str, right: str, rat: str = "") -> str:
        return f"  {label:<36} {left:>24} {right:>24} {rat:>9}"

    rows = [f"N = {n:,}", row("", "DatabaseScheduler", ours["scheduler"], "cc / DBS"),
            row("jobs in place (bulk insert / declare)", f"{dbs['prepare_s']:.3f} s", f"{ours['prepare_s']:.3f} s")]
    for key, label in (("build_first", "build, first"), ("build_restart", "build, restart")):
        rows.append(row(label, f"{dbs[key]['seconds']:.3f} s", f"{ours[key]['seconds']:.3f} s",
                        ratio(ours[key]["seconds"], dbs[key]["seconds"])))
        rows.append(row("  SQL statements", f"{dbs[key]['statements']:,}", f"{ours[key]['statements']:,}"))
    idle_d, idle_o = dbs["idle"], ours["idle"]
    rows.append(row("idle tick, median", f"{idle_d['median_ms']:.2f} ms", f"{idle_o['median_ms']:.2f} ms",
                    ratio(idle_o["median_ms"], idle_d["median_ms"])))
    rows.append(row("idle tick, p95", f"{idle_d['p95_ms']:.2f} ms", f"{idle_o['p95_ms']:.2f} ms",
                    ratio(idle_o["p95_ms"], idle_d["p95_ms"])))
    rows.append(row("  statements / rows read per tick",
                    f"{idle_d['statements_per_tick']:.1f} / {idle_d['rows_read_per_tick']:.1f}",
                    f"{idle_o['statements_per_tick']:.1f} / {idle_o['rows_read_per_tick']:.1f}"))
    for key, label in (("single", "edit one job: pickup"), ("undo", "undo the edit: pickup"),
                       ("shared_row", "edit shared crontab row: pickup")):
        left, right = dbs["edit"][key], ours["edit"][key]
        rows.append(row(label, f"{left['ms']:.1f} ms in {left['ticks']} tick(s)",
                        f"{right['ms']:.1f} ms in {right['ticks']} tick(s)", ratio(right["ms"], left["ms"])))
        rows.append(row("  statements / rows read / written",
                        f"{left['statements']} / {left['rows_read']:,} / {left['rows_written']:,}",
                        f"{right['statements']} / {right['rows_read']:,} / {right['rows_written']:,}"))
    bd, bo = dbs["burst"], ours["burst"]
    rows.append(row("burst: published", f"{bd['published']:,}/{n:,}" + ("" if bd["complete"] else " (cap)"),
                    f"{bo['published']:,}/{n:,}" + ("" if bo["complete"] else " (cap)")))
    rows.append(row("burst: first publish after slot", f"{bd['first_s']:.3f} s", f"{bo['first_s']:.3f} s"))
    rows.append(row("burst: last publish after slot", f"{bd['last_s']:.3f} s", f"{bo['last_s']:.3f} s"))
    rows.append(row("burst: publishes/s (to the last)", f"{bd['rate_per_s']:.1f}", f"{bo['rate_per_s']:.1f}",
                    ratio(bo["rate_per_s"], bd["rate_per_s"])))
    rows.append(row("burst: time to publish all N", burst_time(bd), burst_time(bo),
                    ratio(bo["time_to_all_s"], bd["time_to_all_s"])))
    return rows


# -------------------------------------------------------------------------------- main


def versions() -> dict[str, str]:
    import celery
    import django
    import django_celery_beat
    import kombu
    import psycopg

    return {"python": platform.python_version(), "django": django.get_version(), "celery": celery.__version__,
            "kombu": kombu.__version__, "django_celery_beat": getattr(django_celery_beat, "__version__", "?"),
            "psycopg": psycopg.__version__, "redis_py": redis.__version__}


def measured_at(n: int, chosen: list[str], alone_from: int | None) -> list[str]:
    """The variants measured at ``n`` jobs: those chosen, or from ``alone_from`` jobs up only the
    plain cron_celery scheduler (if chosen)."""
    if alone_from is not None and n >= alone_from:
        return [name for name in chosen if name == CronCeleryVariant.key]
    return chosen


def parse_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part.replace("_", "")) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected sizes such as 10,1000: {text!r}") from exc
    if not sizes or any(size < 1 or size > 999_999 for size in sizes):
        raise argparse.ArgumentTypeError("sizes are 1..999999")
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--sizes", type=parse_sizes, default=None,
                        help="numbers of jobs, comma-separated (default 10,1000,10000; at most 999,999)")
    parser.add_argument("--quick", action="store_true", help="N = 10 and 1000 only (unless --sizes)")
    parser.add_argument("--idle-ticks", type=int, default=60, help=f"idle ticks (at least {MIN_IDLE_TICKS})")
    parser.add_argument("--burst-cap", type=float, default=60.0,
                        help="stop a burst this many seconds after the minute (default 60)")
    parser.add_argument("--variants", default=",".join(variant.key for variant in VARIANTS),
                        help="which schedulers to measure, comma-separated (default all: "
                             f"{', '.join(variant.key for variant in VARIANTS)}); the page needs all")
    parser.add_argument("--alone-from", type=int, default=None, metavar="N",
                        help="at N jobs and more, measure the cron_celery scheduler alone (DatabaseScheduler "
                             "and the other variants would take hours at 100,000)")
    parser.add_argument("--json", type=Path, default=None,
                        help="write the results here (default bench/results/beat_scale-<time>.json)")
    args = parser.parse_args(argv)
    sizes: tuple[int, ...] = args.sizes or (QUICK_SIZES if args.quick else DEFAULT_SIZES)
    if args.idle_ticks < MIN_IDLE_TICKS:
        parser.error(f"--idle-ticks must be at least {MIN_IDLE_TICKS}")
    if not 1 <= args.burst_cap <= 60:
        parser.error("--burst-cap is 1..60 seconds (the next minute's slots must not mix in)")
    known = {variant.key: variant for variant in VARIANTS}
    chosen = [name.strip() for name in args.variants.split(",") if name.strip()]
    if not chosen or [name for name in chosen if name not in known]:
        parser.error(f"--variants takes some of {', '.join(known)}, not {args.variants!r}")

    os.environ.update(ENVIRONMENT)
    stop_on_sigterm()
    redis_url, client = broker_client()
    db_name = setup_django()

    import bench.tasks  # noqa: F401 - registers bench.noop, the DatabaseScheduler's task
    from bench.celery_app import app
    from cron_celery import conf

    if app.conf.task_default_queue != QUEUE:
        raise BenchError(f"the default queue is {app.conf.task_default_queue}, not {QUEUE}")
    logs = LogTally()
    handlers = logging.getLogger("cron_celery").handlers
    for handler in handlers:
        handler.addFilter(logs)

    started_at = dt.datetime.now(dt.UTC)
    header = {
        "date": started_at.strftime("%Y-%m-%d %H:%M UTC"), "sizes": list(sizes), "idle_ticks": args.idle_ticks,
        "burst_cap_s": args.burst_cap, "variants": chosen, "alone_from": args.alone_from, "queue": QUEUE,
        "broker": redis_url, "database": db_name,
        "postgresql": pg_version(), "beat_batch": conf.settings.BEAT_BATCH,
        "max_interval_s": app.conf.beat_max_loop_interval or 5, "cpus": os.cpu_count(),
        "loadavg": os.getloadavg(), **versions(),
    }
    log(f"beat scale benchmark, {header['date']}: N = {', '.join(f'{n:,}' for n in sizes)}")
    log(f"  PostgreSQL {header['postgresql']} ({db_name}), broker {redis_url}, queue {QUEUE}")
    log(f"  Python {header['python']}, Django {header['django']}, Celery {header['celery']}, "
        f"django-celery-beat {header['django_celery_beat']}; cron_celery BEAT_BATCH={header['beat_batch']}")
    log_machine(header["cpus"], header["loadavg"][0], "noisy")

    results: dict[str, dict[str, Any]] = {}
    publishes = PublishLog(app)
    try:
        with publishes.installed():
            for n in sizes:
                results[str(n)] = {}
                for variant_cls in (known[name] for name in measured_at(n, chosen, args.alone_from)):
                    variant = variant_cls(app, n)
                    try:
                        results[str(n)][variant.key] = measure(variant, client, publishes, logs, args)
                    finally:
                        variant.teardown()
                log("")
                for key in CRON_VARIANTS:
                    if "dbs" not in results[str(n)] or key not in results[str(n)]:
                        continue  # a table compares with DatabaseScheduler: see the JSON for the rest
                    for line in table(n, results[str(n)]["dbs"], results[str(n)][key]):
                        log(line)
                    log("")
    finally:
        with contextlib.suppress(Exception):
            reset_tables()
        drop_queue(client)
        for handler in handlers:
            handler.removeFilter(logs)
        left = list(client.scan_iter(match=f"*{QUEUE}*"))
        if left:
            log(f"warning: keys left in Redis: {left}")

    write_results("beat_scale", started_at, {"settings": header, "results": results}, args.json)
    return 0


if __name__ == "__main__":
    run(main)
