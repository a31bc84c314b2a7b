"""cron_celery's migrations one operation at a time, for tests/test_migration_rules.py.

Imported, it says what a migration sends to PostgreSQL (``sent``: what ``manage.py sqlmigrate`` prints).
Run in a child process on an empty database of its own, it checks two things a migration under the
lock_timeout rule must do, and prints them as one JSON line:

    DJANGO_SETTINGS_MODULE=tests.settings CRON_CELERY_TEST_DB=<db> python -m tests.migration_steps cuts APP NAME...
    DJANGO_SETTINGS_MODULE=tests.settings CRON_CELERY_TEST_DB=<db> python -m tests.migration_steps lock APP NAME

``cuts``: for each migration, as if it had stopped after each of its operations (its lock_timeout ran
out there), forwards and backwards, ``migrate`` runs it again to the end; and the schema, migrated to the
newest state afterwards, is the one a plain ``migrate`` made. ``lock``: while another session holds a
lock on the jobs and executions tables, the migration fails on its lock_timeout (forwards, then
backwards) instead of waiting, and runs once the lock is gone.
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any

APP = "cron_celery"
#: The app of tests/migration_example (installed where CRON_TEST_MIGRATION_EXAMPLE is set).
EXAMPLE, EXAMPLE_MODULE = "cron_celery_example", "tests.migration_example"
TABLES = ("cron_celery_cronjob", "cron_celery_cronexecution")

#: The schema as text rows: each table's columns in their order, indexes, constraints, triggers, functions.
#: The schema as a comparable list. Columns by name, not position: a column dropped and added again
#: comes last, and two apps' columns on one table (the example app's) come in the order they ran.
CATALOG = """
SELECT 'columns ' || c.relname, string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
       || CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END
       || coalesce(' DEFAULT ' || pg_get_expr(d.adbin, d.adrelid), ''), ', ' ORDER BY a.attname)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'public'
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
WHERE c.relkind = 'r' GROUP BY c.relname
UNION ALL SELECT 'index ' || indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'
UNION ALL SELECT 'constraint ' || conname, pg_get_constraintdef(oid) FROM pg_constraint
          WHERE connamespace = 'public'::regnamespace
UNION ALL SELECT 'trigger ' || tgname, pg_get_triggerdef(oid) FROM pg_trigger WHERE NOT tgisinternal
UNION ALL SELECT 'function ' || oid::regprocedure::text, md5(pg_get_functiondef(oid)) FROM pg_proc
          WHERE pronamespace = 'public'::regnamespace
ORDER BY 1
"""


def sent(name: str, *, backwards: bool = False, app: str = APP) -> list[str]:
    """What ``migrate`` sends for migration ``name`` of ``app``, one item per execute(), without Django's
    comments. The example app's migrations (``EXAMPLE``) are read from their files where the app is not
    installed: they send SQL only, so they need no models' state."""
    from django.db import connection
    from django.db.migrations.loader import MigrationLoader
    from django.db.migrations.state import ProjectState

    loader = MigrationLoader(connection)
    if (app, name) in loader.graph.nodes:
        migration = loader.get_migration(app, name)
        state = loader.project_state((app, name), at_end=False)
    else:
        assert app == EXAMPLE, f"no migration {app}.{name}"
        migration = importlib.import_module(f"{EXAMPLE_MODULE}.migrations.{name}").Migration(name, app)
        state = ProjectState()
    with connection.schema_editor(collect_sql=True, atomic=migration.atomic) as editor:
        if backwards:
            migration.unapply(state, editor, collect_sql=True)
        else:
            migration.apply(state, editor, collect_sql=True)
    return [item.strip() for item in editor.collected_sql if item.strip() and not _django_comment(item)]


def _django_comment(item: str) -> bool:
    """The lines ``sqlmigrate`` writes around each operation ("--", "-- Add field ...", "-- (no-op)")."""
    return "\n" not in item.strip() and item.strip().startswith("--")


def previous(app: str, name: str) -> str:
    """The migration of ``app`` that ``name`` follows ("zero": the app's first)."""
    from django.db import connection
    from django.db.migrations.loader import MigrationLoader

    migration = MigrationLoader(connection).get_migration(app, name)
    return next((dependency for label, dependency in migration.dependencies if label == app), "zero")


def _run_part(app: str, name: str, done: int, *, backwards: bool) -> None:
    """Forwards: run the first ``done`` operations of ``name``. Backwards: undo all but the first
    ``done`` (an undo that stopped there). As a migration that failed part way, it is not recorded."""
    from django.db import connection
    from django.db.migrations.loader import MigrationLoader

    loader = MigrationLoader(connection)
    migration = loader.get_migration(app, name)
    head: Any = type(migration)(name, app)
    tail: Any = type(migration)(name, app)
    head.operations, tail.operations = migration.operations[:done], migration.operations[done:]
    before = loader.project_state((app, name), at_end=False)
    with connection.schema_editor(atomic=migration.atomic) as editor:
        if backwards:
            tail.unapply(head.mutate_state(before), editor)
        else:
            head.apply(before.clone(), editor)


def _migrate(target: str | None, app: str = APP) -> str:
    """``migrate APP TARGET`` (None: ``migrate``, every app): "ran", or the error it ended with."""
    from django.core.management import call_command

    try:
        call_command("migrate", *([app, target] if target else []), verbosity=0, interactive=False)
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).strip()}"
    return "ran"


def _catalog() -> list[list[str]]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(CATALOG)
        return [[str(value) for value in row] for row in cursor.fetchall()]


def cuts(app: str, names: list[str]) -> dict[str, Any]:
    """Each migration stopped after each operation, then run again: the ones that did not run again."""
    from django.db import connection
    from django.db.migrations.loader import MigrationLoader

    _migrate(None)
    newest = MigrationLoader(connection).graph.leaf_nodes(app)[0][1]
    reference = _catalog()
    failed = []
    for name in names:
        count = len(MigrationLoader(connection).get_migration(app, name).operations)
        before = previous(app, name)
        _migrate(before, app)
        for done in range(2, count):  # after the first operation (lock_timeout set) up to before the last
            _run_part(app, name, done, backwards=False)
            if (result := _migrate(name, app)) != "ran":
                failed.append(f"{name} forwards, stopped after {done} of {count} operations: {result}")
                return {"failed": failed, "same_schema": None}
            _run_part(app, name, count - done, backwards=True)
            if (result := _migrate(before, app)) != "ran":
                failed.append(f"{name} backwards, stopped after undoing {done} of {count}: {result}")
                return {"failed": failed, "same_schema": None}
        _migrate(name, app)
    _migrate(newest, app)
    return {"failed": failed, "same_schema": _catalog() == reference}


def lock(app: str, name: str) -> dict[str, str]:
    """``name`` forwards and backwards while another session holds the two tables, then without it."""
    import psycopg
    from django.db import connection

    _migrate(None)
    before = previous(app, name)
    _migrate(before, app)
    settings = connection.settings_dict
    with connection.cursor() as cursor:
        # A bound for a migration that would wait for ever (no lock_timeout): it then fails on this instead.
        cursor.execute("SET statement_timeout = '60s'")
    found = {}
    with psycopg.connect(host=settings["HOST"], port=settings["PORT"], user=settings["USER"],
                         password=settings["PASSWORD"] or None, dbname=settings["NAME"]) as holder:
        for direction, target in (("forwards", name), ("backwards", before)):
            holder.execute(f"LOCK TABLE {', '.join(TABLES)} IN ACCESS SHARE MODE")  # as a long read does
            found[f"{direction}, held"] = _migrate(target, app)
            holder.rollback()
            found[f"{direction}, free"] = _migrate(target, app)
    return found


def main(argv: list[str]) -> None:
    import django

    django.setup()
    what, app, names = argv[0], argv[1], argv[2:]
    result: Any = cuts(app, names) if what == "cuts" else lock(app, names[0])
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
