"""Migrations never stall the running system (issue item 9).

Every claim, heartbeat, final write and the beat's dispatch reads or writes the jobs table
(cron_celery_cronjob) or the executions table (cron_celery_cronexecution). A migration waiting for a lock
on one of them makes each of those queue behind its request. So every migration from FIRST_RULED on that
touches either table:

- is ``atomic = False``: each operation commits on its own, keeps no lock past itself, and an index can
  be built CONCURRENTLY (which cannot run in a transaction);
- sets ``lock_timeout`` first and resets it last, forwards and backwards: when it cannot have its lock
  it fails after that long instead of holding everyone up;
- creates and drops indexes only CONCURRENTLY;
- runs again after stopping at any operation, forwards and backwards (lock_timeout makes it stop);
- has its time at ten million executions, measured, in docs/migrating.md.

The rules are read from each file's syntax tree and from the SQL Django sends for it (what ``manage.py
sqlmigrate`` prints), not from its prose. They hold for the migrations written under them, not for the
older ones, which were folded into the initial migration (docs/migrating.md).
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from tests.conftest import ROOT, manage, subprocess_env
from tests.migration_steps import EXAMPLE, TABLES, sent
from tests.test_execution_indexes import own_database  # noqa: F401 - the fixture, used by name

#: The first migration written under the rule: every one after the initial migration (the 26 migrations
#: written before the first release were folded into 0001_initial, which makes the empty tables).
FIRST_RULED = "0002"

MIGRATIONS = ROOT / "cron_celery" / "migrations"
#: tests/migration_example: one migration that keeps the rule, one that breaks it (the check's own proof).
EXAMPLES = ROOT / "tests" / "migration_example" / "migrations"
KEEPS, BREAKS = EXAMPLES / "0001_job_note.py", EXAMPLES / "0002_careless_index.py"
DOC = ROOT / "docs" / "migrating.md"
MODELS = {"cronjob", "cronexecution"}
#: Operations that build or drop an index while holding a lock that stops the table's writes.
INDEX_UNDER_LOCK = {"AddIndex", "RemoveIndex", "AlterUniqueTogether", "AlterIndexTogether"}
#: Constraints that are an index (``AddConstraint`` of one builds it under the table's lock).
INDEX_CONSTRAINTS = {"UniqueConstraint", "ExclusionConstraint"}
SET = re.compile(r"set lock_timeout (=|to) '?[1-9][0-9]*(ms|s)?'?;?")
RESET = re.compile(r"reset lock_timeout;?")
BUSY_TABLE = re.compile(r"\b(" + "|".join(TABLES) + r")\b")
FIGURE = re.compile(r"\d[\d,.]*\s*(ms|s|min)")


def ruled() -> list[Path]:
    return sorted(path for path in MIGRATIONS.glob("[0-9][0-9][0-9][0-9]_*.py") if path.name[:4] >= FIRST_RULED)


def _name(node: ast.expr) -> str:
    """``migrations.RunSQL`` -> "RunSQL"."""
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def written(path: Path) -> tuple[object, list[ast.Call]]:
    """The value ``atomic`` is given in the file's Migration class (Django's default, True, when none is)
    and the calls of its ``operations`` list."""
    tree = ast.parse(path.read_text(), filename=str(path))
    migration = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Migration")
    atomic: object = True
    operations: list[ast.Call] = []
    for node in migration.body:
        if isinstance(node, ast.Assign) and [_name(target) for target in node.targets] == ["atomic"]:
            atomic = ast.literal_eval(node.value)
        elif isinstance(node, ast.Assign) and [_name(target) for target in node.targets] == ["operations"]:
            assert isinstance(node.value, ast.List), f"{path.name}: operations is not a list"
            operations = [call for call in node.value.elts if isinstance(call, ast.Call)]
            assert len(operations) == len(node.value.elts), f"{path.name}: an operation that is not a call"
    return atomic, operations


def models_named(operations: list[ast.Call]) -> set[str]:
    """The ``model_name``/``name`` keywords of the operations, nested ones (``state_operations``) too."""
    return {keyword.value.value.lower() for call in operations for node in ast.walk(call)
            if isinstance(node, ast.Call) for keyword in node.keywords
            if keyword.arg in ("model_name", "name") and isinstance(keyword.value, ast.Constant)
            and isinstance(keyword.value.value, str)}


def index_operations(operations: list[ast.Call]) -> list[str]:
    found = []
    for call in operations:
        kind = _name(call.func)
        inner = {_name(node.func) for node in ast.walk(call) if isinstance(node, ast.Call)}
        if kind in INDEX_UNDER_LOCK or (kind == "AddConstraint" and inner & INDEX_CONSTRAINTS):
            found.append(f"{kind} (line {call.lineno})")
    return found


def index_statements(sql: str) -> list[str]:
    """The statements of ``sql`` that build or drop an index without CONCURRENTLY: CREATE/DROP INDEX,
    REINDEX, and an ALTER TABLE that adds a UNIQUE, PRIMARY KEY or EXCLUDE constraint (an index built
    under the table's ACCESS EXCLUSIVE lock) other than one USING INDEX built beforehand."""
    text = " ".join(sql.lower().split())
    found = re.findall(r"\b(?:create (?:unique )?index|drop index|reindex)\b(?! concurrently)[^;]*", text)
    found += [statement for statement in re.findall(r"\balter table\b[^;]*", text)
              if re.search(r"\b(unique|primary key|exclude)\b", statement) and "using index" not in statement]
    return [statement[:120] for statement in found
            if not statement.startswith("reindex") or "concurrently" not in statement]


def timed_in_doc() -> dict[str, list[str]]:
    """The rows of docs/migrating.md's tables whose header speaks of ten million executions, by the
    migration their first cell names (in backticks)."""
    rows: dict[str, list[str]] = {}
    header: list[str] = []
    for line in DOC.read_text().splitlines():
        if not line.startswith("|"):
            header = []
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not header:
            header = cells
        elif "10,000,000" in " ".join(header) and (named := re.fullmatch(r"`(\d{4}_\w+)`", cells[0])):
            rows[named.group(1)] = cells[1:]
    return rows


def _app(path: Path) -> str:
    return EXAMPLE if path.parent == EXAMPLES else "cron_celery"


def _sent_both(path: Path) -> list[str]:
    return sent(path.stem, app=_app(path)) + sent(path.stem, backwards=True, app=_app(path))


def touches(path: Path) -> bool:
    """Whether the migration names a busy table's model or sends SQL that names the table (needs a database).
    One that sends no SQL either way (a field's choices, Django's only) takes no lock: it touches nothing."""
    statements = _sent_both(path)
    return bool(statements) and (bool(models_named(written(path)[1]) & MODELS)
                                 or any(BUSY_TABLE.search(item) for item in statements))


def alters(path: Path) -> bool:
    """Whether the migration changes a busy table itself (ALTER, CREATE or DROP naming it), not only a
    function that reads it (needs a database)."""
    changes = re.compile(r"\b(alter|create|drop)\s+(table|index|unique index)\b[^;]*\b(" + "|".join(TABLES) + r")\b",
                         re.IGNORECASE)
    return any(changes.search(item) for item in _sent_both(path))


def rule_breaks(path: Path, *, documented: bool = True) -> list[str]:
    """What migration ``path`` does against the rule (nothing when it touches neither busy table).
    ``documented``: whether its row in docs/migrating.md is asked for too."""
    if not touches(path):
        return []
    name = path.stem
    atomic, operations = written(path)
    forwards, backwards = sent(name, app=_app(path)), sent(name, backwards=True, app=_app(path))
    breaks = [] if atomic is False else [f"atomic is {atomic!r}, not False"]
    for direction, sql in (("forwards", forwards), ("backwards", backwards)):
        first, last = (" ".join(sql[index].lower().split()) if sql else "" for index in (0, -1))
        if not SET.fullmatch(first):
            breaks.append(f"{direction}, the first statement is not SET lock_timeout: {first[:80]!r}")
        if not RESET.fullmatch(last):
            breaks.append(f"{direction}, the last statement is not RESET lock_timeout: {last[:80]!r}")
        breaks += [f"{direction}, an index without CONCURRENTLY: {found}" for item in sql
                   for found in index_statements(item)]
    breaks += [f"an index under the table's lock: {found}" for found in index_operations(operations)]
    figures = timed_in_doc().get(name)
    if documented and (not figures or not FIGURE.fullmatch(figures[0])):
        breaks.append(f"docs/migrating.md has no row `{name}` with its time at 10,000,000 executions")
    return breaks


def test_the_initial_migration_is_the_only_one_before_the_rule() -> None:
    before = sorted(path.stem for path in MIGRATIONS.glob("[0-9][0-9][0-9][0-9]_*.py") if path.name[:4] < FIRST_RULED)
    assert before == ["0001_initial"], before


@pytest.mark.django_db
def test_every_migration_touching_the_busy_tables_follows_the_rule() -> None:
    broken = {path.stem: breaks for path in ruled() if (breaks := rule_breaks(path))}
    assert not broken, "\n".join(f"{name} breaks the rule:\n  " + "\n  ".join(breaks)
                                  for name, breaks in broken.items())


@pytest.mark.django_db
def test_a_migration_that_sends_no_sql_is_outside_the_rule() -> None:
    """0007 adds a choice to the jobs' overlap field: it names the model, and nothing reaches the database."""
    path = MIGRATIONS / "0007_overlap_buffer_one.py"
    assert models_named(written(path)[1]) & MODELS
    assert _sent_both(path) == [] and not touches(path) and rule_breaks(path) == []


@pytest.mark.django_db
def test_the_rule_check_passes_a_migration_that_keeps_it_and_names_each_break_of_one_that_does_not() -> None:
    assert touches(KEEPS) and rule_breaks(KEEPS, documented=False) == []
    breaks = rule_breaks(BREAKS)
    assert [item.split(":")[0] for item in breaks] == [
        "atomic is True, not False",
        "forwards, the first statement is not SET lock_timeout",
        "forwards, the last statement is not RESET lock_timeout",
        "forwards, an index without CONCURRENTLY",
        "backwards, the first statement is not SET lock_timeout",
        "backwards, the last statement is not RESET lock_timeout",
        "backwards, an index without CONCURRENTLY",
        "docs/migrating.md has no row `0002_careless_index` with its time at 10,000,000 executions"], breaks


def test_the_index_check_tells_a_concurrent_build_from_one_under_lock() -> None:
    under_lock = ("CREATE INDEX x ON cron_celery_cronexecution (slot)", "DROP INDEX IF EXISTS x",
                  "CREATE UNIQUE INDEX x ON t (a)", "REINDEX TABLE cron_celery_cronjob",
                  'ALTER TABLE "cron_celery_cronjob" ADD CONSTRAINT x UNIQUE ("code")')
    concurrent = ("CREATE INDEX CONCURRENTLY IF NOT EXISTS x ON cron_celery_cronexecution (slot)",
                  "DROP INDEX CONCURRENTLY IF EXISTS x", "REINDEX INDEX CONCURRENTLY x",
                  "ALTER TABLE cron_celery_cronjob ADD CONSTRAINT x UNIQUE USING INDEX x",
                  "ALTER TABLE cron_celery_cronjob ADD COLUMN y integer DEFAULT 0 NOT NULL")
    assert [sql for sql in under_lock if index_statements(sql)] == list(under_lock)
    assert [sql for sql in concurrent if index_statements(sql)] == []
    tree = ast.parse("[migrations.AddIndex(model_name='cronexecution', index=models.Index(fields=['slot'])),"
                     " migrations.AddIndexConcurrently(model_name='cronexecution', index=models.Index(fields=['a'])),"
                     " migrations.AddConstraint(model_name='cronjob', constraint=models.UniqueConstraint("
                     "fields=['code'], name='x'))]")
    calls = [call for call in ast.walk(tree) if isinstance(call, ast.Call) and _name(call.func)[0].isupper()]
    assert index_operations([call for call in calls if _name(call.func).startswith(("Add", "Remove"))]) == [
        "AddIndex (line 1)", "AddConstraint (line 1)"]


def _steps(database: str, *args: str) -> object:
    done = manage("shell", "-c", "from tests.migration_steps import main; "
                  f"main({list(args)!r})", env=subprocess_env(CRON_CELERY_TEST_DB=database,
                                                              CRON_TEST_MIGRATION_EXAMPLE="1"), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.django_db
def test_a_ruled_migration_stopped_part_way_runs_again(own_database: str) -> None:  # noqa: F811
    """Stopped after each operation (as when its lock_timeout runs out there), forwards and backwards,
    each migration runs to its end when ``migrate`` is run again; and the schema it leaves is the one a
    plain ``migrate`` makes. The example that keeps the rule is run too, so the steps are proven on a
    migration even while cron_celery has none after its initial one."""
    touching = [path.stem for path in ruled() if touches(path)]
    if touching:
        assert _steps(own_database, "cuts", "cron_celery", *touching) == {"failed": [], "same_schema": True}
    assert _steps(own_database, "cuts", EXAMPLE, KEEPS.stem) == {"failed": [], "same_schema": True}


@pytest.mark.django_db
def test_a_ruled_migration_that_cannot_have_its_lock_fails_instead_of_waiting(
        own_database: str) -> None:  # noqa: F811
    """While a session holds the jobs and executions tables (a long report does), the newest ruled
    migration that changes one of them (while there is none, the example that keeps the rule) fails on
    its lock_timeout, forwards and backwards, and runs once the lock is released. (One that only replaces
    a function takes no lock on them: docs/migrating.md.)"""
    altering = [path for path in ruled() if touches(path) and alters(path)]
    newest = altering[-1] if altering else KEEPS
    found = _steps(own_database, "lock", _app(newest), newest.stem)
    assert isinstance(found, dict)
    assert {key: "lock timeout" in value for key, value in found.items() if key.endswith("held")} == {
        "forwards, held": True, "backwards, held": True}, found
    assert {key: value for key, value in found.items() if key.endswith("free")} == {
        "forwards, free": "ran", "backwards, free": "ran"}
