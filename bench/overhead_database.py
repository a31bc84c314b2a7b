"""What ``bench/overhead.py`` measures in its own process, against PostgreSQL: the benchmark's
database made ready, the server's settings, the SQL statements and transactions of a tracked run
and of a django-db result write, what waiting for each commit costs, and one WAL flush on this
machine (pg_test_fsync). Django is imported only inside the functions, once the entry module has
set its settings.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import itertools
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench import overhead_figures
from bench.common import BenchError, clean_tracked_tables
from bench.common import ensure_database as create_database
from bench.overhead_variants import SLOT_BASE


def ensure_database() -> str:
    """Create the benchmark's database when missing; returns its name."""
    from bench import settings as bench_settings

    db: dict[str, Any] = bench_settings.DATABASES["default"]
    create_database(db)
    return str(db["NAME"])


def setup_django() -> None:
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0, interactive=False)


def status_counts(table: str) -> dict[str, int]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"SELECT status, count(*) FROM {table} GROUP BY status")
        return {str(status): int(count) for status, count in cursor.fetchall()}


def server_facts() -> dict[str, str]:
    from django.db import connection

    facts = {}
    with connection.cursor() as cursor:
        for name in ("server_version", "synchronous_commit", "fsync", "shared_buffers"):
            cursor.execute("SELECT current_setting(%s)", [name])
            row = cursor.fetchone()
            facts[name] = str(row[0]) if row else "?"
    return facts


# ------------------------------------------------------------------ statement counting


@dataclasses.dataclass
class SqlCount:
    statements: int = 0
    commits: int = 0
    rollbacks: int = 0
    kinds: Counter[str] = dataclasses.field(default_factory=Counter)

    def minus(self, other: SqlCount) -> SqlCount:
        return SqlCount(self.statements - other.statements, self.commits - other.commits,
                        self.rollbacks - other.rollbacks, self.kinds - other.kinds)

    def copy(self) -> SqlCount:
        return SqlCount(self.statements, self.commits, self.rollbacks, Counter(self.kinds))


_KIND = re.compile(r"^\s*(\w+)(?:.*?\b(?:UPDATE|INTO|FROM)\s+\"?(\w+))?", re.S | re.I)


def _kind(statement: str) -> str:
    found = _KIND.match(statement)
    if found is None:
        return statement.split(None, 1)[0] if statement.strip() else "?"
    verb, table = found.group(1).upper(), found.group(2)
    if verb == "UPDATE":  # "UPDATE <table>": the table follows the verb directly
        table = statement.split()[1].strip('"')
    return f"{verb} {table}" if table else verb


@contextlib.contextmanager
def counting_sql() -> Iterator[SqlCount]:
    """Count the statements Django sends (``execute_wrapper``) and its commits/rollbacks."""
    from django.db import connections

    conn = connections["default"]
    count = SqlCount()

    def wrapper(execute: Callable[..., Any], statement: str, params: Any, many: bool,
                context: Any) -> Any:
        count.statements += 1
        count.kinds[_kind(statement)] += 1
        return execute(statement, params, many, context)

    real_commit, real_rollback = conn.commit, conn.rollback

    def commit() -> None:
        count.commits += 1
        real_commit()

    def rollback() -> None:
        count.rollbacks += 1
        real_rollback()

    setattr(conn, "commit", commit)  # noqa: B010 - shadow the bound method on this instance
    setattr(conn, "rollback", rollback)  # noqa: B010
    try:
        with conn.execute_wrapper(wrapper):
            yield count
    finally:
        delattr(conn, "commit")
        delattr(conn, "rollback")


def count_statements(runs: int) -> dict[str, Any]:
    """Statements per tracked run (task called directly) and per django-db result write."""
    from django_celery_results.backends.database import DatabaseBackend

    from bench import tasks
    from bench.celery_app import app
    from cron_celery.decisions import jobs as cron_jobs

    clean_tracked_tables()
    cron_jobs._job_ids.clear()  # the job's row was just truncated: the first run creates it
    per_run: list[SqlCount] = []
    with counting_sql() as count:
        for i in range(runs):
            before = count.copy()
            outcome = tasks.tracked_noop(slot=(SLOT_BASE + dt.timedelta(minutes=i)).isoformat())
            if outcome["status"] != "SUCCEEDED":
                raise BenchError(f"in-process tracked run {i} ended {outcome}")
            per_run.append(count.minus(before))
    steady = per_run[1:] or per_run
    tracked = {
        "runs": runs,
        "first_run_statements": per_run[0].statements,
        "first_run_kinds": dict(per_run[0].kinds),
        "statements_per_run": statistics.mean(c.statements for c in steady),
        "transactions_per_run": statistics.mean(c.commits for c in steady),
        "rollbacks": sum(c.rollbacks for c in per_run),
        "kinds_per_run": dict(steady[-1].kinds),
        "total_statements": count.statements,
    }

    backend = DatabaseBackend(app=app)
    writes: list[SqlCount] = []
    with counting_sql() as count:
        for _ in range(runs):
            before = count.copy()
            backend.mark_as_done(uuid.uuid4().hex, None)
            writes.append(count.minus(before))
    results = {
        "writes": runs,
        "statements_per_task": statistics.mean(c.statements for c in writes),
        "transactions_per_task": statistics.mean(c.commits for c in writes),
        "kinds_per_task": dict(writes[-1].kinds),
    }
    clean_tracked_tables()
    cron_jobs._job_ids.clear()
    return {"tracked": tracked, "results": results, "commit_cost": time_commits(max(runs, 1000))}


def time_commits(runs: int) -> dict[str, float]:
    """Milliseconds per tracked run (the task called directly) and per django-db result write,
    in this process, with PostgreSQL's ``synchronous_commit`` on (as measured above) and, for
    reference only, off: the difference is what waiting for each commit's WAL flush costs."""
    from django.db import connection
    from django_celery_results.backends.database import DatabaseBackend

    from bench import tasks
    from bench.celery_app import app
    from cron_celery.decisions import jobs as cron_jobs

    backend = DatabaseBackend(app=app)
    slots = itertools.count()

    def tracked() -> None:
        tasks.tracked_noop(slot=(SLOT_BASE + dt.timedelta(minutes=next(slots))).isoformat())

    def result() -> None:
        backend.mark_as_done(uuid.uuid4().hex, None)

    def wal_position() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')")
            return int(cursor.fetchone()[0])

    def per_call(call: Callable[[], None]) -> tuple[float, float]:
        """Milliseconds and bytes of WAL per call (the WAL of the whole server: run it quiet)."""
        for _ in range(10):  # warm: connection open, statements prepared
            call()
        wal = wal_position()
        started = time.perf_counter()
        for _ in range(runs):
            call()
        return (time.perf_counter() - started) * 1000 / runs, (wal_position() - wal) / runs

    figures: dict[str, float] = {}
    try:
        for mode in ("on", "off"):
            with connection.cursor() as cursor:
                cursor.execute(f"SET synchronous_commit = {mode}")
            suffix = "" if mode == "on" else "_async_commit"
            figures[f"tracked_ms{suffix}"], figures[f"tracked_wal_bytes{suffix}"] = per_call(tracked)
            figures[f"results_ms{suffix}"], figures[f"results_wal_bytes{suffix}"] = per_call(result)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET synchronous_commit")
        clean_tracked_tables()
        cron_jobs._job_ids.clear()
    return figures


# ----------------------------------------------------------------------------- fsync


def pg_test_fsync(server_version: str) -> str | None:
    """The server's own pg_test_fsync (Debian's /usr/lib/postgresql/<major>/bin), else any."""
    major = server_version.split(".", 1)[0].split(None, 1)[0]
    candidates = [Path(f"/usr/lib/postgresql/{major}/bin/pg_test_fsync"),
                  *sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_test_fsync"), reverse=True)]
    for path in candidates:
        if path.exists():
            return str(path)
    return shutil.which("pg_test_fsync")


def measure_fsync(seconds: int) -> dict[str, Any]:
    """One WAL flush on this machine: pg_test_fsync on a file beside PostgreSQL's data directory
    (same filesystem), the figure of the server's ``wal_sync_method``. ``measured`` is False,
    with ``why``, where it cannot be (a server elsewhere, no pg_test_fsync, no rights)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('wal_sync_method'), current_setting('server_version'), "
                       "current_setting('data_directory', true), inet_server_addr()::text")
        method, version, data_dir, address = cursor.fetchone()
    facts: dict[str, Any] = {"method": method, "data_directory": data_dir, "seconds_per_test": seconds}
    tool = pg_test_fsync(str(version))
    parent = Path(data_dir).parent if data_dir else None
    if tool is None:
        return {**facts, "measured": False, "why": "pg_test_fsync is not installed"}
    if parent is None or not parent.is_dir() or not os.access(parent, os.W_OK):
        return {**facts, "measured": False,
                "why": f"the data directory ({data_dir or 'not readable'}) is not on a filesystem this process can "
                       f"write to (server at {address or 'a socket'})"}
    scratch = Path(tempfile.mkdtemp(prefix="cron-celery-fsync-", dir=parent))
    try:
        done = subprocess.run([tool, "-s", str(seconds), "-f", str(scratch / "test.out")],
                              capture_output=True, text=True, timeout=60 * seconds + 120, check=False)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if done.returncode != 0:
        return {**facts, "measured": False, "why": f"pg_test_fsync failed: {done.stderr.strip()[:300]}"}
    parsed = overhead_figures.parse_pg_test_fsync(done.stdout)
    usecs = parsed["usecs_per_op"].get(str(method))
    if usecs is None:
        return {**facts, "measured": False, "why": f"pg_test_fsync gave no figure for {method}", **parsed}
    return {**facts, "measured": True, "tool": tool, "directory": str(parent), "usecs": usecs, **parsed}
