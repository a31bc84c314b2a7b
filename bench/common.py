"""What the benchmark scripts share: errors, output, the results file and the entry point."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


class BenchError(RuntimeError):
    pass


def log(text: str) -> None:
    print(text, flush=True)


def write_results(name: str, started_at: dt.datetime, payload: dict[str, Any], path: Path | None) -> None:
    """Write the run's figures as JSON to ``path`` or ``bench/results/NAME-<time>.json``."""
    out = path or ROOT / "bench" / "results" / f"{name}-{started_at:%Y%m%d-%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2, default=str) + "\n", encoding="utf-8")
    log(f"results written to {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")


def ensure_database(db: dict[str, Any]) -> bool:
    """Create the database named by a Django ``DATABASES`` entry when it is missing.

    Connects to the server's ``postgres`` database with the entry's host, port and
    credentials; returns whether the database was created.
    """
    import psycopg
    from psycopg import sql

    params: dict[str, Any] = {"host": db["HOST"], "port": db["PORT"], "user": db["USER"],
                              "dbname": "postgres", "connect_timeout": 5}
    if db.get("PASSWORD"):
        params["password"] = db["PASSWORD"]
    with psycopg.connect(autocommit=True, **params) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [db["NAME"]]).fetchone():
            return False
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(str(db["NAME"]))))
    log(f"created database {db['NAME']}")
    return True


def log_machine(cpus: int | None, load1: float, effect: str) -> None:
    """One line on the machine; ``effect`` says what a busy machine does to the figures."""
    busy = f"  (warning: the machine is busy; figures will be {effect})" if load1 > 0.7 else ""
    log(f"  {cpus} CPUs, load average {load1:.2f}{busy}")


def status_kib(text: str, field: str = "VmRSS") -> int | None:
    """A ``kB`` figure of a ``/proc/<pid>/status`` text (``VmRSS``: resident memory), or None."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == field:
            parts = value.split()
            return int(parts[0]) if parts and parts[0].isdigit() else None
    return None


def resident_mib(pid: int | str = "self") -> float | None:
    """A process's resident memory (``VmRSS``) in MiB; None when it is gone or /proc says nothing."""
    try:
        text = Path(f"/proc/{pid}/status").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    kib = status_kib(text)
    return None if kib is None else round(kib / 1024, 1)


def stop_on_sigterm() -> None:
    """Turn SIGTERM into KeyboardInterrupt, so that a script's ``finally`` blocks clean up."""

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)


def broker_client() -> tuple[str, Any]:
    """The broker's URL (``REDIS_URL``) and a client that has answered a ping."""
    import redis

    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    client = redis.Redis.from_url(url)
    client.ping()
    return url, client


def run(main: Callable[[], int], *, what: str = "benchmark failed", after: str = "") -> None:
    """Run a benchmark's ``main``; Ctrl-C or SIGTERM and BenchError end it with a message
    (``after`` is added to it)."""
    try:
        sys.exit(main())
    except KeyboardInterrupt as interrupted:  # the script's own finally blocks have cleaned up
        print(f"interrupted ({str(interrupted) or 'Ctrl-C'}){after}", file=sys.stderr)
        sys.exit(130)
    except BenchError as exc:
        print(f"{what}: {exc}{after}", file=sys.stderr)
        sys.exit(1)


# ------------------------------------------------------------------ the tracked-run tables


def clean_tracked_tables() -> None:
    """Empty the tables that tracked runs and django-celery-results write, then give the benchmark's
    tracked job (``bench.tracked_noop``, bench/tasks.py) its row again: it must exist before the
    first run (see the note on ``jobs.ensure_job`` in docs/benchmarks.md)."""
    from django.db import connection

    from cron_celery.decisions import jobs
    from cron_celery.declaring import registry

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE cron_celery_cronexecution, cron_celery_cronjob, "
                       "django_celery_results_taskresult RESTART IDENTITY CASCADE")
    jobs._job_ids.clear()
    job = registry.by_task_name("bench.tracked_noop")
    if job is None:
        raise BenchError("the job bench.tracked_noop is not declared (bench/tasks.py)")
    jobs.ensure_job(job)
    tracked_plain_code()


#: The periodic task of ``bench.noop`` that variant (v) of ``overhead.py`` runs as a tracked one.
TRACKED_PLAIN = "bench tracked plain noop"


def tracked_plain_code() -> str:
    """The job code of the benchmark's tracked periodic task (``bench.noop``, disabled: no beat sends
    it): the periodic task made once, its job row linked as ``TRACK_PERIODIC_TASKS`` links it."""
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    from cron_celery.decisions import tracked

    every_hour, _ = IntervalSchedule.objects.get_or_create(every=3600, period=IntervalSchedule.SECONDS)
    task, _ = PeriodicTask.objects.get_or_create(name=TRACKED_PLAIN, defaults={
        "task": "bench.noop", "interval": every_hour, "enabled": False})
    tracked.link([tracked.Candidate(periodic_task_id=task.id, name=task.name, task=task.task, timezone="UTC")],
                 source="bench")
    return tracked.code_for(task.id)


def count_rows(table: str, status: str) -> int:
    """Rows of ``table`` (executions or task results) with ``status``."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {table} WHERE status = %s", [status])
        row = cursor.fetchone()
    return int(row[0]) if row else 0


def setup_django() -> str:
    """Create the script's database if missing, set Django up and migrate it; returns its name."""
    import django
    from django.conf import settings
    from django.core.management import call_command

    created = ensure_database(dict(settings.DATABASES["default"]))
    django.setup()
    call_command("migrate", verbosity=0, interactive=False)
    if created:
        log("migrated it")
    return str(settings.DATABASES["default"]["NAME"])
