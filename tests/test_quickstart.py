"""docs/quickstart.md works as written: followed top to bottom, in a new directory, with real
processes — the page is the script of this test, so it cannot drift from what works.

The page's fenced blocks are read in order. A ``sh`` line is run (``django-admin startproject``,
``cd``, ``psql``/``createdb``, ``export``, every ``manage.py`` command, ``curl``) or started
and left running (the worker, the beat, ``runserver``); a Python block whose first line names
a file (``# proj/urls.py``) becomes that file, or is appended to it (``# proj/settings.py: add
at the end``); the ``history`` block is fed to ``manage.py shell``; a ``text`` block is the
output the ``sh`` block before it printed, digits aside. A line the test does not know how
to follow fails it: a new step on the page needs a rule here.

The page runs from the artefact a user downloads: its ``python3 -m venv .venv`` makes a new
virtual environment, and its ``pip install`` line installs the wheel built from this checkout
(``tests/packaging.py``) with only the dependencies the wheel declares, from the package
index: no extras, nothing from the test's own environment. The Django 5.2 line does it on
Python 3.11, the Django 6.0 line on Python 3.13 (pip picks the Django line). After the page,
the same project is checked as a release must be: ``check --deploy`` says nothing of
cron_celery, the metrics endpoint says which extra it needs, and naming the ``sentry``
channel without sentry-sdk is a check error.

Where it differs from a newcomer's run, and why: ``python3`` is the line's Python
(``packaging.USER_PYTHON``) and ``pip install`` takes the wheel, as said; the database and role are named for this
test line and the broker queue too (both Django lines share one PostgreSQL and Redis), by a
line appended after the page's settings; ``createsuperuser`` gets its answers and
``runserver`` a free port.
"""

from __future__ import annotations

import dataclasses
import http.cookiejar
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import django
import psycopg
import pytest
from celery.beat import Scheduler
from django.conf import settings
from django.core import checks
from django.core.management import get_commands
from django.test import override_settings
from django.utils.module_loading import import_string

from cron_celery import __version__, conf
from tests import packaging
from tests.conftest import ROOT, wait_for
from tests.redis_servers import free_port

PAGE = ROOT / "docs" / "quickstart.md"
FENCE = re.compile(r"^```(\w[\w-]*)?[ \t]*$")
MARKER = re.compile(r"^<!-- snippet: ([\w-]+) -->$")
FILE_LINE = re.compile(r"^# (?P<path>[\w/]+\.py)(?P<append>: add at the end)?$")
#: What ``django-admin startproject`` puts in INSTALLED_APPS (Django 5.2 and 6.0).
STARTPROJECT_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
]
#: The database and role of the followed page (its ``proj``), one per test line.
NAME = f"{os.environ.get('CRON_TEST_DATABASE_PREFIX', 'cron_celery')}_quickstart"
ADMIN_PASSWORD = "not-a-secret-quickstart"


@dataclasses.dataclass(frozen=True)
class Block:
    info: str  # the fence's language: sh, python, text
    name: str  # the snippet name of a Python block, else ""
    code: str


def blocks() -> list[Block]:
    """Every fenced block of the page, in page order."""
    found: list[Block] = []
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        marker = MARKER.match(lines[i - 1]) if i else None
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        found.append(Block(opening.group(1) or "", marker.group(1) if marker else "",
                           "\n".join(lines[i + 1:end]) + "\n"))
        i = end + 1
    return found


def snippet(name: str) -> str:
    parts = [block.code for block in blocks() if block.name == name]
    assert len(parts) == 1, f"docs/quickstart.md has {len(parts)} <!-- snippet: {name} --> blocks"
    return parts[0]


def commands(code: str) -> list[str]:
    """The command lines of a ``sh`` block, without comments."""
    return [line.split("  #")[0].strip() for line in code.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def shell_lines() -> list[str]:
    return [line for block in blocks() if block.info == "sh" for line in commands(block.code)]


def manage_commands() -> list[list[str]]:
    return [shlex.split(line)[2:] for line in shell_lines() if line.startswith("python manage.py ")]


def shape(sample: str) -> re.Pattern[str]:
    """A sample output as a pattern: the same text, any digits where it has digits."""
    return re.compile(r"\d+".join(re.escape(part) for part in re.split(r"\d+", sample.strip())))


# --- the page itself ------------------------------------------------------------------------

def test_every_python_block_is_a_named_snippet_and_compiles():
    python = [block for block in blocks() if block.info == "python"]
    assert [block.name for block in python] == ["settings", "urls", "celery", "celery-init", "tasks", "history"]
    for block in python:
        compile(block.code, f"quickstart:{block.name}", "exec")
        first = block.code.splitlines()[0]
        assert block.name == "history" or FILE_LINE.match(first), f"{block.name}: {first!r} names no file"


def test_the_shell_commands_exist():
    lines = shell_lines()
    known = get_commands()
    for args in manage_commands():
        assert args[0] in known, f"quickstart: manage.py has no command {args[0]!r}"
    assert {"migrate", "createsuperuser", "runserver", "run_cron_task", "sync_cron_schedules", "list_cron_tasks",
            "startapp"} <= {args[0] for args in manage_commands()}
    beat = [shlex.split(line) for line in lines if line.startswith("celery -A proj beat")]
    assert beat and beat[0][beat[0].index("-S") + 1] == "cron_celery.beat.Scheduler"
    assert issubclass(import_string(beat[0][beat[0].index("-S") + 1]), Scheduler)
    assert any(line.startswith("celery -A proj worker") for line in lines)


def test_the_settings_snippet_configures_what_cron_celery_needs(monkeypatch):
    monkeypatch.setenv("CRON_TOKEN", "t" * 43)
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
    # The snippet's settings, plus the concurrency group the test project's own jobs name.
    configured = {**namespace["CRON_CELERY"], "CONCURRENCY_GROUPS": settings.CRON_CELERY["CONCURRENCY_GROUPS"]}
    with override_settings(CRON_CELERY=configured,
                           CELERY_DB_REUSE_MAX=namespace["CELERY_DB_REUSE_MAX"]):
        problems = checks.run_checks(tags=["cron_celery"])
    assert problems == [], [f"{problem.id}: {problem.msg}" for problem in problems]


def test_the_settings_snippet_without_the_token_stops_with_one_line_saying_what_to_run(monkeypatch):
    monkeypatch.delenv("CRON_TOKEN", raising=False)
    with pytest.raises(SystemExit) as stopped:
        exec(compile(snippet("settings"), "quickstart:settings", "exec"), {"INSTALLED_APPS": []})
    assert stopped.value.code == 'CRON_TOKEN is not set: run  export CRON_TOKEN="$(cat .cron_token)"'


# --- the page, followed -----------------------------------------------------------------------

def _superuser_sql(statement: str) -> None:
    with psycopg.connect(host="127.0.0.1", port=5432, user="postgres", dbname="postgres", autocommit=True) as conn:
        conn.execute(statement)


def _drop_database() -> None:
    _superuser_sql(f'DROP DATABASE IF EXISTS "{NAME}" WITH (FORCE)')
    _superuser_sql(f'DROP ROLE IF EXISTS "{NAME}"')


class Follower:
    """Follows the page's blocks in a new directory, as a person at a terminal would."""

    def __init__(self, home: Path, wheel: Path) -> None:
        self.cwd = home
        self.wheel = wheel
        self.env = {key: value for key, value in os.environ.items()
                    if not key.startswith(("CRON_", "DJANGO_", "CELERY_", "PYTHON", "VIRTUAL_ENV"))}
        # Nothing of the test's own virtual environment: the page makes and activates its own.
        self.env["PATH"] = os.pathsep.join(entry for entry in self.env["PATH"].split(os.pathsep)
                                           if Path(entry) != Path(sys.executable).parent)
        self.env["DJANGO_SUPERUSER_PASSWORD"] = ADMIN_PASSWORD
        self.port = free_port()
        self.running: dict[str, subprocess.Popen[str]] = {}
        self.logs = home / "logs"
        self.logs.mkdir()
        self.last_output = ""  # what the last sh block printed
        self.outputs: list[tuple[str, str]] = []  # (line, output) of every line run

    # ---- running what the page says ------------------------------------------------------

    def run(self, line: str, *, check: bool = True) -> str:
        done = subprocess.run(["bash", "-c", line], cwd=self.cwd, env=self.env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=180, check=False)
        assert done.returncode == 0 or not check, f"{line!r} exited {done.returncode}:\n{done.stdout}"
        self.outputs.append((line, done.stdout))
        return done.stdout

    def start(self, name: str, line: str) -> None:
        log = (self.logs / f"{name}.log").open("w")
        self.running[name] = subprocess.Popen(["bash", "-c", f"exec {line}"], cwd=self.cwd, env=self.env,
                                              stdout=log, stderr=subprocess.STDOUT, text=True,
                                              start_new_session=True)

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(encoding="utf-8", errors="replace")

    def stop(self) -> None:
        for proc in self.running.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.running.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(host="127.0.0.1", port=5432, user="postgres", dbname=NAME) as conn:
            return conn.execute(sql).fetchall()

    # ---- the blocks ----------------------------------------------------------------------

    def block(self, block: Block) -> None:
        if block.info == "sh":
            self.last_output = "".join(self.line(line) for line in commands(block.code))
        elif block.info == "python":
            self.python(block)
        elif block.info == "text":
            assert shape(block.code).fullmatch(self.last_output.strip()), (
                f"the page's sample output\n{block.code}\nis not what the commands printed:\n{self.last_output}")
        else:
            raise AssertionError(f"a {block.info!r} block the test cannot follow:\n{block.code}")

    def python(self, block: Block) -> None:
        if block.name == "history":
            self.last_output = self.run(f"python manage.py shell <<'EOF'\n{block.code}EOF")
            return
        found = FILE_LINE.match(block.code.splitlines()[0])
        assert found, f"{block.name}: the first line names no file"
        path = self.cwd / found["path"]
        if found["append"]:
            path.write_text(path.read_text(encoding="utf-8") + "\n" + block.code, encoding="utf-8")
        else:
            path.write_text(block.code, encoding="utf-8")
        if found["path"] == "proj/settings.py":  # this test's own database, role and broker queue
            with path.open("a", encoding="utf-8") as settings_file:
                settings_file.write(f'\nDATABASES["default"].update(NAME="{NAME}", USER="{NAME}")\n'
                                    f'CELERY_TASK_DEFAULT_QUEUE = "{NAME}"\n')

    def line(self, line: str) -> str:
        words = shlex.split(line)
        if line == "python3 -m venv .venv":
            return self.run(shlex.join([*packaging.user_python(django.VERSION[:2]), "-m", "venv", ".venv"]))
        if line == ". .venv/bin/activate":
            venv = self.cwd / ".venv"
            self.env["VIRTUAL_ENV"] = str(venv)
            self.env["PATH"] = f"{venv / 'bin'}{os.pathsep}{self.env['PATH']}"
            return ""
        if words[:2] == ["pip", "install"]:
            assert words[2:] == ["/path/to/cron_celery"], line  # the checkout, or "a wheel built from it"
            return self.run(shlex.join(["pip", "install", "--disable-pip-version-check", str(self.wheel)]))
        if words[0] == "cd":
            self.cwd = self.cwd / words[1]
            return ""
        if words[0] in ("psql", "createdb"):
            return self.run(re.sub(r"\bproj\b", NAME, line))
        if words[0] == "export":
            variable = words[1].split("=", 1)[0]
            value = self.run(f'{line}\nprintf %s "${variable}"')
            assert len(value) >= 32, value
            self.env[variable] = value
            return ""
        if words[:3] == ["celery", "-A", "proj"]:
            return self.celery(words[3], line)
        if words[:2] == ["python", "manage.py"]:
            return self.manage(words[2], line)
        if words[0] == "curl":
            return self.curl(line)
        if words[0] == "django-admin" or words[:2] == ["python", "-c"]:
            return self.run(line)
        raise AssertionError(f"the page has a command the test does not know how to follow: {line!r}")

    def manage(self, command: str, line: str) -> str:
        if command == "createsuperuser":
            return self.run(f"{line} --noinput --username admin --email admin@example.com")
        if command == "runserver":
            self.start("runserver", f"{line} 127.0.0.1:{self.port} --noreload")
            wait_for(lambda: self._answers("/admin/login/"), 60, "runserver to answer")
            return ""
        if command == "run_cron_task" or "||" in line:
            return self.run(line, check="||" in line)
        return self.run(line)

    def celery(self, role: str, line: str) -> str:
        self.start(role, line)
        if role == "beat":  # a person waits for the next minute; so does the test
            wait_for(lambda: bool(self.rows(
                "SELECT 1 FROM cron_celery_cronexecution WHERE task_name = 'heartbeat' AND trigger = 'BEAT'"
                " AND status = 'SUCCEEDED'")), 150, "the beat's heartbeat run to succeed", poll=1)
            wait_for(lambda: bool(self.rows(
                "SELECT 1 FROM cron_celery_cronexecution WHERE task_name = 'calc-commission'"
                " AND trigger = 'ENQUEUE' AND status = 'SUCCEEDED'")), 60, "the enqueued run to succeed", poll=0.5)
        return ""

    def curl(self, line: str) -> str:
        output = self.run(line.replace("127.0.0.1:8000", f"127.0.0.1:{self.port}"))
        return output + "\n"

    def _answers(self, path: str) -> bool:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2)
        except OSError:
            return False
        return True

    # ---- looking at the result -----------------------------------------------------------

    def admin_pages(self) -> dict[str, str]:
        """Log in as the page's admin user, as a browser does, and read the dashboard and history."""
        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        base = f"http://127.0.0.1:{self.port}"
        form = opener.open(f"{base}/admin/login/").read().decode()
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form)
        assert token, form[:500]
        data = urllib.parse.urlencode({"csrfmiddlewaretoken": token[1], "username": "admin",
                                       "password": ADMIN_PASSWORD, "next": "/admin/"}).encode()
        opener.open(urllib.request.Request(f"{base}/admin/login/?next=/admin/", data=data,
                                           headers={"Referer": f"{base}/admin/login/"}))
        return {path: opener.open(f"{base}{path}").read().decode()
                for path in ("/admin/cron_celery/cronjob/", "/admin/cron_celery/cronexecution/")}


@pytest.fixture
def follower(tmp_path: Path, dist: packaging.Dist) -> Iterator[Follower]:
    _drop_database()
    follower = Follower(tmp_path, dist.wheel)
    try:
        yield follower
    finally:
        follower.stop()
        _drop_database()


@pytest.mark.timeout(600)
def test_the_page_followed_top_to_bottom_in_a_new_project_runs_its_jobs(follower: Follower):
    for block in blocks():
        follower.block(block)

    # What the page promised along the way.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["name"]
    assert project == "cron_celery"
    said = dict(follower.outputs)
    closed_today = next(output for line, output in follower.outputs if line.startswith(
        "python manage.py run_cron_task close-day ||"))
    assert closed_today.count("is not over yet") == 1, closed_today  # a failure is printed once
    assert closed_today.strip().endswith("exit status 1")
    assert "already ran" in said["python manage.py run_cron_task calc-commission --at 2026-11-29T01:00"]
    listing = said["python manage.py list_cron_tasks"]
    heartbeat = next(row for row in listing.splitlines() if row.startswith("heartbeat"))
    assert "SUCCEEDED" in heartbeat, listing

    rows = follower.rows("SELECT task_name, trigger, status, execution_date::text FROM cron_celery_cronexecution")
    commission = [row for row in rows if row[0] == "calc-commission"]
    assert ("calc-commission", "ENQUEUE", "SUCCEEDED", "2026-11-28") in commission  # run by the worker
    assert ("close-day", "MANUAL", "SUCCEEDED", "2026-11-29") in rows
    assert [row[2] for row in rows if row[0] == "close-day" and row[3] != "2026-11-29"] == ["FAILED"]
    assert {row[2] for row in rows if row[0] == "heartbeat"} == {"SUCCEEDED"}
    assert "cron_celery beat: dispatched 1 slot(s)" in follower.log("beat")  # its logger, not the banner
    assert "heartbeat" in follower.log("worker")

    # The endpoints, asked with the page's token.
    health, status = (json.loads(output) for line, output in follower.outputs if line.startswith("curl"))
    assert health["status"] == "ok", health
    assert {job["name"] for job in status["jobs"]} >= {"calc-commission", "close-day", "heartbeat"}
    assert len(status["executions"]) == 5

    # The admin, as the page's user sees it.
    pages = follower.admin_pages()
    dashboard = pages["/admin/cron_celery/cronjob/"]
    assert all(name in dashboard for name in ("calc-commission", "close-day", "heartbeat", "every day at 01:00"))
    assert "heartbeat" in pages["/admin/cron_celery/cronexecution/"]

    # The history block, in manage.py shell.
    printed = dict(re.findall(r"^([\w-]+) (\d+ executions, \d+ succeeded)$", follower.last_output, flags=re.M))
    ran = len({row[3] for row in commission if row[2] == "SUCCEEDED"})
    assert printed["calc-commission"] == f"4 executions, {ran} succeeded", follower.last_output
    assert printed["close-day"] == "2 executions, 1 succeeded"
    assert re.search(r"^1 failed in the last 7 days$", follower.last_output, flags=re.M), follower.last_output

    # The release itself: this project runs on the wheel and only what it declares.
    installed = {package["name"].lower().replace("_", "-"): package["version"]
                 for package in json.loads(follower.run("pip list --format json --disable-pip-version-check"))}
    assert installed["cron-celery"] == __version__
    assert "sentry-sdk" not in installed and "prometheus-client" not in installed, sorted(installed)
    runtime = follower.run("python -c 'import cron_celery, django, sys; print(cron_celery.__file__, "
                           "django.get_version(), *sys.version_info[:2])'").split()
    assert "/.venv/lib/" in runtime[0], runtime  # not the checkout
    assert runtime[1].startswith("{}.{}.".format(*django.VERSION[:2])), runtime
    assert runtime[2:] == packaging.USER_PYTHON[django.VERSION[:2]].split("."), runtime
    deploy = follower.run("python manage.py check --deploy")
    assert "cron_celery." not in deploy, deploy  # Django's own deployment warnings are the project's
    request = urllib.request.Request(f"http://127.0.0.1:{follower.port}/cron/metrics/",
                                     headers={"Authorization": f"Bearer {follower.env['CRON_TOKEN']}"})
    with pytest.raises(urllib.error.HTTPError) as answer:
        urllib.request.urlopen(request, timeout=10)
    assert answer.value.code == 501
    assert answer.value.read().decode() == "prometheus-client is not installed: pip install 'cron_celery[prometheus]'\n"
    (follower.cwd / "proj" / "settings_sentry.py").write_text(
        'from proj.settings import *  # noqa: F403\n\n'
        'CRON_CELERY = {**CRON_CELERY, "NOTIFICATIONS": {"on_failure": ["sentry"]}}  # noqa: F405\n',
        encoding="utf-8")
    refused = follower.run("python manage.py check --settings proj.settings_sentry", check=False)
    assert ("cron_celery.E011) Channel 'sentry': sentry-sdk is not installed "
            "(pip install 'cron_celery[sentry]')." in refused), refused
