"""Tracked periodic tasks of a django-tenants project whose tasks are tenant-schemas-celery's
``TenantTask``: a real beat and prefork worker of that project (tests/tenantproject), one periodic
task per tenant naming its schema in the ``_schema_name`` header, as tenant-schemas-celery's users
write them. Each slot is recorded once in the public schema, and its body runs once, in its
tenant's schema."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection

from tests.conftest import ROOT, subprocess_env, wait_for

pytestmark = [pytest.mark.slow]

SETTINGS = "tests.tenantproject.settings"
APP = "tests.tenantproject.celery_app"

#: The project's tenants and their periodic tasks, made in the project's own process.
SETUP = """
import json
import django
django.setup()
from django_celery_beat.models import IntervalSchedule, PeriodicTask
from tests.tenantproject.customers.models import Client

every = IntervalSchedule.objects.get_or_create(every=2, period=IntervalSchedule.SECONDS)[0]
for name in ("alpha", "beta"):
    Client.objects.create(schema_name=name, name=name.title())
    PeriodicTask.objects.create(name=f"notes of {name}", task="tenantproject.write_note", interval=every,
                                kwargs=json.dumps({"text": f"hello {name}"}),
                                headers=json.dumps({"_schema_name": name}))
"""


def _admin(dbname: str = "postgres") -> psycopg.Connection[Any]:
    options = connection.settings_dict
    return psycopg.connect(host=options["HOST"], port=options["PORT"], user=options["USER"],
                           password=options["PASSWORD"] or None, dbname=dbname, autocommit=True)


@pytest.fixture
def tenant_db() -> Iterator[str]:
    """The project's own database, made empty for the test and dropped after it."""
    name = f"{connection.settings_dict['NAME']}_tenants"[:63]
    with _admin() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    yield name
    with _admin() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "celery", "-A", APP, *args], cwd=ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _end(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def _rows(dbname: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with _admin(dbname) as db:
        return list(db.execute(sql, params).fetchall())


def test_tenant_tasks_tracked_by_one_setting_run_once_per_slot_in_their_tenants_schema(tmp_path, tenant_db):
    env = subprocess_env(DJANGO_SETTINGS_MODULE=SETTINGS, CRON_TEST_TENANT_DB=tenant_db,
                         CRON_CELERY_TEST_QUEUE=f"cron-celery-tenants-{uuid.uuid4().hex[:8]}")
    for step in (["-m", "django", "migrate_schemas", "--shared", "--noinput"], ["-c", SETUP]):
        done = subprocess.run([sys.executable, *step], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=180, check=False)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    worker_log, beat_log = tmp_path / "worker.log", tmp_path / "beat.log"
    node = f"tenants-{uuid.uuid4().hex[:6]}@localhost"
    worker = _start(["worker", "--pool", "prefork", "--concurrency", "2", "-n", node, "--without-gossip",
                     "--without-mingle", "--without-heartbeat", "--loglevel", "INFO"], env, worker_log)
    beat = None
    try:
        wait_for(lambda: " ready." in worker_log.read_text(errors="replace"), timeout=60, what="the worker")
        beat = _start(["beat", "-S", "cron_celery.beat.Scheduler", "--loglevel", "INFO", "--max-interval", "1",
                       "--pidfile", str(tmp_path / "beat.pid")], env, beat_log)

        def succeeded_each(count: int) -> bool:
            rows = _rows(tenant_db, "SELECT task_name, count(*) FROM cron_celery_cronexecution "
                                    "WHERE status = 'SUCCEEDED' GROUP BY task_name")
            return len(rows) == 2 and all(n >= count for _, n in rows)
        wait_for(lambda: succeeded_each(4), timeout=90,
                 what=f"four runs of each tenant's task\n{beat_log.read_text(errors='replace')[-3000:]}"
                      f"\n{worker_log.read_text(errors='replace')[-3000:]}")
        _end(beat)
        wait_for(lambda: not _rows(tenant_db, "SELECT 1 FROM cron_celery_cronexecution "
                                              "WHERE status IN ('PENDING', 'RUNNING', 'RETRYING')"),
                 timeout=60, what="the sent slots to end")
    finally:
        if beat is not None:
            _end(beat)
        _end(worker, signal.SIGKILL)
    output = worker_log.read_text(errors="replace")
    assert "Traceback" not in output, output[-4000:]
    jobs = dict(_rows(tenant_db, "SELECT task.name, job.id FROM cron_celery_cronjob AS job "
                                 "JOIN django_celery_beat_periodictask AS task ON task.id = job.periodic_task_id "
                                 "WHERE task.task = 'tenantproject.write_note'"))
    assert set(jobs) == {"notes of alpha", "notes of beta"}
    for tenant in ("alpha", "beta"):
        runs = _rows(tenant_db, "SELECT id, slot, status, result FROM cron_celery_cronexecution WHERE job_id = %s",
                     jobs[f"notes of {tenant}"])
        assert {status for _, _, status, _ in runs} == {"SUCCEEDED"}, runs
        assert len({slot for _, slot, _, _ in runs}) == len(runs) >= 4
        notes = _rows(tenant_db, f'SELECT execution_id, schema, text FROM "{tenant}".notes_note')
        # One note per slot's execution, written in the tenant's own schema by the body run once.
        assert sorted(execution_id for execution_id, _, _ in notes) == sorted(run_id for run_id, _, _, _ in runs)
        assert {(schema, text) for _, schema, text in notes} == {(tenant, f"hello {tenant}")}
        assert all(str(result).startswith(f"{tenant}:") for _, _, _, result in runs), runs
    assert not _rows(tenant_db, "SELECT 1 FROM information_schema.tables WHERE table_schema = 'public' "
                                "AND table_name = 'notes_note'")
