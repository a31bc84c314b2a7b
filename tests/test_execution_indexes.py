"""The executions table carries only the indexes a query uses (migration 0022): each index is
written twice per run (the claim's insert, the final write's update), so one that serves no
query is pure cost. The migration runs forward and back on a database of its own, with rows in it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection

from tests.conftest import manage, subprocess_env

EXE = "cron_celery_cronexecution"

#: What the model asks for, by definition (pg_indexes.indexdef without the schema and name).
KEPT = {
    "cron_celery_cronexecution_pkey": "UNIQUE INDEX ON cron_celery_cronexecution USING btree (id)",
    "cron_execution_once_per_run": "UNIQUE INDEX ON cron_celery_cronexecution USING btree (job_id, slot, run_number)",
    "cron_exec_code_date": "INDEX ON cron_celery_cronexecution USING btree (task_code, execution_date)",
    "cron_exec_code_ok_date": "INDEX ON cron_celery_cronexecution USING btree (task_code, success, execution_date)",
    "cron_exec_completed": "INDEX ON cron_celery_cronexecution USING btree (completed)",
    "cron_exec_job_status": "INDEX ON cron_celery_cronexecution USING btree (job_id, status)",
}
#: What 0022 drops: pattern twins of three columns, two columns a wider index leads with, and two
#: only ever searched with icontains.
DROPPED = {
    "cron_celery_cronexecution_celery_task_id_5fae1482",
    "cron_celery_cronexecution_celery_task_id_5fae1482_like",
    "cron_celery_cronexecution_task_code_df32618a",
    "cron_celery_cronexecution_task_code_df32618a_like",
    "cron_celery_cronexecution_task_name_684de7d4",
    "cron_celery_cronexecution_task_name_684de7d4_like",
    "cron_celery_cronexecution_job_id_b8dc483b",
}
PARTIAL = {"cron_exec_one_off_due", "cron_exec_late_unalerted", "cron_exec_long_unalerted"}


def _indexes(cursor: Any) -> dict[str, str]:
    cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s", [EXE])
    return {str(name): str(definition).replace(f" {name} ", " ").replace("CREATE ", "").replace("public.", "")
            for name, definition in cursor.fetchall()}


@pytest.mark.django_db
def test_the_executions_table_has_only_the_indexes_queries_use() -> None:
    with connection.cursor() as cursor:
        found = _indexes(cursor)
    assert {name: found.get(name) for name in KEPT} == KEPT
    assert set(found) == set(KEPT) | PARTIAL, "an index nobody declared, or one declared twice"
    assert not [name for name in found if name.endswith("_like")]


@pytest.mark.django_db
def test_the_execution_lookups_still_use_an_index_after_the_drop() -> None:
    """The columns whose own index went are still found through the wider ones: with sequential
    scans turned off, the planner has an index path for each."""
    plans = {}
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # inside the test's transaction
        for what, where in (("job", "job_id = 1"), ("code", "task_code = 'X'")):
            cursor.execute(f"EXPLAIN SELECT id FROM {EXE} WHERE {where}")
            plans[what] = " ".join(str(row[0]) for row in cursor.fetchall())
    assert "cron_execution_once_per_run" in plans["job"] or "cron_exec_job_status" in plans["job"], plans["job"]
    assert "cron_exec_code_date" in plans["code"] or "cron_exec_code_ok_date" in plans["code"], plans["code"]


@pytest.fixture
def own_database(django_db_blocker: object) -> Iterator[str]:
    """An empty database of this test's own on the test server, dropped afterwards."""
    settings = connection.settings_dict
    name = f"{settings['NAME']}_idx_{uuid.uuid4().hex[:8]}"
    conninfo = dict(host=settings["HOST"], port=settings["PORT"], user=settings["USER"],
                    password=settings["PASSWORD"] or None, dbname="postgres", autocommit=True)
    with psycopg.connect(**conninfo) as admin:  # type: ignore[arg-type]
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        with psycopg.connect(**conninfo) as admin:  # type: ignore[arg-type]
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _models_at(migration: str) -> str:
    """Shell code that binds ``m`` to the app's models as of ``migration`` (its historical state)."""
    return ("import types; from django.db import connection; from django.db.migrations.loader import MigrationLoader; "
            f"apps = MigrationLoader(connection).project_state(('cron_celery', '{migration}')).apps; "
            "m = types.SimpleNamespace(CronJob=apps.get_model('cron_celery', 'CronJob'), "
            "CronExecution=apps.get_model('cron_celery', 'CronExecution'))")


def test_the_migration_runs_forward_and_back_with_rows_in_the_table(own_database: str) -> None:
    settings = connection.settings_dict
    env = subprocess_env(CRON_CELERY_TEST_DB=own_database)

    def migrate(target: str) -> None:
        done = manage("migrate", "cron_celery", target, "--no-input", env=env, timeout=180)
        assert done.returncode == 0, done.stdout + done.stderr

    def indexes() -> dict[str, str]:
        with psycopg.connect(host=settings["HOST"], port=settings["PORT"], user=settings["USER"],
                             password=settings["PASSWORD"] or None, dbname=own_database) as conn:
            return _indexes(conn.cursor())

    migrate("0021")
    before = indexes()
    assert set(before) >= DROPPED, sorted(before)
    # The models of 0021's state, not today's: later migrations add columns this table lacks yet.
    rows = manage("shell", "-c", (
        f"import datetime as dt; from django.utils import timezone; {_models_at('0021_schedule_audit')}; "
        "job = m.CronJob.objects.create(name='j', code='J'); "
        "m.CronExecution.objects.bulk_create(m.CronExecution(job=job, task_code='J', task_name='j', "
        "slot=timezone.now() - dt.timedelta(minutes=n), execution_date=dt.date.today(), status='SUCCEEDED', "
        "completed=True, celery_task_id=f'task-{n}') for n in range(50)); "
        "print(m.CronExecution.objects.count())"), env=env)
    assert rows.stdout.strip().splitlines()[-1:] == ["50"], rows.stdout + rows.stderr

    migrate("0022")
    after = indexes()
    assert not DROPPED & set(after)
    assert set(after) == set(KEPT) | PARTIAL

    migrate("0021")
    assert indexes() == before, "the way back restores every index, definitions included"

    migrate("0022")
    assert indexes() == after
    assert manage("shell", "-c", f"{_models_at('0022_fewer_execution_indexes')}; "
                  "print(m.CronExecution.objects.filter(celery_task_id='task-7').count())",
                  env=env).stdout.strip().splitlines()[-1:] == ["1"]
