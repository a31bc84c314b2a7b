"""The claim and the final write are prepared once per database session, and run with EXECUTE;
a session that does not keep them (a pooler in transaction mode) gets them as plain text."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import OperationalError, connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from cron_celery.decisions import claims, dispatch, jobs, statements
from cron_celery.models import CronExecution, Status, Trigger
from cron_celery.run import runs
from tests.conftest import make_job
from tests.test_audit import other_connection

SLOT = dt.datetime(2026, 11, 29, 7, 0, tzinfo=dt.UTC)


def test_a_statement_is_numbered_typed_and_named_after_its_text():
    made = statements.statement("probe", "SELECT %(a)s::int + %(b)s, %(a)s", {"b": "integer", "a": "integer"})
    assert made.prepare == f"PREPARE {made.name}(integer, integer) AS SELECT $2::int + $1, $2"
    assert made.execute == f"EXECUTE {made.name}(%(b)s, %(a)s)"
    assert made.name.startswith("cron_celery_probe_")
    other = statements.statement("probe", "SELECT %(a)s::int + %(b)s, %(a)s", {"b": "bigint", "a": "integer"})
    assert other.name != made.name  # another text (its types): another name, never the same name twice
    with pytest.raises(ValueError, match="typed parameters"):
        statements.statement("probe", "SELECT %(a)s, %(c)s", {"a": "integer"})


@pytest.fixture
def fresh() -> Iterator[None]:
    statements.reset()
    yield
    statements.reset()


def _ok(run: runs.Run) -> str:
    return "ok"


def _sent(queries: CaptureQueriesContext) -> list[str]:
    """How each query of the run began: PREPARE, EXECUTE or the plain WITH (savepoints left out)."""
    return [word for query in queries.captured_queries
            if (word := query["sql"].split(None, 1)[0]) not in ("SAVEPOINT", "RELEASE")]


def _job() -> Any:
    job, _job_id = make_job(pattern="always", overlap="allow")
    jobs.job_id(job)  # its row id known already, as in any run but a process's first
    return job


def _run(job: Any, minute: int) -> runs.Outcome:
    return runs.execute(job, SLOT + dt.timedelta(minutes=minute), _ok, trigger=Trigger.MANUAL)


@pytest.mark.django_db(transaction=True)
def test_the_first_run_prepares_the_next_ones_execute(fresh):
    job = _job()
    with CaptureQueriesContext(connection) as first:
        assert _run(job, 0).status == Status.SUCCEEDED
    with CaptureQueriesContext(connection) as second:
        assert _run(job, 1).status == Status.SUCCEEDED
    assert _sent(first) == ["PREPARE", "PREPARE"]  # each with its EXECUTE, in one round trip
    assert _sent(second) == ["EXECUTE", "EXECUTE"]
    # Inside a transaction as a TestCase wraps a test in (the one an in-process run runs inside):
    test_case = transaction.atomic()
    test_case._from_testcase = True
    with test_case, CaptureQueriesContext(connection) as inside:  # never inside a transaction
        assert _run(job, 2).status == Status.SUCCEEDED
    assert _sent(inside) == ["WITH", "WITH"]
    with override_settings(CRON_CELERY={"PREPARED_STATEMENTS": False}), CaptureQueriesContext(connection) as off:
        assert _run(job, 3).status == Status.SUCCEEDED
    assert _sent(off) == ["WITH", "WITH"]
    assert CronExecution.objects.filter(task_code=job.code, status=Status.SUCCEEDED).count() == 4


@pytest.mark.django_db(transaction=True)
def test_a_session_that_lost_them_gets_plain_statements_from_then_on(fresh):
    """As behind a pooler in transaction mode: the next statement reaches a server session that does
    not hold what this connection prepared. The EXECUTE fails having run nothing; the statement is
    sent as plain text, and this process prepares nothing more."""
    job = _job()
    assert _run(job, 0).status == Status.SUCCEEDED
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")
    with CaptureQueriesContext(connection) as lost:
        assert _run(job, 1).status == Status.SUCCEEDED
    assert _sent(lost) == ["EXECUTE", "SELECT", "WITH", "WITH"]  # the SELECT asks what the session holds
    assert not statements.usable()
    rows = CronExecution.objects.filter(task_code=job.code).values_list("status", "run_number")
    assert sorted(rows) == [(Status.SUCCEEDED, 1), (Status.SUCCEEDED, 1)]  # one row per slot, nothing twice


@pytest.mark.django_db(transaction=True)
def test_a_statement_the_session_holds_already_is_executed(fresh):
    """The process lost count (or another client of a pooled server session prepared it: one name is
    one text): the PREPARE is refused, the EXECUTE runs it."""
    job = _job()
    assert _run(job, 0).status == Status.SUCCEEDED
    statements._prepared.clear()
    with CaptureQueriesContext(connection) as again:
        assert _run(job, 1).status == Status.SUCCEEDED
    assert _sent(again) == ["PREPARE", "SELECT", "EXECUTE", "PREPARE", "SELECT", "EXECUTE"]
    assert statements.usable()


@pytest.mark.django_db(transaction=True)
def test_a_claim_sent_as_two_statements_in_one_query_is_prepared_and_falls_back_like_one(fresh):
    """A job with the slot and overlap checks: its claim is the lock and the claim, two statements in one
    query (quick_claims). Both are prepared in the first run's query and executed together from then
    on; a session that lost them runs neither, and gets both as plain text."""
    job, _job_id = make_job(pattern="standard", overlap="skip")
    jobs.job_id(job)
    with CaptureQueriesContext(connection) as first:
        assert _run(job, 0).status == Status.SUCCEEDED
    with CaptureQueriesContext(connection) as second:
        assert _run(job, 1).status == Status.SUCCEEDED
    assert _sent(first) == ["PREPARE", "PREPARE"] and first.captured_queries[0]["sql"].count("PREPARE") == 2
    assert _sent(second) == ["EXECUTE", "EXECUTE"] and second.captured_queries[0]["sql"].count("EXECUTE") == 2
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")
    with CaptureQueriesContext(connection) as lost:
        assert _run(job, 2).status == Status.SUCCEEDED
    assert _sent(lost) == ["EXECUTE", "SELECT", "UPDATE", "WITH"]
    rows = CronExecution.objects.filter(task_code=job.code).values_list("status", "run_number")
    assert sorted(rows) == [(Status.SUCCEEDED, 1)] * 3  # one row per slot, nothing twice


@pytest.mark.django_db(transaction=True)
def test_a_claim_that_failed_after_its_prepares_leaves_them_known_and_the_next_claim_prepared(fresh):
    """A query's PREPAREs outlive its failure: a claim that prepared the lock and its statement, then
    met a lock timeout, leaves them held by the session. The next claim (another statement beside the
    same lock) must not take the refused PREPARE for the whole batch, nor the session for a pooler's:
    it prepares only what is missing, and the process keeps preparing."""
    job, job_id = make_job(pattern="standard", overlap="skip")
    jobs.job_id(job)
    execution_id, _ = dispatch.enqueue(job=job, job_id=job_id, slot=SLOT, execution_date=SLOT.date(),
                                       trigger=Trigger.BEAT)
    holder = other_connection("holds the job's row")
    holder.autocommit = False
    try:
        holder.execute("SELECT 1 FROM cron_celery_cronjob WHERE id = %s FOR UPDATE", [job_id])
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '200ms'")
        with pytest.raises(OperationalError, match="lock timeout"):
            claims.begin(job=job, job_id=job_id, slot=SLOT, execution_date=SLOT.date(), trigger=Trigger.BEAT,
                         execution_id=execution_id)
    finally:
        holder.rollback()
        holder.close()
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
    with CaptureQueriesContext(connection) as after:
        assert _run(job, 5).status == Status.SUCCEEDED
    assert statements.usable()
    assert _sent(after)[0] in ("PREPARE", "EXECUTE") and "UPDATE" not in _sent(after)
    with CaptureQueriesContext(connection) as next_one:
        assert _run(job, 6).status == Status.SUCCEEDED
    assert _sent(next_one) == ["EXECUTE", "EXECUTE"]
