"""docs/quickstart.md works as written: its Python blocks are the files of a project that
runs its job end to end, and its shell commands name commands that exist.

Each Python block of the page follows a ``<!-- snippet: NAME -->`` line. The ``settings``
block is executed on top of what ``startproject`` writes and checked against what
cron_celery needs; ``urls``, ``celery``, ``celery-init`` and ``tasks`` become the files of
a ``proj`` package and a ``billing`` app, imported into this test process; the page's
``manage.py`` commands then run against the test database, the admin shows the job, and the
``history`` block reads the rows.
"""

from __future__ import annotations

import importlib
import io
import re
import shlex
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import _state as celery_state
from celery import current_app
from celery.beat import Scheduler
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core import checks
from django.core.management import call_command, get_commands
from django.core.management.base import CommandError
from django.test import override_settings
from django.utils.module_loading import import_string

from cron_celery import conf, registry
from cron_celery.models import CronExecution, CronJob, Status, Trigger
from tests.conftest import ROOT, Queue

PAGE = ROOT / "docs" / "quickstart.md"
FENCE = re.compile(r"^```(\w[\w-]*)?[ \t]*$")
MARKER = re.compile(r"^<!-- snippet: ([\w-]+) -->$")
#: What ``django-admin startproject`` puts in INSTALLED_APPS (Django 5.2 and 6.0).
STARTPROJECT_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
]
#: Commands of the page that are safe to run here, in the page's order.
RUNNABLE = {"run_cron_task", "sync_cron_schedules", "list_cron_tasks"}


def blocks() -> list[tuple[str, str, str]]:
    """(info string, snippet name or "", code) of every fenced block, in page order."""
    found: list[tuple[str, str, str]] = []
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        marker = MARKER.match(lines[i - 1]) if i else None
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        found.append((opening.group(1) or "", marker.group(1) if marker else "", "\n".join(lines[i + 1:end]) + "\n"))
        i = end + 1
    return found


def snippet(name: str) -> str:
    """The code of the named snippet (several blocks of one name are one file)."""
    parts = [code for info, marked, code in blocks() if marked == name]
    assert parts, f"docs/quickstart.md has no <!-- snippet: {name} --> block"
    return "\n\n".join(parts)


def shell_lines() -> list[str]:
    """Every command of the page's ``sh`` blocks, without comments."""
    lines = []
    for info, _name, code in blocks():
        if info == "sh":
            lines += [line.split("  #")[0].strip() for line in code.splitlines()
                      if line.strip() and not line.lstrip().startswith("#")]
    return lines


def manage_commands() -> list[list[str]]:
    return [shlex.split(line)[2:] for line in shell_lines() if line.startswith("python manage.py ")]


# --- the page itself ------------------------------------------------------------------------

def test_every_python_block_is_a_named_snippet_and_compiles():
    python = [(name, code) for info, name, code in blocks() if info == "python"]
    assert {name for name, _code in python} == {"settings", "urls", "celery", "celery-init", "tasks", "history"}
    for name, code in python:
        compile(code, f"quickstart:{name}", "exec")


def test_the_shell_commands_exist():
    lines = shell_lines()
    commands = get_commands()
    for args in manage_commands():
        assert args[0] in commands, f"quickstart: manage.py has no command {args[0]!r}"
    assert {"migrate", "createsuperuser", "runserver", "run_cron_task", "sync_cron_schedules"} <= {
        args[0] for args in manage_commands()}
    pip = [line for line in lines if line.startswith("pip install ")]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["name"]
    assert pip and shlex.split(pip[0])[2] == project
    beat = [shlex.split(line) for line in lines if line.startswith("celery -A proj beat")]
    assert beat and beat[0][beat[0].index("-S") + 1] == "cron_celery.beat.Scheduler"
    assert issubclass(import_string(beat[0][beat[0].index("-S") + 1]), Scheduler)
    assert any(line.startswith("celery -A proj worker") for line in lines)


def test_the_settings_snippet_configures_what_cron_celery_needs():
    namespace: dict[str, Any] = {"INSTALLED_APPS": list(STARTPROJECT_APPS)}
    exec(compile(snippet("settings"), "quickstart:settings", "exec"), namespace)
    apps = namespace["INSTALLED_APPS"]
    assert {"django.contrib.admin", "django_celery_beat", "cron_celery"} <= set(apps)
    assert len(apps) == len(set(apps))
    database = namespace["DATABASES"]["default"]
    assert database["ENGINE"] == "django.db.backends.postgresql"
    assert database["CONN_MAX_AGE"] > 0
    assert namespace["CELERY_BROKER_URL"].startswith("redis://")
    assert namespace["CELERY_DB_REUSE_MAX"] >= 1
    assert set(namespace["CRON_CELERY"]) <= set(conf.FIELDS)
    with override_settings(CRON_CELERY=namespace["CRON_CELERY"],
                           CELERY_DB_REUSE_MAX=namespace["CELERY_DB_REUSE_MAX"]):
        problems = checks.run_checks(tags=["cron_celery"])
    assert problems == [], [f"{problem.id}: {problem.msg}" for problem in problems]


# --- the project it describes, end to end ---------------------------------------------------

@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The page's files as a ``proj`` package and a ``billing`` app, imported here. The job
    registry holds only the page's jobs meanwhile; everything is put back afterwards."""
    for package, files in {"proj": {"__init__": "celery-init", "celery": "celery", "urls": "urls"},
                           "billing": {"__init__": None, "tasks": "tasks"}}.items():
        (tmp_path / package).mkdir()
        for module, name in files.items():
            (tmp_path / package / f"{module}.py").write_text(snippet(name) if name else "", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    for index in ("_by_name", "_by_code", "_by_task"):
        monkeypatch.setattr(registry, index, {})
    before = set(current_app.tasks)
    previous_app = celery_state.get_current_app()
    try:
        proj = importlib.import_module("proj")  # the Celery app, as Django's settings would import it
        celery_state._set_current_app(previous_app)
        importlib.import_module("billing.tasks")  # what autodiscovery does at start-up
        yield proj
    finally:
        celery_state._set_current_app(previous_app)
        for name in set(current_app.tasks) - before:
            current_app.tasks.pop(name, None)
        for module in [name for name in sys.modules if name.split(".")[0] in ("proj", "billing")]:
            del sys.modules[module]


@pytest.mark.django_db(transaction=True)
def test_the_quickstart_project_runs_its_job_and_shows_it_in_the_admin(project, queue: Queue, client):
    # Step 4: the Celery app reads the CELERY_ settings and knows the jobs' tasks.
    app = project.celery_app
    assert app.main == "proj" and app.conf.broker_url == settings.CELERY_BROKER_URL
    assert {"billing.tasks.calc_commission", "billing.tasks.CloseDay"} <= set(app.tasks)
    # Step 5: both jobs are declared.
    assert [job.name for job in registry.all_jobs()] == ["calc-commission", "close-day"]
    assert registry.get("A001").task_name == "billing.tasks.calc_commission"

    # Steps 6 and 7: the page's commands, in its order.
    outputs = []
    for args in manage_commands():
        if args[0] in RUNNABLE:
            out = io.StringIO()
            call_command(*args, stdout=out)
            outputs.append((args, out.getvalue()))
    first = next(output for args, output in outputs if args == ["run_cron_task", "calc-commission"])
    shown = re.compile(r"calc-commission \S+Z succeeded \(execution \d+, run #1\): "
                       r"Commissions calculated for \d{4}-\d\d-\d\d")
    assert shown.fullmatch(first.strip()), first
    assert shown.search(PAGE.read_text(encoding="utf-8")), "the page's sample output no longer matches"
    assert any("already ran" in output for args, output in outputs if "--at" in args)
    rows = CronExecution.objects.filter(task_name="calc-commission")
    ran = {row.execution_date.isoformat() for row in rows.filter(status=Status.SUCCEEDED, trigger=Trigger.MANUAL)}
    assert "2026-11-29" in ran and len(ran) in (1, 2)  # today's slot, and the one of 2026-11-29
    assert rows.filter(status=Status.SKIPPED).count() == 3 - len(ran)
    assert rows.filter(status=Status.PENDING, trigger=Trigger.ENQUEUE, execution_date="2026-11-28").count() == 1
    assert len(queue.headers()) == 1  # --enqueue sent it to the broker
    job = CronJob.objects.get(code="A001")
    assert (job.schedule, job.periodic_task.name) == ("0 1 * * *", "calc-commission (A001)")

    # The class-style job: a past day closes, a day not over yet is a recorded failure.
    call_command("run_cron_task", "close-day", "2020-01-31", stdout=io.StringIO())
    with pytest.raises(CommandError) as failed:
        call_command("run_cron_task", "close-day", "2999-01-31", stdout=io.StringIO())
    assert failed.value.returncode == 1
    closed = {row.execution_date.isoformat(): row for row in CronExecution.objects.filter(task_name="close-day")}
    assert (closed["2020-01-31"].status, closed["2020-01-31"].message) == (
        Status.SUCCEEDED, "Books of 2020-01-31 closed")
    assert (closed["2999-01-31"].status, closed["2999-01-31"].error_code) == (Status.FAILED, "TOO_EARLY")

    # Step 8: the dashboard and the history in the admin, through the page's urls.py.
    admin_user = get_user_model().objects.create_superuser("quickstart", "ops@example.com", "not-a-secret")
    client.force_login(admin_user)
    with override_settings(ROOT_URLCONF="proj.urls"):
        dashboard = client.get("/admin/cron_celery/cronjob/")
        history = client.get("/admin/cron_celery/cronexecution/")
        status = client.get("/cron/status/")
    assert dashboard.status_code == 200 and history.status_code == 200
    page = dashboard.content.decode()
    assert "calc-commission" in page and "close-day" in page and "every day at 01:00" in page
    assert "calc-commission" in history.content.decode() and "close-day" in history.content.decode()
    assert {job["name"] for job in status.json()["jobs"]} == {"calc-commission", "close-day"}

    # Step 10: the history queries.
    namespace: dict[str, Any] = {}
    exec(compile(snippet("history"), "quickstart:history", "exec"), namespace)
    assert [row.execution_date.isoformat() for row in namespace["failures"]] == ["2999-01-31"]
    assert {row["task_name"]: (row["total"], row["succeeded"]) for row in namespace["per_job"]} == {
        "calc-commission": (4, len(ran)), "close-day": (2, 1)}
