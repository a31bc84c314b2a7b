"""The executions table carries only the indexes a query uses: each index is written twice per run (the
claim's insert, the final write's update), so one that serves no query is pure cost. And the initial
migration, which makes them, runs forward and back on a database of its own to the same schema."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection

from tests.conftest import manage, subprocess_env
from tests.migration_steps import CATALOG

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


def test_the_initial_migration_runs_forward_and_back_to_the_same_schema(own_database: str) -> None:
    """Forwards it makes every table, index, function and trigger; backwards it leaves nothing of
    cron_celery (django-celery-beat's tables keep no trigger of ours); forwards again, the same schema."""
    settings = connection.settings_dict
    env = subprocess_env(CRON_CELERY_TEST_DB=own_database)

    def migrate(*target: str) -> None:
        done = manage("migrate", *target, "--no-input", env=env, timeout=180)
        assert done.returncode == 0, done.stdout + done.stderr

    def catalog() -> list[tuple[Any, ...]]:
        with psycopg.connect(host=settings["HOST"], port=settings["PORT"], user=settings["USER"],
                             password=settings["PASSWORD"] or None, dbname=own_database) as conn:
            return list(conn.execute(CATALOG).fetchall())

    migrate()
    made = catalog()
    assert set(_indexes_of(made)) == set(KEPT) | PARTIAL
    assert len([row for row in made if row[0].startswith("function cron_celery_")]) == 27
    assert len([row for row in made if row[0].startswith("trigger cron_celery_")]) == 15
    migrate("cron_celery", "zero")
    assert [row[0] for row in catalog() if "cron_celery" in " ".join(map(str, row))] == []
    migrate()
    assert catalog() == made


def _indexes_of(catalog: list[tuple[Any, ...]]) -> list[str]:
    return [str(row[0]).removeprefix("index ") for row in catalog
            if str(row[0]).startswith("index ") and f" ON public.{EXE} " in str(row[1])]
