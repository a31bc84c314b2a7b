"""The prepared claim and final write (cron_celery/statements.py) in the configurations a user can
run: Django's server-side binding, a session terminated under the worker, PgBouncer in transaction
mode."""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from cron_celery.decisions import jobs, statements
from cron_celery.models import CronExecution, Status, Trigger
from cron_celery.run import runs
from tests.conftest import make_job
from tests.test_pooler import pgbouncer, pgbouncer_binary  # noqa: F401 - fixtures
from tests.test_statements import _ok, fresh  # noqa: F401 - a fixture

SLOT = dt.datetime(2026, 11, 29, 7, 0, tzinfo=dt.UTC)
pytestmark = pytest.mark.usefixtures("fresh")  # what this process prepared is forgotten around each test


def _job() -> Any:
    job, _job_id = make_job(pattern="always", overlap="allow")
    jobs.job_id(job)
    return job


def _run(job: Any, minute: int) -> runs.Outcome:
    return runs.execute(job, SLOT + dt.timedelta(minutes=minute), _ok, trigger=Trigger.MANUAL)


@pytest.fixture
def server_side_binding() -> Iterator[None]:
    """Django's documented ``"server_side_binding": True`` (docs/deployment.md lists it, with
    ``prepare_threshold``): psycopg's server-binding cursor, the extended query protocol."""
    options = connection.settings_dict["OPTIONS"]
    saved = dict(options)
    connection.close()
    options["server_side_binding"] = True
    try:
        yield
    finally:
        connection.close()
        options.clear()
        options.update(saved)


@pytest.mark.django_db(transaction=True)
def test_runs_succeed_with_server_side_binding(server_side_binding):
    job = _job()
    for minute in range(3):
        assert _run(job, minute).status == Status.SUCCEEDED
    assert CronExecution.objects.filter(task_code=job.code, status=Status.SUCCEEDED).count() == 3


@pytest.mark.django_db(transaction=True)
def test_control_plain_statements_run_with_server_side_binding(server_side_binding, settings):
    """The same runs with the plain text (as before the change): they succeed."""
    settings.CRON_CELERY = {"PREPARED_STATEMENTS": False}
    job = _job()
    for minute in range(3):
        assert _run(job, minute).status == Status.SUCCEEDED


@pytest.mark.django_db(transaction=True)
def test_with_server_side_binding_a_standard_job_records_its_outcome(server_side_binding):
    """A job with the default pattern (``standard``, overlap ``skip``) is claimed by the plain
    transaction (never prepared); its body runs; then the final write, which is prepared, must land."""
    job, _job_id = make_job()
    calls: list[int] = []

    def body(run: runs.Run) -> str:
        calls.append(1)
        return "ok"

    try:
        outcome: object = runs.execute(job, SLOT, body, trigger=Trigger.MANUAL)
    except Exception as error:  # shown in the assertion below
        outcome = error
    rows = list(CronExecution.objects.filter(task_code=job.code).values_list("status", flat=True))
    assert calls == [1]  # the body ran ...
    assert rows == [Status.SUCCEEDED], (rows, outcome)  # ... and its outcome must be recorded


@pytest.mark.django_db(transaction=True)
def test_a_terminated_session_is_replaced_and_prepared_again():
    """``pg_terminate_backend`` after the statements were prepared: the failing run is not retried as
    plain text, the next connection prepares them again, and nothing is written twice."""
    import psycopg

    job = _job()
    assert _run(job, 0).status == Status.SUCCEEDED
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    db = connection.settings_dict
    with psycopg.connect(dbname=db["NAME"], user=db["USER"], host=db["HOST"], port=db["PORT"],
                         autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
    with contextlib.suppress(Exception):  # the connection is gone: an error, as with plain text
        _run(job, 1)
    connection.close_if_unusable_or_obsolete()
    assert _run(job, 2).status == Status.SUCCEEDED
    assert statements.usable()
    rows = sorted(CronExecution.objects.filter(task_code=job.code).values_list("slot", "run_number"))
    assert len(rows) == len(set(rows)) and len(rows) in (2, 3)


@pytest.fixture
def through_pgbouncer(pgbouncer) -> Iterator[Any]:  # noqa: F811 - the imported fixture
    """Django's default connection pointed at a PgBouncer in transaction mode (tests/test_pooler.py)."""
    saved = connection.settings_dict["PORT"]
    connection.close()
    connection.settings_dict["PORT"] = str(pgbouncer.port)
    try:
        yield pgbouncer
    finally:
        connection.close()
        connection.settings_dict["PORT"] = saved


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_behind_pgbouncer_in_transaction_mode_each_slot_runs_once(through_pgbouncer):
    job = _job()
    for minute in range(8):
        assert _run(job, minute).status == Status.SUCCEEDED
    rows = sorted(CronExecution.objects.filter(task_code=job.code).values_list("status", "run_number"))
    assert rows == [(Status.SUCCEEDED, 1)] * 8
    with connection.cursor() as cursor:
        cursor.execute("SELECT inet_server_port()")
    assert not statements.usable()  # the rotation was noticed: plain text from then on
