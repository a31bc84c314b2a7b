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
import datetime as dt
import logging
import os
import platform
import sys
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make ``bench`` and ``cron_celery`` importable
    sys.path.insert(0, str(ROOT))

from bench.beat_scale_measure import measure, table  # noqa: E402
from bench.beat_scale_phases import MIN_IDLE_TICKS  # noqa: E402
from bench.beat_scale_stores import QUEUE, drop_queue, pg_version, reset_tables  # noqa: E402
from bench.beat_scale_tallies import LogTally, PublishLog  # noqa: E402
from bench.beat_scale_variants import CRON_VARIANTS, VARIANTS, CronCeleryVariant  # noqa: E402
from bench.common import (  # noqa: E402
    BenchError,
    broker_client,
    log,
    log_machine,
    run,
    setup_django,
    stop_on_sigterm,
    write_results,
)

#: Set by ``main`` (never at import: a test importing this module must not change its environment),
#: read when Django and Celery configure themselves (bench/beat_scale_settings.py, cron_celery.beat).
ENVIRONMENT = {"DJANGO_SETTINGS_MODULE": "bench.beat_scale_settings", "BENCH_DEFAULT_QUEUE": QUEUE,
               "CRON_CELERY_BEAT_ALWAYS_LEAD": "1"}

DEFAULT_SIZES = (10, 1000, 10_000)
QUICK_SIZES = (10, 1000)
#: The variants by their key, as ``--variants`` names them.
KNOWN = {variant.key: variant for variant in VARIANTS}


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



def build_parser() -> argparse.ArgumentParser:
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
    return parser


def checked_choices(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[tuple[int, ...], list[str]]:
    """The sizes to measure and the variants chosen; an option out of range ends the run (``parser.error``)."""
    sizes: tuple[int, ...] = args.sizes or (QUICK_SIZES if args.quick else DEFAULT_SIZES)
    if args.idle_ticks < MIN_IDLE_TICKS:
        parser.error(f"--idle-ticks must be at least {MIN_IDLE_TICKS}")
    if not 1 <= args.burst_cap <= 60:
        parser.error("--burst-cap is 1..60 seconds (the next minute's slots must not mix in)")
    chosen = [name.strip() for name in args.variants.split(",") if name.strip()]
    if not chosen or [name for name in chosen if name not in KNOWN]:
        parser.error(f"--variants takes some of {', '.join(KNOWN)}, not {args.variants!r}")
    return sizes, chosen


def run_settings(args: argparse.Namespace, sizes: tuple[int, ...], chosen: list[str], started_at: dt.datetime,
                 app: Any, redis_url: str, db_name: str) -> dict[str, Any]:
    """The run's settings and the software it measured, as the results' ``settings``."""
    from cron_celery import conf

    return {
        "date": started_at.strftime("%Y-%m-%d %H:%M UTC"), "sizes": list(sizes), "idle_ticks": args.idle_ticks,
        "burst_cap_s": args.burst_cap, "variants": chosen, "alone_from": args.alone_from, "queue": QUEUE,
        "broker": redis_url, "database": db_name,
        "postgresql": pg_version(), "beat_batch": conf.settings.BEAT_BATCH,
        "max_interval_s": app.conf.beat_max_loop_interval or 5, "cpus": os.cpu_count(),
        "loadavg": os.getloadavg(), **versions(),
    }


def log_settings(header: dict[str, Any], sizes: tuple[int, ...]) -> None:
    log(f"beat scale benchmark, {header['date']}: N = {', '.join(f'{n:,}' for n in sizes)}")
    log(f"  PostgreSQL {header['postgresql']} ({header['database']}), broker {header['broker']}, queue {QUEUE}")
    log(f"  Python {header['python']}, Django {header['django']}, Celery {header['celery']}, "
        f"django-celery-beat {header['django_celery_beat']}; cron_celery BEAT_BATCH={header['beat_batch']}")
    log_machine(header["cpus"], header["loadavg"][0], "noisy")


def measure_size(n: int, chosen: list[str], app: Any, client: redis.Redis, publishes: PublishLog,
                 logs: LogTally, args: argparse.Namespace) -> dict[str, Any]:
    """Every variant measured at ``n`` jobs (see ``measured_at``), by its key."""
    found: dict[str, Any] = {}
    for variant_cls in (KNOWN[name] for name in measured_at(n, chosen, args.alone_from)):
        variant = variant_cls(app, n)
        try:
            found[variant.key] = measure(variant, client, publishes, logs, args)
        finally:
            variant.teardown()
    return found


def log_tables(n: int, found: dict[str, Any]) -> None:
    """Each cron_celery variant measured at ``n`` beside DatabaseScheduler, if that was measured too."""
    for key in CRON_VARIANTS:
        if "dbs" not in found or key not in found:
            continue  # a table compares with DatabaseScheduler: see the JSON for the rest
        for line in table(n, found["dbs"], found[key]):
            log(line)
        log("")


def clean_up(client: redis.Redis, handlers: list[logging.Handler], logs: LogTally) -> None:
    """Empty the tables, delete the queue and take the log filter off, whatever happened."""
    with contextlib.suppress(Exception):
        reset_tables()
    drop_queue(client)
    for handler in handlers:
        handler.removeFilter(logs)
    left = list(client.scan_iter(match=f"*{QUEUE}*"))
    if left:
        log(f"warning: keys left in Redis: {left}")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    sizes, chosen = checked_choices(parser, args)

    os.environ.update(ENVIRONMENT)
    stop_on_sigterm()
    redis_url, client = broker_client()
    db_name = setup_django()

    import bench.tasks  # noqa: F401 - registers bench.noop, the DatabaseScheduler's task
    from bench.celery_app import app

    if app.conf.task_default_queue != QUEUE:
        raise BenchError(f"the default queue is {app.conf.task_default_queue}, not {QUEUE}")
    logs = LogTally()
    handlers = logging.getLogger("cron_celery").handlers
    for handler in handlers:
        handler.addFilter(logs)

    started_at = dt.datetime.now(dt.UTC)
    header = run_settings(args, sizes, chosen, started_at, app, redis_url, db_name)
    log_settings(header, sizes)

    results: dict[str, dict[str, Any]] = {}
    publishes = PublishLog(app)
    try:
        with publishes.installed():
            for n in sizes:
                results[str(n)] = measure_size(n, chosen, app, client, publishes, logs, args)
                log("")
                log_tables(n, results[str(n)])
    finally:
        clean_up(client, handlers, logs)

    write_results("beat_scale", started_at, {"settings": header, "results": results}, args.json)
    return 0


if __name__ == "__main__":
    run(main)
