"""A finished body is recorded once, whatever it returned: values PostgreSQL refuses as they
are (NaN, infinities, lone surrogates in error texts), and a soft time limit that lands while
the outcome is written. Real prefork workers on a Redis broker of the test's own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, transaction

from cron_celery.models import CronExecution, CronJob, Status, Trigger
from cron_celery.run import runs
from tests.conftest import lock_job_row, make_job, marked, wait_for
from tests.faults import test_retries
from tests.faults.test_retries import SLOT, attempt_log, enqueue, settled
from tests.jobsapp import jobs_results as jobs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
broker, started = test_retries.broker, test_retries.started  # the fixtures

#: A short lease and a reconciler in the worker: an outcome that could not be written would
#: be found LOST (and run again) within seconds, not after the default minute.
FAST_RECONCILER = {"CRON_TEST_LEASE_SECONDS": "3", "CRON_TEST_LOCK_TTL": "1.5", "CRON_TEST_RECONCILE_INTERVAL": "1"}
REPLACED = "\ufffd"


def final(execution_id: int, timeout: float = 30) -> CronExecution:
    """The execution once it is final; a timeout says where it stands."""
    try:
        return settled(execution_id, timeout=timeout)[0]
    except AssertionError:
        row = CronExecution.objects.get(id=execution_id)
        raise AssertionError(f"execution {execution_id} is still {row.status} ({row.error_code}: {row.message})"
                             f" after {timeout} s; attempts {attempt_log(row)}") from None


def bodies(marker: Path, label: str) -> list[str]:
    return [line for line in marked(marker) if line.split()[0] == label]


def assert_recorded_once(row: CronExecution, marker: Path, label: str) -> None:
    assert row.status != Status.LOST, (row.status, row.error_code, row.message)
    assert len(bodies(marker, label)) == 1, "the finished body ran again"
    assert CronExecution.objects.filter(task_code=row.task_code).count() == 1


def test_a_nan_result_is_recorded_once_not_lost(started, broker, marker):
    started(**FAST_RECONCILER)
    row, _ = settled(enqueue(jobs.results_nan, broker), timeout=60)
    assert_recorded_once(row, marker, "results-nan")
    assert row.status == Status.SUCCEEDED, (row.status, row.error_code, row.message)
    assert row.result == {"ratio": "NaN", "rows": 3}


def test_an_exception_of_ours_reaches_the_workers_parent_as_itself(started, broker, marker):
    """A prefork child hands its task's exception to Celery pickled; a cron_celery exception that
    did not survive that was logged as another class, its message garbled ("CronCeleryError(...
    cron_celery failed; ... The lock ...")."""
    worker = started()
    row, _ = settled(enqueue(jobs.results_lock_lost, broker), timeout=60)
    assert (row.status, row.error_code) == (Status.FAILED, "LOCK_LOST"), (row.status, row.error_code, row.message)
    wait_for(lambda: "raised unexpected" in worker.log.read_text(errors="replace"), what="the worker's failure line")
    line = next(line for line in worker.log.read_text(errors="replace").splitlines() if "raised unexpected" in line)
    assert "raised unexpected: LockLost(\"The lock 'nightly-export' was lost while held" in line, line
    assert "CronCeleryError" not in line and "cron_celery failed" not in line, line


def test_infinities_nested_in_a_list_and_surrogates_in_keys_are_recorded_once(started, broker, marker):
    started(**FAST_RECONCILER)
    row, _ = settled(enqueue(jobs.results_infinity, broker), timeout=60)
    assert_recorded_once(row, marker, "results-infinity")
    assert row.status == Status.SUCCEEDED, (row.status, row.error_code, row.message)
    name = jobs.ODD_NAME.replace("\udcff", REPLACED)
    assert row.result == {"bounds": [0.5, "Infinity", ["-Infinity"]], name: "key and value: " + name}


def test_a_surrogate_in_the_exception_message_is_recorded_once(started, broker, marker):
    started(**FAST_RECONCILER)
    row, _ = settled(enqueue(jobs.results_odd_error, broker), timeout=60)
    assert_recorded_once(row, marker, "results-odd-error")
    assert row.status == Status.FAILED and row.error_code == "FileNotFoundError", (row.status, row.error_code)
    assert row.message == f"FileNotFoundError: cannot open /data/report-{REPLACED}.csv"
    assert row.message in row.traceback and row.retry_count == 0


def test_a_surrogate_in_a_retried_attempts_message_keeps_the_retry(started, broker, marker):
    started(**FAST_RECONCILER)
    row, _ = settled(enqueue(jobs.results_odd_retry, broker), timeout=60)
    assert row.status == Status.SUCCEEDED, (row.status, row.error_code, row.message)
    assert attempt_log(row) == [(Status.FAILED, "ConnectionError"), (Status.SUCCEEDED, "")]
    assert row.attempts[0]["message"] == f"ConnectionError: share /data/report-{REPLACED}.csv went away"
    assert row.message == f"copied /data/report-{REPLACED}.csv on attempt 2"
    assert [line.split()[1] for line in bodies(marker, "results-odd-retry")] == ["attempt=1", "attempt=2"]
    assert CronExecution.objects.filter(task_code="R004").count() == 1


REFUSE = """
CREATE OR REPLACE FUNCTION cc_results_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'this result is refused by a check of the test' USING ERRCODE = 'invalid_parameter_value';
END $$;
CREATE TRIGGER cc_results_refuse BEFORE UPDATE ON cron_celery_cronexecution FOR EACH ROW
    WHEN (NEW.result ? 'refuse_me') EXECUTE FUNCTION cc_results_refuse();
"""


@pytest.fixture
def refusing_database() -> Iterator[None]:
    """PostgreSQL refuses, for a reason in the data (SQLSTATE class 22), any result with the key
    ``refuse_me``: what it does with values nobody foresaw."""
    with connection.cursor() as cursor:
        cursor.execute(REFUSE)
    yield
    with connection.cursor() as cursor:
        cursor.execute("DROP TRIGGER IF EXISTS cc_results_refuse ON cron_celery_cronexecution;"
                       " DROP FUNCTION IF EXISTS cc_results_refuse()")


def test_an_outcome_the_database_refuses_ends_failed_result_not_storable_not_lost(started, broker, marker,
                                                                                refusing_database):
    started(**FAST_RECONCILER)
    row, _ = settled(enqueue(jobs.results_refused, broker), timeout=60)
    assert_recorded_once(row, marker, "results-refused")
    assert (row.status, row.error_code) == (Status.FAILED, "RESULT_NOT_STORABLE"), (row.status, row.message)
    assert row.message.startswith("The outcome (SUCCEEDED: ) could not be stored: DataError: ")
    assert "refused by a check of the test" in row.message
    assert row.result is None and row.retry_count == 0 and row.success is False
    job = CronJob.objects.get(code="R005")
    assert job.last_status == Status.FAILED and job.consecutive_failures == 1


def test_in_a_callers_transaction_a_refused_outcome_leaves_the_transaction_usable(refusing_database):
    """An in-process run inside the transaction a test case wraps a test in (the one transaction an
    in-process run runs inside; any other is refused, tests/test_in_transaction.py): the refused
    write is rolled back to a savepoint, the minimal outcome is written, and the transaction goes on."""
    job, _ = make_job(pattern="always", overlap="allow")
    test_case = transaction.atomic()
    test_case._from_testcase = True  # as Django's TestCase marks the transaction it wraps a test in
    with test_case:
        outcome = runs.execute(job, SLOT, lambda run: {"refuse_me": float("nan")}, trigger=Trigger.MANUAL)
        assert outcome.execution_id is not None
        row = CronExecution.objects.get(id=outcome.execution_id)
        assert (row.status, row.error_code, row.result) == (Status.FAILED, "RESULT_NOT_STORABLE", None)
        assert outcome.status == Status.FAILED and outcome.error_code == "RESULT_NOT_STORABLE"
    assert CronExecution.objects.get(id=outcome.execution_id).status == Status.FAILED



def _soft_limit_during_the_write(started: Any, broker: Any, marker: Path, task: Any, code: str,
                                 label: str) -> tuple[Any, int]:
    """Hold the job's row from the test while the body ends, so the outcome write waits on it;
    release it only after the worker reported the soft time limit."""
    worker = started()
    execution_id = enqueue(task, broker)
    wait_for(lambda: bool(bodies(marker, f"{label}-started")), what="the body to start")
    holder = lock_job_row(code)
    try:
        (marker.parent / "row-locked").touch()
        wait_for(lambda: bool(bodies(marker, f"{label}-body-done")), what="the body to end")
        wait_for(lambda: "Soft time limit (3" in worker.output(), timeout=30,
                 what="the soft time limit to land while the outcome write waits")
        with connection.cursor() as cursor:  # the write is still waiting for the row
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                           " AND wait_event_type = 'Lock'")
            assert cursor.fetchone()[0] >= 1, "the outcome write was not waiting on the row"
    finally:
        holder.rollback()
        holder.close()
    return worker, execution_id


def test_a_soft_time_limit_landing_during_the_final_write_does_not_lose_the_outcome(started, broker, marker):
    worker, execution_id = _soft_limit_during_the_write(started, broker, marker, jobs.results_soft_write, "R010",
                                                        "soft-write")
    row = final(execution_id)
    assert row.status == Status.SUCCEEDED, (row.status, row.error_code, row.message)
    assert row.message == "finished before the soft limit" and row.retry_count == 0
    wait_for(lambda: "succeeded in" in worker.output(), timeout=30, what="Celery to see the task succeed")
    assert "SoftTimeLimitExceeded" not in worker.output().split("Soft time limit (3", 1)[1]
    assert len(bodies(marker, "soft-write-started")) == 1
    assert CronJob.objects.get(code="R010").last_status == Status.SUCCEEDED


def test_a_soft_time_limit_landing_during_the_retry_write_keeps_the_retry(started, broker, marker):
    _, execution_id = _soft_limit_during_the_write(started, broker, marker, jobs.results_soft_retry, "R011",
                                                   "soft-retry")
    row = final(execution_id)
    assert row.status == Status.SUCCEEDED, (row.status, row.error_code, row.message)
    assert attempt_log(row) == [(Status.FAILED, "ConnectionError"), (Status.SUCCEEDED, "")]
    assert [line.split()[1] for line in bodies(marker, "soft-retry-started")] == ["attempt=1", "attempt=2"]


@pytest.fixture(autouse=True)
def _no_stale_lock_file(marker: Path) -> None:
    (marker.parent / "row-locked").unlink(missing_ok=True)
