"""Behind PgBouncer in transaction mode: a real ``pgbouncer`` (own config and port) in front of
the machine's PostgreSQL, round-robin over several server connections, so consecutive
statements of one client reach different sessions — as they do in production under load.

``pgbouncer`` comes from Debian's package of that name; the session fixture installs it when it
is missing, and fails — never skips — when it cannot.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection

from cron_celery import reconciler
from cron_celery.decisions import jobs as job_rows
from cron_celery.decisions import leadership
from cron_celery.models import CronExecution, Lease, Status
from tests.conftest import debian_tool, manage, marked, subprocess_env, wait_for
from tests.jobsapp.jobs_leader import clock_probe
from tests.redis_servers import free_port
from tests.test_claims import begin
from tests.workers import Worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
PGBOUNCER = "/usr/sbin/pgbouncer"
SERVERS = 4  # server connections the pool keeps, and rotates through


@pytest.fixture(scope="session")
def pgbouncer_binary() -> str:
    return debian_tool(PGBOUNCER, "pgbouncer", "the pooler tests")


@dataclass
class Bouncer:
    port: int
    log: Path

    @property
    def url(self) -> str:
        """``DATABASE_URL`` of the test database through the pooler (for child processes)."""
        db = connection.settings_dict
        return f"postgres://{db['USER']}@127.0.0.1:{self.port}/{db['NAME']}"

    def connect(self) -> psycopg.Connection[tuple[Any, ...]]:
        db = connection.settings_dict
        return psycopg.connect(dbname=db["NAME"], user=db["USER"], host="127.0.0.1", port=self.port, autocommit=True,
                               prepare_threshold=None)  # no prepared statements: the pool rotates sessions


@pytest.fixture
def pgbouncer(pgbouncer_binary: str) -> Iterator[Bouncer]:
    """A pgbouncer in transaction mode whose pool holds ``SERVERS`` server connections, used in turn."""
    db = connection.settings_dict
    workdir = Path(tempfile.mkdtemp(prefix="pgbouncer-"))
    workdir.chmod(0o755)  # pgbouncer drops root for "nobody", which must still read its config
    port = free_port()
    config = workdir / "pgbouncer.ini"
    config.write_text(
        "[databases]\n"
        f"* = host={db['HOST']} port={db['PORT']} user={db['USER']}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        "auth_type = any\npool_mode = transaction\nserver_round_robin = 1\n"
        f"default_pool_size = {SERVERS}\nmax_client_conn = 200\n"
        "ignore_startup_parameters = extra_float_digits\n"
    )
    config.chmod(0o644)
    log = workdir / "pgbouncer.log"
    command = [pgbouncer_binary, *(["-u", "nobody"] if os.geteuid() == 0 else []), str(config)]
    with open(log, "ab") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    bouncer = Bouncer(port=port, log=log)
    try:
        wait_for(lambda: _answers(bouncer) or proc.poll() is not None, timeout=30, what="pgbouncer to listen")
        assert proc.poll() is None, log.read_text(errors="replace")
        _fill_pool(bouncer)
        yield bouncer
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        with connection.cursor() as cursor:  # the pool's server connections to the test database
            cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                           " WHERE datname = current_database() AND pid <> pg_backend_pid()")
        shutil.rmtree(workdir, ignore_errors=True)


def _answers(bouncer: Bouncer) -> bool:
    try:
        with bouncer.connect() as probe:
            probe.execute("SELECT 1")
    except psycopg.OperationalError:
        return False
    return True


def _fill_pool(bouncer: Bouncer) -> None:
    """Open ``SERVERS`` server connections at once (each client in a transaction needs its own),
    so that the pool rotates through them from now on."""
    barrier = threading.Barrier(SERVERS)
    backends: set[int] = set()

    def hold() -> None:
        with bouncer.connect() as client, client.transaction():
            row = client.execute("SELECT pg_backend_pid()").fetchone()
            assert row is not None
            backends.add(int(row[0]))
            barrier.wait(timeout=20)

    threads = [threading.Thread(target=hold) for _ in range(SERVERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(backends) == SERVERS, backends


def sessions_seen(bouncer: Bouncer, statements: int) -> set[int]:
    """The server sessions (backend pids) that one client's consecutive statements reached."""
    seen: set[int] = set()
    with bouncer.connect() as client:
        for _ in range(statements):
            row = client.execute("SELECT pg_backend_pid()").fetchone()
            assert row is not None
            seen.add(int(row[0]))
    return seen


def test_reconciler_passes_keep_running_behind_pgbouncer_in_transaction_mode(pgbouncer):
    # The pooler really does hand one client's statements to several sessions.
    assert len(sessions_seen(pgbouncer, 2 * SERVERS)) > 1
    outputs = []
    for _ in range(6):
        result = manage("reconcile_cron", env=subprocess_env(DATABASE_URL=pgbouncer.url))
        assert result.returncode == 0, result.stdout + result.stderr
        outputs.append(result.stdout.strip())
    skipped = [out for out in outputs if "skipped" in out]
    assert not skipped, f"{len(skipped)} of 6 passes skipped behind the pooler: {outputs}"
    assert all(out.startswith("Reconciled: lost 0") for out in outputs), outputs
    # Every pass let go of its lease: a pass right here runs too.
    assert reconciler.run_pass().ran
    assert not Lease.objects.filter(name=reconciler.PASS_LEASE, lease_until__gt=leadership.database_now()).exists()


def test_a_worker_behind_pgbouncer_runs_jobs_and_keeps_reconciling(pgbouncer, tmp_path, marker):
    """The whole worker path (claim, lease thread, fenced outcome) and the reconciler's timer,
    every statement through the pooler: nothing relies on a session."""
    job_id = job_rows.job_id(clock_probe.job)
    worker = Worker(tmp_path, {"DATABASE_URL": pgbouncer.url, "CRON_TEST_RECONCILE_INTERVAL": "1"},
                    pool="prefork", concurrency=2).start()
    try:
        for minute in range(5):
            sent = manage("run_cron_task", "clock-probe", "--at", f"2026-11-29T01:{minute:02d}", "--enqueue",
                          env=subprocess_env(DATABASE_URL=pgbouncer.url))
            assert sent.returncode == 0, sent.stdout + sent.stderr
        wait_for(lambda: CronExecution.objects.filter(job_id=job_id, status=Status.SUCCEEDED).count() == 5,
                 timeout=60, what="the five enqueued runs")
        assert len([line for line in marked(marker) if line.startswith("clock-probe ")]) == 5
        # A run whose worker died (its lease ran out) long after the timer's first passes: a later
        # pass of the timer still runs and records it.
        dead = begin(clock_probe.job, job_id, slot=dt.datetime(2026, 11, 29, 2, tzinfo=dt.UTC))
        CronExecution.objects.filter(id=dead.execution_id).update(
            lease_until=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
        wait_for(lambda: CronExecution.objects.get(id=dead.execution_id).status == Status.LOST, timeout=30,
                 what="the worker's reconciler to record the dead run")
        assert "prepared statement" not in worker.output(), worker.output()[-3000:]
    finally:
        worker.stop()
