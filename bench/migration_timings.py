"""How long the migrations that touch the executions and jobs tables take at ten million executions, and
how long a claim's statements wait while each runs.

    ./.venv-dj60/bin/python bench/migration_timings.py [--rows 10000000] [--jobs 300] [--first 0002] [--keep]
    ./.venv-dj60/bin/python -m bench.migration_timings ...

Creates a database of its own (``cron_celery_migration_timings``, or ``BENCH_MIGRATION_DB``) on the server
of ``DATABASE_URL``, migrates cron_celery to the migration before ``--first``, and loads ``--jobs`` jobs and
``--rows`` finished executions (INSERT ... SELECT generate_series, a million rows a statement, with the
tables' triggers off for that session). Then, for each migration from ``--first`` on, in order:

1. *held*: a session holds the jobs and executions tables (ACCESS SHARE, as an open transaction that read
   them does) and the migration is run: it should give up after its lock_timeout;
2. *forwards*: the migration is run with the tables free, and timed;
3. *backwards*: it is undone, and timed; then run forwards again for the next one.

While each runs, two probes loop in sessions of their own: a claim's UPDATE of a job row (the fence it
takes) and an INSERT of a RUNNING execution; the longest each waited while the migration ran is reported,
beside the longest of the same statements in the second before it. The times are of the migration's
operations (Django's ``MigrationExecutor.migrate``, what ``manage.py migrate cron_celery NAME`` runs
between its checks and its ``post_migrate`` signal). Prints a Markdown table for docs/migrating.md and
writes the figures as JSON (``--json``, default ``bench/results/migration-timings-<time>.json``). The
database is dropped at the end; ``--keep`` keeps it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import BenchError, ensure_database, log, log_machine, run, write_results  # noqa: E402

APP = "cron_celery"
JOB, EXE = "cron_celery_cronjob", "cron_celery_cronexecution"
#: How long the probes run alone before each migration: their usual time.
BEFORE = 1.0
CHUNK = 1_000_000


@dataclass
class Probe:
    """One statement run over and over in a session of its own; each run's start and duration."""

    name: str
    sql: str
    params: dict[str, Any]
    runs: list[tuple[float, float]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def loop(self, conninfo: dict[str, Any]) -> None:
        import psycopg

        with psycopg.connect(autocommit=True, **conninfo) as conn:
            conn.execute("SET statement_timeout = '120s'")
            while not self.stop.is_set():
                began = time.monotonic()
                conn.execute(self.sql, self.params)
                self.runs.append((began, time.monotonic() - began))
                time.sleep(0.02)

    def longest(self, start: float, end: float) -> float:
        """The longest run that overlapped [start, end]."""
        return max((took for began, took in self.runs if began <= end and began + took >= start), default=0.0)


def conninfo() -> dict[str, Any]:
    from django.db import connection

    db = connection.settings_dict
    return {"host": db["HOST"], "port": db["PORT"], "user": db["USER"], "password": db["PASSWORD"] or None,
            "dbname": db["NAME"]}


def probes(job_id: int) -> list[Probe]:
    from cron_celery.decisions import executions

    claim = Probe("job-row UPDATE", f"UPDATE {JOB} SET fence = fence + 1 WHERE id = %(job)s", {"job": job_id})
    insert = Probe("execution INSERT", f"""
        INSERT INTO {EXE} ({executions.INSERT_COLUMNS})
        VALUES (%(job)s, 'J1', 'job-0001', clock_timestamp(), current_date, 1, 'RUNNING', 'BEAT', '', false,
                now(), clock_timestamp(), NULL, false, NULL, '', '', '', 0, '', 'probe', NULL, 1,
                now() + interval '60 seconds', '[]'::jsonb)
        """, {"job": job_id})
    return [claim, insert]


def load(jobs: int, rows: int) -> int:
    """Seed the jobs and executions; the first job's id (the probes use it)."""
    from django.db import connection

    began = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")  # no triggers, no FK checks: a bulk load
        cursor.execute(f"""
            INSERT INTO {JOB} (name, code, task, pattern, overlap, timezone, description, paused, catch_up,
                               next_run_at, schedule, schedule_timezone, fence, consecutive_failures, last_status,
                               last_run_at, last_success_at, created_at, updated_at)
            SELECT 'job-' || lpad(n::text, 4, '0'), 'J' || n, 'bench.job' || n, 'standard', 'skip', 'UTC', '',
                   false, 'latest', date_trunc('minute', now()) + interval '1 minute', '* * * * *', '', 0, 0,
                   'SUCCEEDED', now(), now(), now(), now()
            FROM generate_series(1, %s) AS n RETURNING id""", [jobs])
        ids = sorted(int(row[0]) for row in cursor.fetchall())
        if ids != list(range(ids[0], ids[0] + jobs)):
            raise BenchError("the jobs' ids are not consecutive: is the database fresh?")
        cursor.execute("SELECT date_trunc('minute', now())")  # one anchor for every statement's slots
        anchor = cursor.fetchone()[0]
        for first in range(0, rows, CHUNK):
            cursor.execute(f"""
                INSERT INTO {EXE} (job_id, task_code, task_name, slot, execution_date, run_number, status, trigger,
                    skip_reason, forced, created_at, started, ended, completed, success, message, error_code,
                    traceback, retry_count, celery_task_id, worker, fence)
                SELECT %(first_id)s + g %% %(jobs)s, 'J' || (1 + g %% %(jobs)s),
                       'job-' || lpad((1 + g %% %(jobs)s)::text, 4, '0'), s.slot, s.slot::date, 1,
                       CASE WHEN g %% 20 = 0 THEN 'FAILED' ELSE 'SUCCEEDED' END, 'BEAT', '', false, s.slot,
                       s.slot + interval '1 second', s.slot + interval '3 seconds', true, g %% 20 <> 0, 'done', '',
                       '', 0, md5(g::text), 'bench-worker', g
                FROM generate_series(%(first)s, %(last)s) AS g,
                     LATERAL (SELECT %(anchor)s::timestamptz - make_interval(mins => 1 + g / %(jobs)s) AS slot) AS s
                """, {"first_id": ids[0], "jobs": jobs, "first": first, "last": min(first + CHUNK, rows) - 1,
                      "anchor": anchor})
            log(f"  {min(first + CHUNK, rows):,} executions ({time.monotonic() - began:.0f} s)")
        cursor.execute("RESET session_replication_role")
        cursor.execute(f"ANALYZE {JOB}")
        cursor.execute(f"ANALYZE {EXE}")
        cursor.execute(f"SELECT pg_size_pretty(pg_total_relation_size('{EXE}'))")
        size = cursor.fetchone()[0]
    log(f"  loaded in {time.monotonic() - began:.0f} s; the executions table and its indexes: {size}")
    return ids[0]


def migrate(target: str) -> str:
    """Migrate cron_celery to ``target``: "ran", or the error it ended with."""
    from django.db import DatabaseError, connection
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    try:
        executor.migrate([(APP, target)])
    except DatabaseError as exc:
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")  # a migration that failed did not reset it
        return f"{type(exc).__name__}: {str(exc).strip()}"
    return "ran"


def timed(target: str, watching: list[Probe], *, held: bool = False) -> dict[str, Any]:
    """Run the migration to ``target`` with the probes looping (and, ``held``, a session holding the two
    tables until it ends); how long it took, how it ended, and the probes' longest waits."""
    import psycopg

    for probe in watching:
        probe.runs.clear()
        probe.stop.clear()
    threads = [threading.Thread(target=probe.loop, args=(conninfo(),), daemon=True) for probe in watching]
    with psycopg.connect(**conninfo()) as holder:
        if held:
            holder.execute(f"LOCK TABLE {JOB}, {EXE} IN ACCESS SHARE MODE")
        for thread in threads:
            thread.start()
        time.sleep(BEFORE)
        start = time.monotonic()
        ended = migrate(target)
        end = time.monotonic()
        holder.rollback()
    time.sleep(0.5)
    for probe in watching:
        probe.stop.set()
    for thread in threads:
        thread.join()
    return {"seconds": round(end - start, 3), "ended": ended,
            "waits": {probe.name: round(probe.longest(start, end), 3) for probe in watching},
            "usual": {probe.name: round(probe.longest(start - BEFORE, start - 0.001), 3) for probe in watching}}


def measure(names: list[str], previous: str, job_id: int) -> dict[str, Any]:
    watching = probes(job_id)
    figures: dict[str, Any] = {}
    for name in names:
        log(f"{name}:")
        found = {"held": timed(name, watching, held=True), "forwards": timed(name, watching),
                 "backwards": timed(previous, watching)}
        for what, figure in found.items():
            log(f"  {what}: {figure['seconds']:.3f} s, {figure['ended'][:70]}; longest waits "
                + ", ".join(f"{probe} {figure['waits'][probe]:.3f} s (before: {figure['usual'][probe]:.3f} s)"
                            for probe in figure["waits"]))
        if migrate(name) != "ran":
            raise BenchError(f"{name} did not run forwards again")
        figures[name], previous = found, name
    return figures


def table(figures: dict[str, Any], rows: int) -> str:
    def waits(figure: dict[str, Any]) -> str:
        return " / ".join(f"{seconds:.3f} s" for seconds in figure["waits"].values())

    lines = [f"| Migration | Time at {rows:,} executions | Backwards | Job-row UPDATE / execution INSERT waited "
             "(longest) | Tables held by another session: it failed after | and they waited |",
             "|---|---|---|---|---|---|"]
    for name, found in figures.items():
        held = found["held"]
        gave_up = f"{held['seconds']:.1f} s" + ("" if "lock timeout" in held["ended"] else f" ({held['ended'][:40]})")
        lines.append(f"| `{name}` | {found['forwards']['seconds']:.3f} s | {found['backwards']['seconds']:.3f} s | "
                     f"{waits(found['forwards'])} | {gave_up} | {waits(held)} |")
    return "\n".join(lines)


def drop(name: str) -> None:
    import psycopg
    from psycopg import sql

    info = {**conninfo(), "dbname": "postgres"}
    from django.db import connections

    connections.close_all()
    with psycopg.connect(autocommit=True, **info) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    log(f"dropped database {name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--first", default="0002",
                        help="the first migration to time (its number; default: every one after the initial)")
    parser.add_argument("--keep", action="store_true", help="keep the database")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.rows < args.jobs:
        parser.error("--jobs must be at least 1, and --rows at least --jobs")
    started_at = dt.datetime.now(dt.UTC)
    name = os.environ.get("BENCH_MIGRATION_DB", "cron_celery_migration_timings")
    os.environ["BENCH_DB"] = name
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"  # here, not at import
    from bench import settings

    if not ensure_database(settings.DATABASES["default"]):
        raise BenchError(f"database {name} exists already: drop it, or name another with BENCH_MIGRATION_DB")
    try:
        return measured(args, name, started_at)
    finally:
        if not args.keep:
            drop(name)


def measured(args: argparse.Namespace, name: str, started_at: dt.datetime) -> int:
    import django
    from django.db import connection
    from django.db.migrations.loader import MigrationLoader

    django.setup()
    loader = MigrationLoader(connection)
    names = sorted(key[1] for key in loader.disk_migrations if key[0] == APP and key[1] >= args.first)
    if not names:
        raise BenchError(f"no cron_celery migration from {args.first} on (none after 0001_initial yet)")
    previous = next(dep for app, dep in loader.get_migration(APP, names[0]).dependencies if app == APP)
    log_machine(os.cpu_count(), os.getloadavg()[0], "slower")
    log(f"migrating {name} to {previous} ...")
    if migrate(previous) != "ran":
        raise BenchError(f"could not migrate to {previous}")
    log(f"loading {args.jobs:,} jobs and {args.rows:,} executions ...")
    job_id = load(args.jobs, args.rows)
    figures = measure(names, previous, job_id)
    loadavg = os.getloadavg()
    log(f"load average at the end: {loadavg[0]:.2f} {loadavg[1]:.2f} {loadavg[2]:.2f}")
    log("")
    log(table(figures, args.rows))
    write_results("migration-timings", started_at, {
        "started_at": started_at.isoformat(), "rows": args.rows, "jobs": args.jobs, "cpus": os.cpu_count(),
        "loadavg_end": loadavg, "migrations": figures}, args.json)
    return 0


def entry() -> None:
    run(main, what="migration timings failed")


if __name__ == "__main__":
    entry()
