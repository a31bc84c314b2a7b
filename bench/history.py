"""The admin pages and endpoints at a million executions, and purge throughput.

    ./.venv-dj52/bin/python bench/history.py [--rows 1000000] [--jobs 1000] [--repeat 20]

Seeds its own database (``cron_celery_history``) with ``--jobs`` jobs and ``--rows``
finished executions, plus one more job that ran every second for a week (``--busy-rows``,
604,800 executions; all kept between runs when the counts match), then, as a logged-in staff
user through Django's test client, requests each page ``--repeat`` times and reports the
number of SQL queries, the median time, and whether PostgreSQL's plan for each query reads
the execution table with a sequential scan. It times the dashboard's 7-day figures for the
first page's 50 jobs two ways in the same database: read from the rollups (as the page does)
and by scanning each job's week (as the page did before the rollups). Then it purges 200,000 old rows in batches of
1,000 and reports rows per second. Last, it times the metrics scrape again at each history
size of ``--scrape-rows`` (default one and ten million executions, seeded in turn).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import BenchError, ensure_database, log, log_machine, run, write_results  # noqa: E402

#: Targets from the issue: each page at most 20 queries and under 100 ms (median).
MAX_QUERIES, MAX_MS = 20, 100.0
PURGE_ROWS = 200_000
#: The job that runs every second: a week of it.
BUSY_ROWS = 7 * 24 * 3600

#: The dashboard's 7-day figures as they were read before the rollups (the counting triggers): each
#: job's week of executions, scanned and sorted for the median. Kept here as the peer.
SCANNED_WEEK = """
SELECT j.id, (SELECT json_build_array(count(*) FILTER (WHERE completed AND status <> 'SKIPPED'),
    count(*) FILTER (WHERE status = 'SUCCEEDED'), percentile_cont(0.5) WITHIN GROUP
    (ORDER BY extract(epoch FROM ended - started)) FILTER (WHERE status = 'SUCCEEDED' AND started IS NOT NULL))
    FROM cron_celery_cronexecution WHERE job_id = j.id AND slot >= now() - interval '7 days')
FROM cron_celery_cronjob AS j WHERE j.id = ANY(%s)
"""


def seed(jobs: int, rows: int, busy: int) -> None:
    """Give the database ``jobs`` jobs with ``rows`` finished executions between them, and the
    every-second job with ``busy``; kept as they are when the counts already match."""
    from django.db import connection

    from cron_celery import models

    exe, job = models.CronExecution._meta.db_table, models.CronJob._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT (SELECT count(*) FROM {job}), (SELECT count(*) FROM {exe})")
        have_jobs, have_rows = cursor.fetchone()
        if (have_jobs, have_rows) == (jobs + 1, rows + busy):
            log(f"reusing {rows:,} executions of {jobs:,} jobs and {busy:,} of an every-second job")
            return
        log(f"seeding {rows:,} executions of {jobs:,} jobs and {busy:,} of an every-second job ...")
        began = time.monotonic()
        cursor.execute(f"TRUNCATE {exe}, {job}, {models.Alert._meta.db_table} RESTART IDENTITY CASCADE")
        seed_jobs(cursor, exe, job, jobs, rows)
        seed_busy_job(cursor, exe, job, busy)
        cursor.execute(f"ANALYZE {exe}")
        cursor.execute(f"ANALYZE {job}")
    log(f"  seeded in {time.monotonic() - began:.1f} s")


def seed_jobs(cursor: Any, exe: str, job: str, jobs: int, rows: int) -> None:
    """The ``jobs`` ordinary jobs (ids 1..jobs), and ``rows // jobs`` executions of each, one a minute back."""
    cursor.execute(
        f"""
        INSERT INTO {job} (name, code, task, pattern, overlap, timezone, description, paused, catch_up,
                           next_run_at, schedule, schedule_timezone, fence, consecutive_failures, last_status,
                           last_run_at, last_success_at, created_at, updated_at)
        SELECT 'job-' || lpad(n::text, 4, '0'), 'J' || n, 'bench.job' || n, 'standard', 'skip', 'UTC', '',
               false, 'latest', date_trunc('minute', now()) + interval '1 minute',
               CASE WHEN n %% 2 = 0 THEN 'every 60s' ELSE '*/5 * * * *' END, '', 0, n %% 4, 'SUCCEEDED',
               now(), now(), now(), now()
        FROM generate_series(1, %s) AS n
        """,
        [jobs],
    )
    per_job = rows // jobs
    for first in range(1, jobs + 1, 100):  # a hundred jobs per statement keeps memory modest
        cursor.execute(
            f"""
            INSERT INTO {exe} (job_id, task_code, task_name, slot, execution_date, run_number, status, trigger,
                skip_reason, forced, created_at, started, ended, completed, success, message, error_code,
                traceback, retry_count, celery_task_id, worker, fence)
            SELECT j.id, j.code, j.name, date_trunc('minute', now()) - make_interval(mins => g),
                   (now() - make_interval(mins => g))::date, 1,
                   CASE WHEN g %% 20 = 0 THEN 'FAILED' WHEN g %% 33 = 0 THEN 'SKIPPED' ELSE 'SUCCEEDED' END,
                   'BEAT', '', false, now(), now() - make_interval(mins => g, secs => 1 + g %% 9),
                   now() - make_interval(mins => g), true, g %% 20 <> 0, 'done', '', '', 0,
                   md5(j.id::text || '-' || g), 'bench-worker', g
            FROM {job} AS j, generate_series(1, %s) AS g
            WHERE j.id BETWEEN %s AND %s
            """,
            [per_job, first, first + 99],
        )


def seed_busy_job(cursor: Any, exe: str, job: str, busy: int) -> None:
    """The busy job, and ``busy`` executions of it a second apart, back from one anchor."""
    # job-0000 runs every second (it sorts first, so the dashboard's first page shows it): its
    # executions took 5-50 ms; one in a hundred failed.
    cursor.execute(
        f"""
        INSERT INTO {job} (name, code, task, pattern, overlap, timezone, description, paused, catch_up,
                           next_run_at, schedule, schedule_timezone, fence, consecutive_failures, last_status,
                           last_run_at, last_success_at, created_at, updated_at)
        VALUES ('job-0000', 'J0', 'bench.job0', 'always', 'allow', 'UTC', 'every second', false, 'latest',
                date_trunc('second', now()) + interval '1 second', 'every 1s', '', 0, 0, 'SUCCEEDED',
                now(), now(), now(), now())
        RETURNING id
        """
    )
    busy_id = cursor.fetchone()[0]
    cursor.execute("SELECT date_trunc('second', now())")  # one anchor for every statement's slots
    anchor = cursor.fetchone()[0]
    for first in range(1, busy + 1, 100_000):
        cursor.execute(
            f"""
            INSERT INTO {exe} (job_id, task_code, task_name, slot, execution_date, run_number, status, trigger,
                skip_reason, forced, created_at, started, ended, completed, success, message, error_code,
                traceback, retry_count, celery_task_id, worker, fence)
            SELECT %s, 'J0', 'job-0000', %s::timestamptz - make_interval(secs => g),
                   (%s::timestamptz - make_interval(secs => g))::date, 1,
                   CASE WHEN g %% 100 = 0 THEN 'FAILED' ELSE 'SUCCEEDED' END, 'BEAT', '', false, now(),
                   %s::timestamptz - make_interval(secs => g + (5 + (g * 37) %% 46) / 1000.0),
                   %s::timestamptz - make_interval(secs => g), true, g %% 100 <> 0, 'done', '', '', 0,
                   md5('busy-' || g), 'bench-worker', g
            FROM generate_series(%s, %s) AS g
            """,
            [busy_id, anchor, anchor, anchor, anchor, first, min(first + 99_999, busy)],
        )


def plans_scan_executions(sqls: list[str]) -> list[str]:
    """The queries whose plan reads the execution table with a sequential scan."""
    from django.db import connection

    from cron_celery import models

    table = models.CronExecution._meta.db_table
    scanning = []
    with connection.cursor() as cursor:
        for sql in sqls:
            if not sql.lstrip().upper().startswith("SELECT"):
                continue
            cursor.execute(f"EXPLAIN {sql}")
            plan = "\n".join(row[0] for row in cursor.fetchall())
            if f"Seq Scan on {table}" in plan:
                scanning.append(sql[:160])
    return scanning


def measure(client: Any, url: str, repeat: int, headers: dict[str, str] | None = None) -> dict[str, Any]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    times, counts, sqls = [], [], []
    for index in range(repeat + 1):
        with CaptureQueriesContext(connection) as captured:
            began = time.perf_counter()
            response = client.get(url, headers=headers or {})
            elapsed = (time.perf_counter() - began) * 1000
        if response.status_code not in (200, 503):
            raise BenchError(f"{url} answered {response.status_code}")
        if index == 0:  # warm-up; its queries are the ones explained
            sqls = [query["sql"] for query in captured.captured_queries]
            continue
        times.append(elapsed)
        counts.append(len(captured.captured_queries))
    return {"url": url, "queries": max(counts), "median_ms": round(statistics.median(times), 2),
            "p90_ms": round(sorted(times)[int(len(times) * 0.9) - 1], 2), "seq_scans": plans_scan_executions(sqls)}


def figures_side_by_side(repeat: int) -> dict[str, Any]:
    """The 7-day figures of the dashboard's first page, from the rollups and by scanning each
    job's week, timed in turn in the same database; the first page's jobs are those sorted first."""
    from django.db import connection

    from cron_celery import models
    from cron_celery.web import dashboard

    job_ids = list(models.CronJob.objects.order_by("name").values_list("id", flat=True)[:50])
    times: dict[str, list[float]] = {"rollups": [], "scan": []}
    figures: dict[str, dict[int, Any]] = {}
    with connection.cursor() as cursor:
        for index in range(repeat + 1):
            began = time.perf_counter()  # the page's own query, through the ORM (a little dearer for it)
            listed = list(dashboard.with_figures(models.CronJob.objects.filter(id__in=job_ids)))
            took = (time.perf_counter() - began) * 1000
            figures["rollups"] = {job.id: getattr(job, "week", None) for job in listed}
            began = time.perf_counter()
            cursor.execute(SCANNED_WEEK, [job_ids])
            figures["scan"] = dict(cursor.fetchall())
            if index:  # the first round warms the caches
                times["rollups"].append(took)
                times["scan"].append((time.perf_counter() - began) * 1000)
    busy = job_ids[0]
    shown = dashboard.week(_json(figures["rollups"][busy]))
    scanned = _json(figures["scan"][busy])
    medians = {name: round(statistics.median(values), 2) for name, values in times.items()}
    return {"jobs": len(job_ids), "rollups_ms": medians["rollups"], "scan_ms": medians["scan"],
            "busy": {"rollups": [shown.finished, shown.succeeded, shown.median],
                     "scan": [int(scanned[0]), int(scanned[1]), float(scanned[2])]}}


def _json(value: Any) -> Any:
    import json

    return json.loads(value) if isinstance(value, str) else value


def purge_throughput() -> dict[str, Any]:
    from django.db import connection

    from cron_celery import models
    from cron_celery.reconciler import retention

    exe = models.CronExecution._meta.db_table
    with connection.cursor() as cursor:
        for first in range(1, PURGE_ROWS + 1, 100_000):
            cursor.execute(
                f"""
                INSERT INTO {exe} (job_id, task_code, task_name, slot, execution_date, run_number, status, trigger,
                    skip_reason, forced, created_at, completed, message, error_code, traceback, retry_count,
                    celery_task_id, worker)
                SELECT 1, 'J1', 'job-0001', timestamp with time zone '2020-01-01' + make_interval(mins => g),
                       '2020-01-01', 1, 'SUCCEEDED', 'BEAT', '', false, now(), true, '', '', '', 0, '', ''
                FROM generate_series(%s, %s) AS g
                """,
                [first, min(first + 99_999, PURGE_ROWS)],
            )
    began = time.monotonic()
    result = retention.purge(dt.datetime(2021, 1, 1, tzinfo=dt.UTC), ("SUCCEEDED",), batch_size=1000)
    took = time.monotonic() - began
    if result.executions != PURGE_ROWS:
        raise BenchError(f"purged {result.executions} rows, expected {PURGE_ROWS}")
    return {"rows": result.executions, "batches": result.batches, "seconds": round(took, 2),
            "rows_per_second": round(result.executions / took)}


def versions() -> dict[str, str]:
    import platform

    import django
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        row = cursor.fetchone()
    return {"python": platform.python_version(), "django": django.get_version(),
            "postgresql": str(row[0]) if row else "?"}


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[int]]:
    """The options, and the history sizes of ``--scrape-rows``."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--jobs", type=int, default=1_000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--busy-rows", type=int, default=BUSY_ROWS,
                        help="executions of the job that runs every second (default: a week of them)")
    parser.add_argument("--scrape-rows", default="1000000,10000000",
                        help="history sizes at which the metrics scrape is timed again (comma-separated)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    try:
        scrape_rows = [int(part.replace("_", "")) for part in args.scrape_rows.split(",") if part.strip()]
    except ValueError:
        parser.error(f"--scrape-rows takes sizes such as 1000000,10000000, not {args.scrape_rows!r}")
    if args.jobs < 1 or args.rows < args.jobs or args.repeat < 1:
        parser.error("--jobs and --repeat must be at least 1, and --rows at least --jobs")
    return args, scrape_rows


def set_up(args: argparse.Namespace, loadavg: tuple[float, float, float]) -> None:
    """Django on the benchmark's own database (created if missing, migrated), seeded."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.history_settings"  # here, not at import
    from bench import history_settings

    ensure_database(history_settings.DATABASES["default"])
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0, interactive=False)
    log_machine(os.cpu_count(), loadavg[0], "slower")
    seed(args.jobs, args.rows, args.busy_rows)


def logged_in() -> tuple[Any, dict[str, str]]:
    """A test client logged in as the staff user ``bench``, and the endpoints' bearer header."""
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.test import Client

    user = get_user_model().objects.filter(username="bench").first() or get_user_model().objects.create_superuser(
        "bench", "bench@example.com", "bench-password-not-secret")
    client = Client()
    client.force_login(user)
    token = {"Authorization": f"Bearer {settings.CRON_CELERY['API_TOKENS']['bench']['token']}"}
    return client, token


def measure_pages(client: Any, token: dict[str, str], jobs: int, repeat: int) -> list[dict[str, Any]]:
    """Each admin page and endpoint, timed and its queries counted and explained."""
    from django.test.utils import override_settings

    middle = max(1, jobs // 2)  # the seeded jobs have ids 1..jobs and names job-0001...
    pages = [
        ("dashboard (50 jobs a page)", "/admin/cron_celery/cronjob/", None),
        ("history, filtered by job", f"/admin/cron_celery/cronexecution/?job={middle}", None),
        ("history, filtered by job and status",
         f"/admin/cron_celery/cronexecution/?job={middle}&status__exact=FAILED", None),
        ("history, unfiltered", "/admin/cron_celery/cronexecution/", None),
        ("status endpoint (limit 100)", "/cron/status/", token),
        ("status endpoint, one job", f"/cron/status/?job=job-{middle:04d}", token),
        ("health endpoint", "/cron/health/", token),
        ("metrics endpoint (a Prometheus scrape)", "/cron/metrics/", token),
    ]
    results = []
    with override_settings(ALLOWED_HOSTS=["testserver"]):
        for title, url, headers in pages:
            figures = {"page": title, **measure(client, url, repeat, headers)}
            results.append(figures)
            mark = "ok" if figures["queries"] <= MAX_QUERIES and figures["median_ms"] <= MAX_MS else "over target"
            log(f"{title:40} {figures['queries']:3} queries  median {figures['median_ms']:8.2f} ms  "
                f"p90 {figures['p90_ms']:8.2f} ms  seq scans {len(figures['seq_scans'])}  {mark}")
            for sql in figures["seq_scans"]:
                log(f"    sequential scan: {sql}")
    return results


def measure_scrapes(client: Any, token: dict[str, str], args: argparse.Namespace,
                    scrape_rows: list[int]) -> list[dict[str, Any]]:
    """The metrics scrape again at each history size of ``--scrape-rows``, seeded in turn."""
    from django.test.utils import override_settings

    scrapes = []
    with override_settings(ALLOWED_HOSTS=["testserver"]):
        for rows in scrape_rows:  # the scrape again as the history grows: it must stay flat
            seed(args.jobs, max(rows, args.jobs), args.busy_rows)
            figures = {"rows": rows, **measure(client, "/cron/metrics/", args.repeat, token)}
            scrapes.append(figures)
            log(f"metrics scrape at {rows:>12,} executions: {figures['queries']} queries, median "
                f"{figures['median_ms']:.2f} ms, p90 {figures['p90_ms']:.2f} ms, seq scans {len(figures['seq_scans'])}")
    return scrapes


def main(argv: list[str] | None = None) -> int:
    args, scrape_rows = parse_args(argv)
    started_at = dt.datetime.now(dt.UTC)
    loadavg = os.getloadavg()
    set_up(args, loadavg)
    client, token = logged_in()
    results = measure_pages(client, token, args.jobs, args.repeat)
    side = figures_side_by_side(args.repeat)
    log(f"7-day figures of {side['jobs']} jobs: {side['rollups_ms']:.2f} ms from the rollups, "
        f"{side['scan_ms']:.2f} ms scanning each week ({side['scan_ms'] / max(side['rollups_ms'], 0.01):.0f} x); "
        f"every-second job {side['busy']['rollups']} against {side['busy']['scan']}")
    purge = purge_throughput()
    log(f"purge: {purge['rows']:,} rows in {purge['batches']} batches, {purge['seconds']} s, "
        f"{purge['rows_per_second']:,} rows/s (target 50,000)")
    scrapes = measure_scrapes(client, token, args, scrape_rows)
    header = {"date": started_at.strftime("%Y-%m-%d %H:%M UTC"), "rows": args.rows, "jobs": args.jobs,
              "busy_rows": args.busy_rows,
              "repeat": args.repeat, "purge_rows": PURGE_ROWS, "max_queries": MAX_QUERIES, "max_ms": MAX_MS,
              "cpus": os.cpu_count(), "loadavg": loadavg, **versions()}
    write_results("history", started_at, {"settings": header, "started_at": started_at, "rows": args.rows,
                                          "jobs": args.jobs, "repeat": args.repeat, "pages": results,
                                          "purge": purge, "scrapes": scrapes, "figures": side, "cpus": os.cpu_count()},
                  args.json)
    return 0


if __name__ == "__main__":
    run(main)
