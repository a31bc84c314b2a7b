"""Nothing a user imports moves: every import path and dotted name of ours the documentation shows
imports, and every management command answers ``--help``. The documentation is read as it is (README,
README.pypi.md, docs/), so a page that shows a path that does not exist fails here."""

from __future__ import annotations

import importlib
import re

import pytest
from django.core.management import get_commands

from tests.conftest import ROOT, manage

PAGES = [ROOT / "README.md", ROOT / "README.pypi.md", *sorted((ROOT / "docs").glob("*.md"))]
#: ``from cron_celery... import a, b`` (the names on one line, as every snippet writes them).
FROM_IMPORT = re.compile(r"\bfrom (cron_celery(?:\.\w+)*) import ([\w, ]+)")
#: A dotted name in backticks or quotes: ``cron_celery.beat.Scheduler``, ``cron_celery.run.tasks.message_options``.
DOTTED = re.compile(r"[`'\"](cron_celery(?:\.\w+)+)(?:\(\))?[`'\"]")
#: Dotted names the pages show that are not Python: settings, permissions, check ids, task names.
NOT_PYTHON = re.compile(r"^cron_celery\.(?:[A-Z]\d{3}|actor|source|retention|reconcile|deliver_alert|"
                        r"deliver_schedule_problem|publish_backfill|(?:add|change|view|delete|operate)_\w+|"
                        r"urls|jobs\.[\w-]+|group)$")


def shown() -> set[tuple[str, str]]:
    """(module, name) for every import the pages show; (dotted path, "") for every dotted name."""
    found: set[tuple[str, str]] = set()
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for module, names in FROM_IMPORT.findall(text):
            found |= {(module, name.strip()) for name in names.split(",") if name.strip()}
        found |= {(dotted, "") for dotted in DOTTED.findall(text) if not NOT_PYTHON.match(dotted)}
    return found


def resolve(dotted: str) -> object:
    """The module, or the attribute of the longest importable module prefix, that ``dotted`` names."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            found = getattr(found, attribute)
        return found
    raise ModuleNotFoundError(dotted)


def test_the_pages_show_the_public_paths():
    found = shown()
    assert ("cron_celery", "cron_task") in found and ("cron_celery.schedules", "every") in found
    assert ("cron_celery.beat.Scheduler", "") in found and ("cron_celery.signals", "execution_failed") in found
    assert ("cron_celery.notifiers.base", "Channel") in found and ("cron_celery.admin.Audited", "") in found


@pytest.mark.parametrize(("module", "name"), sorted(shown()), ids=lambda value: value or "-")
def test_every_path_the_pages_show_imports(module, name):
    found = resolve(module)
    if name:
        assert hasattr(found, name) or importlib.import_module(f"{module}.{name}"), f"{module} has no {name}"


def test_the_users_paths_the_issue_names_import():
    from cron_celery import Run, TrackedTask, cron_task, lock  # noqa: F401 - imported is the test
    from cron_celery.beat import Scheduler
    from cron_celery.schedules import at, cron, daily, every, monthly, weekly  # noqa: F401

    assert Scheduler.__module__ == "cron_celery.beat"
    assert resolve("cron_celery.urls").urlpatterns  # type: ignore[attr-defined]


OURS = sorted(name for name, app in get_commands().items() if app == "cron_celery")


def test_our_commands_are_found():
    assert set(OURS) >= {"run_cron_task", "list_cron_tasks", "sync_cron_schedules", "reconcile_cron",
                         "backfill_cron_task", "purge_cron_executions", "cron_check"}


@pytest.mark.parametrize("command", OURS)
def test_every_command_answers_help(command):
    done = manage(command, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: ") and f" {command} " in done.stdout.splitlines()[0], done.stdout[:300]


def test_a_pure_test_file_runs_alone_without_postgresql_or_redis(tmp_path):
    """The README's one-file command: plain pytest on a pure file, with both servers out of reach."""
    import subprocess
    import sys

    from tests.conftest import subprocess_env

    env = subprocess_env(DATABASE_URL="postgres://nobody@127.0.0.1:1/none", REDIS_URL="redis://127.0.0.1:1/0")
    done = subprocess.run([sys.executable, "-m", "pytest", "tests/test_schedules.py", "-q", "-p", "no:cacheprovider",
                           f"--basetemp={tmp_path}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert " passed" in done.stdout.splitlines()[-1] and "error" not in done.stdout.splitlines()[-1]


def test_a_worker_without_the_admin_knows_every_task_of_ours():
    """A worker's settings may leave ``django.contrib.admin`` out (the soak's do): every Celery task
    the package declares must still be registered when Django starts, or the worker rejects the
    message (an admin backfill's remaining slots, an alert's delivery, a schedule problem's)."""
    import re
    import subprocess
    import sys

    from tests.conftest import subprocess_env

    declared = set()
    for path in (ROOT / "cron_celery").rglob("*.py"):
        declared |= set(re.findall(r'shared_task\(name="(cron_celery\.\w+)"', path.read_text(encoding="utf-8")))
    assert {"cron_celery.publish_backfill", "cron_celery.deliver_alert", "cron_celery.reconcile"} <= declared
    probe = ("import django; django.setup(); from tests.soak.celery_app import app; "
             "print(' '.join(sorted(name for name in app.tasks if name.startswith('cron_celery.'))))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=subprocess_env(DJANGO_SETTINGS_MODULE="tests.soak.settings"), check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert declared <= set(done.stdout.split()), sorted(declared - set(done.stdout.split()))
