"""The phases the beat scale benchmark times on a scheduler: its build, idle ticks, crontab edits and the
burst at a minute boundary, then (cron_celery) the sync command and the admin's pages."""

from __future__ import annotations

import io
import statistics
import time
from collections.abc import Callable
from typing import Any

import redis

from bench.beat_scale_stores import QUEUE, purge_queue
from bench.beat_scale_tallies import LogTally, PublishLog, SqlTally, percentile, tallying_sql, uncounted
from bench.beat_scale_variants import EDITED, EVERY_MINUTE, SHARED_EDIT, Variant
from bench.common import BenchError, log

#: Fewer idle ticks than this inside the minute are warned about (and refused as ``--idle-ticks``).
MIN_IDLE_TICKS = 50


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
