"""Shared fixtures. The services are real: a missing PostgreSQL or Redis fails, never skips."""

from __future__ import annotations

import dataclasses
import datetime as dt
import fcntl
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from django.db import InterfaceError, OperationalError, connection

from cron_celery.decisions import jobs as job_rows
from cron_celery.declaring import registry
from tests import faketime_leftovers, packaging

ROOT = Path(__file__).resolve().parent.parent
_counter = itertools.count(1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test but a pure one (``pytest.mark.pure``) needs Redis and the test database: it gets the
    session's checks of both. A run of pure tests alone needs neither server."""
    for item in items:
        if item.get_closest_marker("pure") is None:
            item.add_marker(pytest.mark.usefixtures("_redis_is_up", "_close_stray_connections"))


@pytest.fixture(scope="session")
def _redis_is_up() -> Iterator[None]:
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    client = redis.Redis.from_url(url, socket_connect_timeout=3)
    try:
        client.ping()
    except redis.RedisError as exc:  # pragma: no cover - the point is to fail loudly
        pytest.fail(f"Redis at {url} is required for the test suite: {exc}")
    yield
    # Remove this session's own queue and its bindings (their names carry the session's
    # unique queue name); nothing else in the machine's Redis is touched.
    from django.conf import settings

    queue = settings.CELERY_TASK_DEFAULT_QUEUE
    keys = list(client.scan_iter(match=f"*{queue}*", count=1000))
    if keys:
        client.delete(*keys)


def make_job(pattern: str = "standard", overlap: str = "skip", **extra: object) -> tuple[registry.Job, int]:
    """A job declared on the fly (not registered with Celery) and its row id."""
    n = next(_counter)
    job = registry.declare(
        name=f"job-{os.getpid()}-{n}", code=f"J{os.getpid()}-{n}", task_name=f"tests.fake.job{n}",
        pattern=pattern, overlap=overlap, **extra,  # type: ignore[arg-type]
    )
    return job, job_rows.ensure_job(job)


@pytest.fixture
def marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A file that job bodies append a line to (see tests/jobsapp/tasks.py:mark)."""
    path = tmp_path / "marker.txt"
    path.touch()
    monkeypatch.setenv("CRON_TEST_MARKER", str(path))
    return path


def wait_for(predicate: Callable[[], bool], timeout: float = 60.0, what: str = "condition",
             poll: float = 0.05) -> None:
    """Poll until ``predicate()`` is true (every ``poll`` s); fail the test with ``what`` after
    ``timeout`` s — a guard against a hang, never a measure of speed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(poll)
    raise AssertionError(f"timed out waiting for {what}")


def expire_lease(execution_id: int) -> None:
    """The run's worker froze: its lease ran out a second ago (on the database's clock)."""
    with connection.cursor() as cursor:
        cursor.execute("UPDATE cron_celery_cronexecution SET lease_until = now() - interval '1 second'"
                       " WHERE id = %s", [execution_id])


def marked(path: Path) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line]


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for a child process that must use this test's database."""
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    env["CRON_CELERY_TEST_DB"] = connection.settings_dict["NAME"]
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def manage(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``python -m django ARGS`` in a real child process against the test database."""
    return subprocess.run(
        [sys.executable, "-m", "django", *args], cwd=ROOT, env=env or subprocess_env(),
        capture_output=True, text=True, timeout=timeout, check=False,
    )


@pytest.fixture(autouse=True)
def _fresh_job_ids() -> Iterator[None]:
    # Job rows are rolled back or flushed between tests: forget cached row ids.
    job_rows._job_ids.clear()
    yield
    job_rows._job_ids.clear()


@pytest.fixture(scope="session")
def _close_stray_connections(django_db_setup, django_db_blocker) -> Iterator[None]:
    """Worker threads and the lease thread keep their own connections to the test database;
    end them before pytest-django drops it (only sessions on our own test database)."""
    yield
    if not str(connection.settings_dict["NAME"]).startswith("test_"):
        return  # no test touched the database: there is no test database to clean up
    with django_db_blocker.unblock():
        for attempt in range(2):
            try:
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                return
            except (OperationalError, InterfaceError):
                # This connection was itself ended by a test that clears a pool's server
                # connections (tests/test_pooler.py): open a new one and try again.
                connection.close()
                if attempt:
                    raise


@dataclasses.dataclass
class Queue:
    """The session's own Celery queue (a Redis list; the newest message is on the left)."""

    client: redis.Redis
    name: str

    def headers(self) -> list[dict[str, Any]]:
        return [json.loads(raw)["headers"] for raw in reversed(self.client.lrange(self.name, 0, -1))]


@pytest.fixture
def queue() -> Iterator[Queue]:
    """The session's queue, emptied before and after the test (its name is unique to the session)."""
    from django.conf import settings

    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    name = settings.CELERY_TASK_DEFAULT_QUEUE
    client.delete(name)
    yield Queue(client, name)
    client.delete(name)
    client.close()


def debian_tool(path: str, package: str, needed_for: str) -> str:
    """``path``, installed from Debian's ``package`` with apt-get when it is missing (as on a fresh
    machine); a tool that cannot be had fails the test, never skips it. The two Django lines run
    side by side and may both want one: installs take a lock of ours, and apt waits for dpkg's.
    For ``faketime``, what dead processes left in /dev/shm is cleared first."""
    if package == "faketime":
        faketime_leftovers.clear_stale()
    if Path(path).exists():
        return path
    apt = shutil.which("apt-get")
    assert apt is not None, f"Debian's {package} is needed for {needed_for} and apt-get is missing"
    with open(Path(tempfile.gettempdir()) / "cron-celery-tests-apt.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not Path(path).exists():  # another line may have installed it meanwhile
            env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
            result = subprocess.run([apt, "-o", "DPkg::Lock::Timeout=600", "install", "-y", "-q", package],
                                    env=env, capture_output=True, text=True, timeout=900, check=False)
            assert Path(path).exists(), \
                f"could not install {package}:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
    return path


@pytest.fixture(scope="session")
def dist(tmp_path_factory: pytest.TempPathFactory) -> packaging.Dist:
    """The sdist and the wheel of this checkout, built once per test line (see tests/packaging.py)."""
    return packaging.build(tmp_path_factory.mktemp("release"))


def db_now() -> dt.datetime:
    """The database's ``now()``: in a test's transaction it is the same for every statement."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        row = cursor.fetchone()
    assert row is not None and isinstance(row[0], dt.datetime)
    return row[0]


# The model test's Hypothesis profiles (model-ci, long): registered before the options are read, so
# `pytest tests --hypothesis-profile=long` works for the whole suite.
from tests.model import profiles as _model_profiles  # noqa: E402, F401


@pytest.fixture
def declare() -> Iterator[object]:
    """Declare and register jobs for one test (``declare(name, code, **options)``); forgotten after."""
    names: list[str] = []

    def make(name: str, code: str, **options: object) -> registry.Job:
        job = registry.declare(name=name, code=code, task_name=f"tests.fake.{name.replace('-', '_')}",
                               pattern=options.pop("pattern", "standard"), **options)  # type: ignore[arg-type]
        registry.register(job)
        names.append(name)
        return job

    yield make
    for name in names:
        registry.unregister(name)


def lock_job_row(code: str) -> psycopg.Connection[Any]:
    """A connection of the test's own that holds the job's row (as a long transaction or a claim would)."""
    settings = connection.settings_dict
    holder = psycopg.connect(dbname=settings["NAME"], user=settings["USER"], host=settings["HOST"],
                             port=settings["PORT"], password=settings["PASSWORD"] or None)
    holder.execute("SELECT id FROM cron_celery_cronjob WHERE code = %s FOR UPDATE", [code])
    return holder
