"""Jobs through a real Celery worker (in-thread) on the Redis broker and real PostgreSQL."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest
from celery import signals
from celery.contrib.testing.worker import start_worker

from cron_celery import models, slots
from cron_celery.decisions import dispatch
from cron_celery.decisions import jobs as job_rows
from cron_celery.models import CronExecution, Status, Trigger
from cron_celery.run import tasks
from tests.celery_app import app
from tests.conftest import marked, wait_for
from tests.jobsapp import tasks as jobs

pytestmark = pytest.mark.django_db(transaction=True)

SLOT = dt.datetime(2026, 11, 29, 1, 0, tzinfo=dt.UTC)


@pytest.fixture
def worker() -> Iterator[None]:
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False,
                      loglevel="WARNING", shutdown_timeout=30):
        yield


@pytest.fixture
def signals_seen() -> Iterator[dict[str, list[str]]]:
    seen: dict[str, list[str]] = {"success": [], "failure": []}

    def on_success(sender=None, **kwargs):
        seen["success"].append(sender.name)

    def on_failure(sender=None, **kwargs):
        seen["failure"].append(sender.name)

    signals.task_success.connect(on_success, weak=False)
    signals.task_failure.connect(on_failure, weak=False)
    yield seen
    signals.task_success.disconnect(on_success)
    signals.task_failure.disconnect(on_failure)


def finished(**filters):
    return lambda: CronExecution.objects.filter(completed=True, **filters).exists()


def enqueue(task_job, slot=SLOT, task_id=None, **extra_headers):
    job = task_job.job
    execution_id, _ = dispatch.enqueue(job=job, job_id=job_rows.job_id(job), slot=slot,
                                     execution_date=slot.date(), trigger=Trigger.ENQUEUE)
    headers = {tasks.HEADER_SLOT: slots.iso(slot), tasks.HEADER_EXECUTION: execution_id,
               tasks.HEADER_TRIGGER: Trigger.ENQUEUE, **extra_headers}
    result = app.send_task(job.task_name, headers=headers, task_id=task_id)
    return execution_id, result.id


def test_delay_with_a_slot_runs_and_records_the_execution(worker, marker):
    result = jobs.calc_commission.delay(slot="2026-11-29T01:00:00Z")
    wait_for(finished(task_name="calc-commission"), what="the run")
    row = CronExecution.objects.get(task_name="calc-commission")
    assert (row.status, row.trigger, row.slot, row.celery_task_id) == (
        Status.SUCCEEDED, Trigger.DIRECT, SLOT, result.id)
    assert row.worker and row.pid and row.fence
    assert row.duration is not None and row.message == "Processed 120 records"
    assert len(marked(marker)) == 1


def test_a_class_style_job_and_an_async_job_run_on_the_worker(worker):
    jobs.SyncExternalAPI.delay(execution_date="2026-11-29")
    jobs.async_job.delay(slot="2026-11-29T05:00")
    wait_for(finished(task_name="sync-external-api"), what="the class job")
    wait_for(finished(task_name="async-job"), what="the async job")
    sync = CronExecution.objects.get(task_name="sync-external-api")
    assert (sync.status, sync.message, sync.execution_date) == (
        Status.SUCCEEDED, "Sync completed for 2026-11-29", dt.date(2026, 11, 29))
    assert CronExecution.objects.get(task_name="async-job").message.startswith("async ok T101:")


def test_an_enqueued_execution_is_claimed_in_place_by_the_worker(worker, marker):
    execution_id, task_id = enqueue(jobs.calc_commission)
    wait_for(finished(id=execution_id), what="the enqueued run")
    row = CronExecution.objects.get(id=execution_id)
    assert (row.status, row.trigger, row.celery_task_id) == (Status.SUCCEEDED, Trigger.ENQUEUE, task_id)
    assert CronExecution.objects.count() == 1


def test_a_redelivered_message_of_a_finished_execution_does_nothing_and_raises_nothing(
    worker, marker, signals_seen
):
    execution_id, task_id = enqueue(jobs.calc_commission)
    wait_for(finished(id=execution_id), what="the first delivery")
    before = list(CronExecution.objects.values())
    # The broker hands the very same message (same task id, same headers) to a worker again.
    app.send_task(jobs.calc_commission.name, task_id=task_id, headers={
        tasks.HEADER_SLOT: slots.iso(SLOT), tasks.HEADER_EXECUTION: execution_id,
        tasks.HEADER_TRIGGER: Trigger.ENQUEUE})
    wait_for(lambda: len(signals_seen["success"]) == 2, what="the redelivery to be handled")
    assert list(CronExecution.objects.values()) == before
    assert signals_seen["failure"] == []
    assert len(marked(marker)) == 1


def test_a_failing_job_is_recorded_and_reported_to_celery_as_a_failure(worker, signals_seen):
    jobs.boom.delay(slot="2026-11-29T02:00")
    wait_for(finished(task_name="boom"), what="the failing run")
    wait_for(lambda: signals_seen["failure"] == [jobs.boom.name], what="Celery's task_failure")
    row = CronExecution.objects.get(task_name="boom")
    assert (row.status, row.success, row.error_code) == (Status.FAILED, False, "RuntimeError")


def test_a_huge_exception_does_not_take_the_worker_down(worker, monkeypatch):
    monkeypatch.setenv("CRON_TEST_BOOM_SIZE", str(10 * 1024 * 1024))
    jobs.boom.delay(slot="2026-11-29T03:00")
    wait_for(finished(task_name="boom"), what="the huge failure")
    monkeypatch.setenv("CRON_TEST_BOOM_SIZE", "5")
    jobs.boom.delay(slot="2026-11-29T04:00")
    wait_for(lambda: CronExecution.objects.filter(task_name="boom", completed=True).count() == 2,
             what="the worker to go on")
    big = CronExecution.objects.get(task_name="boom", slot=SLOT.replace(hour=3))
    assert big.status == Status.FAILED and len(big.message) < 10_100


def test_a_skipped_slot_is_recorded_when_sent_twice(worker, marker):
    jobs.calc_commission.delay(slot="2026-11-29T01:00Z")
    wait_for(finished(task_name="calc-commission"), what="first run")
    jobs.calc_commission.delay(slot="2026-11-29T01:00Z")
    wait_for(lambda: CronExecution.objects.filter(task_name="calc-commission").count() == 2, what="the skip")
    skip = CronExecution.objects.get(task_name="calc-commission", run_number=2)
    assert (skip.status, skip.skip_reason) == (Status.SKIPPED, models.SkipReason.ALREADY_RAN)
    assert len(marked(marker)) == 1


def test_run_cron_task_enqueue_sends_the_slot_to_the_workers(worker, marker):
    from tests.conftest import manage

    result = manage("run_cron_task", "calc-commission", "--at", "2026-11-29T06:00", "--enqueue")
    assert result.returncode == 0, result.stderr
    assert "sent to the workers" in result.stdout
    wait_for(finished(task_name="calc-commission"), what="the enqueued run")
    row = CronExecution.objects.get(task_name="calc-commission")
    assert (row.status, row.trigger, row.slot) == (Status.SUCCEEDED, Trigger.ENQUEUE, SLOT.replace(hour=6))
    assert row.celery_task_id and row.celery_task_id in result.stdout
    assert len(marked(marker)) == 1
