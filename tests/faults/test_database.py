"""The database goes away under running jobs: real ``celery worker`` processes (and a real beat)
whose PostgreSQL sessions are ended (``pg_terminate_backend``) or whose PostgreSQL server is
restarted. Runs in flight record their outcome once the database answers again, or are
reconciled; no body runs twice.

Only this test's own database is touched on the machine's server (its sessions are ended,
never anybody else's); the restart tests run a PostgreSQL cluster of their own
(``tests.pg_servers``).
"""

from __future__ import annotations

import datetime as dt
import itertools
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from cron_celery.models import CronExecution, CronJob, Status, Trigger
from cron_celery.run import tasks
from tests.celery_app import app  # noqa: F401 - the app that send_run publishes through
from tests.conftest import db_now, manage, marked, subprocess_env, wait_for
from tests.faults.test_beat import beat_log, start_beat, stop
from tests.jobsapp.jobs_database import db_gated
from tests.pg_servers import PostgresServer
from tests.workers import Worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
LEASE = 6  # seconds: a heartbeat every 2 s


def end_other_sessions() -> int:
    """``pg_terminate_backend`` on every other session of this test's own database (the workers'
    connections); never a session of another database."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
                       " WHERE datname = current_database() AND pid <> pg_backend_pid()")
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])


def bodies(marker: Path) -> Counter[str]:
    return Counter(line.split()[0] for line in marked(marker))


def test_a_worker_whose_connections_are_ended_mid_run_reconnects_and_records_the_outcome_once(tmp_path, marker):
    """The run's session and the lease thread's are ended while the body runs: the heartbeat
    renews the lease on a new connection, and the final write reconnects and records the
    outcome — once, with no second attempt (the reconciler runs every second meanwhile)."""
    gate = tmp_path / "gate"
    env = {"CRON_TEST_MARKER": str(marker), "CRON_TEST_GATE": str(gate), "CRON_TEST_LEASE_SECONDS": str(LEASE),
           "CRON_TEST_LOCK_TTL": str(LEASE),
           "CRON_TEST_RECONCILE_INTERVAL": "1"}
    worker = Worker(tmp_path, env, pool="prefork", concurrency=1).start()
    try:
        sent = tasks.send_run(db_gated.job, dt.datetime(2030, 1, 1, tzinfo=dt.UTC), Trigger.ENQUEUE)
        wait_for(lambda: bodies(marker)["db-gated-start"] == 1, timeout=60, what="the body to start")
        claimed = CronExecution.objects.get(id=sent.execution_id).lease_until
        wait_for(lambda: CronExecution.objects.get(id=sent.execution_id).lease_until != claimed, timeout=30,
                 what="the lease thread's first renewal (its own session)")
        cut = db_now()
        assert end_other_sessions() >= 2, "the worker's sessions were not there to end"
        # The heartbeat reconnects: the lease is renewed after the cut, on a new session.
        wait_for(lambda: CronExecution.objects.get(id=sent.execution_id).lease_until
                 > cut + dt.timedelta(seconds=LEASE + 1), timeout=30, what="a lease renewed after the cut")
        gate.touch()
        wait_for(lambda: CronExecution.objects.get(id=sent.execution_id).completed, timeout=60,
                 what="the outcome to be recorded")
        # Two lease periods more with the reconciler running: nothing changes any more.
        done = db_now()
        wait_for(lambda: db_now() > done + dt.timedelta(seconds=2 * LEASE), timeout=60, what="time to pass")
    finally:
        worker.stop()
    row = CronExecution.objects.get(id=sent.execution_id)
    ran = bodies(marker)
    assert (row.status, row.retry_count, row.attempts) == (Status.SUCCEEDED, 0, []), (
        row.status, row.retry_count, row.attempts, row.message, ran, worker.output()[-3000:])
    assert ran == Counter({"db-gated-start": 1, "db-gated-end": 1}), ran
    job = CronJob.objects.get(id=row.job_id)
    assert (job.fenced_count, job.consecutive_failures, job.last_status) == (0, 0, Status.SUCCEEDED)


def own_rows(server: PostgresServer, database: str) -> list[tuple[Any, ...]]:
    """(slot, status, trigger, run_number, retry_count, completed) of db-steady's rows, by slot."""
    with server.connect(database) as conn:
        return conn.execute(
            "SELECT e.slot, e.status, e.trigger, e.run_number, e.retry_count, e.completed"
            " FROM cron_celery_cronexecution e JOIN cron_celery_cronjob j ON j.id = e.job_id"
            " WHERE j.code = 'DB03' ORDER BY e.slot, e.run_number"
        ).fetchall()


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_postgresql_restarted_while_jobs_run_loses_and_doubles_nothing(tmp_path, marker, mode):
    """A PostgreSQL of the test's own, a real beat and a real worker running an every-2-seconds
    job that takes 3 s (catch-up ``all``): the server is stopped (``fast``: sessions ended;
    ``immediate``: a crash) for 4 s while runs are in flight, then started again. The runs in
    flight record their outcome once it is back, the beat dispatches the outage's slots late
    (catch-up ``all``) and goes on; every slot has one row, SUCCEEDED, and its body ran once."""
    database = f"cc_restart_{os.getpid()}_{mode}"
    server = PostgresServer().start()  # in the system temporary directory: the postgres user must reach it
    try:
        server.create_database(database)
        env = {"DATABASE_URL": server.url(database), "CRON_CELERY_TEST_DB": database,
               "CRON_TEST_MARKER": str(marker),
               "CRON_TEST_LEASE_SECONDS": "15", "CRON_TEST_LOCK_TTL": "15", "CRON_TEST_BEAT_LEASE_SECONDS": "6",
               "CRON_TEST_RECONCILE_INTERVAL": "1", "CRON_TEST_SLEEP": "3"}
        migrated = manage("migrate", "--no-input", env=subprocess_env(**env), timeout=300)
        assert migrated.returncode == 0, migrated.stdout + migrated.stderr
        worker = Worker(tmp_path, env, pool="prefork", concurrency=3)
        beat = None
        try:
            worker.start()
            beat = start_beat(tmp_path, env, 0)
            wait_for(lambda: "schedules synced" in beat_log(tmp_path, 0) or beat.poll() is not None, timeout=60,
                     what="the beat's start-up sync")
            made = manage("shell", "-c", "from cron_celery.decisions import jobs; "
                          "from tests.jobsapp.jobs_database import db_steady; jobs.job_id(db_steady.job)",
                          env=subprocess_env(**env))
            assert made.returncode == 0, made.stdout + made.stderr
            with server.connect(database) as conn:  # this job alone, every 2 s
                conn.execute("UPDATE cron_celery_cronjob SET paused = true, next_run_at = NULL WHERE code <> 'DB03'")
                conn.execute("UPDATE cron_celery_cronjob SET schedule = 'every 2s', timezone = 'UTC', catch_up = 'all',"
                             " paused = false, next_run_at = to_timestamp(ceil(extract(epoch FROM now()) / 2) * 2 + 2)"
                             " WHERE code = 'DB03'")
            wait_for(lambda: sum(row[1] == Status.SUCCEEDED for row in own_rows(server, database)) >= 3
                     and any(row[1] == Status.RUNNING for row in own_rows(server, database)), timeout=90,
                     what="three runs done and one in flight")
            in_flight = [row[0] for row in own_rows(server, database) if row[1] == Status.RUNNING]
            server.restart(mode, down_for=4)
            up = db_now_of(server, database)
            wait_for(lambda: sum(row[1] == Status.SUCCEEDED and row[0] > up + dt.timedelta(seconds=4)
                                 for row in own_rows(server, database)) >= 3, timeout=120,
                     what="the beat to go on after the restart")
            stop(beat)
            wait_for(lambda: all(row[5] for row in own_rows(server, database)), timeout=120,
                     what="every dispatched run to end")
            rows = own_rows(server, database)
        finally:
            if beat is not None:
                stop(beat)
            worker.stop()
    finally:
        server.close()
    slots = [row[0] for row in rows]
    assert len(slots) == len(set(slots)) and {row[3] for row in rows} == {1}, "a slot has two rows"
    gaps = {(b - a).total_seconds() for a, b in itertools.pairwise(slots)}
    assert gaps == {2.0}, f"slots missing: {gaps}"
    outcome = Counter((row[1], row[4]) for row in rows)
    assert outcome == Counter({(Status.SUCCEEDED, 0): len(rows)}), (outcome, in_flight, worker.output()[-4000:])
    assert any(row[2] == Trigger.CATCH_UP for row in rows), "the outage's slots were not caught up"
    starts = Counter(line.split()[1] for line in marked(marker) if line.startswith("db-steady-start"))
    ends = Counter(line.split()[1] for line in marked(marker) if line.startswith("db-steady-end"))
    assert set(starts.values()) == {1} and starts == ends, f"bodies run twice or cut short: {starts - ends}"
    assert len(starts) == len(rows)


def db_now_of(server: PostgresServer, database: str) -> dt.datetime:
    with server.connect(database) as conn:
        row = conn.execute("SELECT now()").fetchone()
    assert row is not None and isinstance(row[0], dt.datetime)
    return row[0]
