"""Which transactions an in-process run refuses (``RunInTransaction``, before anything is written),
and the one it runs inside: the transaction a test case wraps each test in. The beat side of it
is tests/faults/test_in_transaction.py."""

from __future__ import annotations

import datetime as dt

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction

from cron_celery import exceptions
from cron_celery.models import CronExecution, Status, Trigger
from cron_celery.run import callers, runs
from tests.conftest import make_job
from tests.jobsapp import jobs_ident

SLOT = dt.datetime(2026, 11, 29, 1, 0, tzinfo=dt.UTC)


def _run(job: object) -> runs.Outcome:
    return runs.execute(job, SLOT, lambda run: "ok", trigger=Trigger.MANUAL)  # type: ignore[arg-type]


@pytest.mark.django_db(transaction=True)
def test_a_run_inside_the_callers_atomic_block_is_refused_and_writes_nothing():
    job, job_id = make_job(pattern="always", overlap="allow")
    with transaction.atomic(), pytest.raises(exceptions.RunInTransaction) as refused:
        _run(job)
    assert refused.value.error_code == "IN_TRANSACTION"
    assert str(refused.value).startswith(f"Job {job.name!r} cannot run in-process inside the caller's database "
                                         "transaction (transaction.atomic(), ATOMIC_REQUESTS")
    assert not CronExecution.objects.filter(job_id=job_id).exists()
    assert _run(job).status == Status.SUCCEEDED  # outside it, the same run runs


@pytest.mark.django_db(transaction=True)
def test_a_run_with_autocommit_turned_off_is_refused():
    job, job_id = make_job(pattern="always", overlap="allow")
    connection.ensure_connection()
    transaction.set_autocommit(False)
    try:
        with pytest.raises(exceptions.RunInTransaction):
            _run(job)
    finally:
        transaction.rollback()
        transaction.set_autocommit(True)
    assert not CronExecution.objects.filter(job_id=job_id).exists()


@pytest.mark.django_db(transaction=True)
def test_a_task_called_inside_a_transaction_is_refused_and_apply_reports_it():
    with transaction.atomic():
        with pytest.raises(exceptions.RunInTransaction):
            jobs_ident.txn_held()
        applied = jobs_ident.txn_held.apply()
    assert applied.failed() and isinstance(applied.result, exceptions.RunInTransaction)
    assert not CronExecution.objects.filter(task_code="X701").exists()


@pytest.mark.django_db(transaction=True)
def test_run_cron_task_inside_a_transaction_is_refused_before_its_cascade_row_is_written():
    with transaction.atomic(), pytest.raises(CommandError) as refused:
        call_command("run_cron_task", "calc-commission", "2026-11-29", "--cascade")
    assert refused.value.returncode == 2 and "inside the caller's database transaction" in str(refused.value)
    assert not CronExecution.objects.filter(task_code="A001").exists()


@pytest.mark.django_db
def test_inside_a_test_cases_transaction_a_run_runs_and_a_block_of_the_callers_own_is_refused():
    """pytest-django's ``db`` (Django's TestCase) wraps the test in its own transaction: a run
    there runs as before (tests of projects' jobs), without a lease to renew: no other session
    sees its row. An ``atomic()`` of the test's own inside it is the caller's, and refused."""
    job, _ = make_job(pattern="always", overlap="allow")
    assert callers.in_test_transaction()
    outcome = _run(job)
    assert outcome.status == Status.SUCCEEDED
    with transaction.atomic(), pytest.raises(exceptions.RunInTransaction):
        _run(job)
