"""The scheduler's write: each slot dispatched once, however many schedulers decide."""

from __future__ import annotations

import datetime as dt
import os
import signal
import threading
import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from cron_celery import beat, catch_up, schedules
from cron_celery.decisions import dispatch
from cron_celery.models import CronExecution, CronJob, Status, Trigger
from tests.conftest import make_job

SLOT = dt.datetime(2026, 11, 29, 10, 0, tzinfo=dt.UTC)
HOUR = dt.timedelta(hours=1)


def set_next(job_id, when):
    CronJob.objects.filter(id=job_id).update(next_run_at=when)


@pytest.mark.django_db
def test_dispatch_inserts_pending_and_missed_rows_and_advances_the_job():
    job, job_id = make_job(catch_up="latest")
    set_next(job_id, SLOT - 2 * HOUR)
    plan = catch_up.plan_catch_up(schedules.cron("0 * * * *"), SLOT - 2 * HOUR, SLOT + dt.timedelta(seconds=5),
                                   "latest")
    done = dispatch.dispatch(job=job, job_id=job_id, expected_next_run_at=SLOT - 2 * HOUR,
                           next_run_at=plan.next_run_at, run=plan.run, missed=plan.missed)
    assert done.advanced and done.missed == 2 and [slot for _, slot in done.to_publish] == [SLOT]
    rows = {row.slot: row for row in CronExecution.objects.filter(job_id=job_id)}
    assert rows[SLOT].status == Status.PENDING and rows[SLOT].trigger == Trigger.BEAT
    assert rows[SLOT].completed is False and rows[SLOT].execution_date == SLOT.date()
    for missed in (SLOT - 2 * HOUR, SLOT - HOUR):
        assert (rows[missed].status, rows[missed].completed, rows[missed].success) == (Status.MISSED, True, None)
    job_row = CronJob.objects.get(id=job_id)
    assert job_row.next_run_at == SLOT + HOUR and job_row.catch_up == "latest"


@pytest.mark.django_db
def test_a_scheduler_with_a_stale_view_writes_nothing():
    job, job_id = make_job()
    set_next(job_id, SLOT)
    first = dispatch.dispatch(job=job, job_id=job_id, expected_next_run_at=SLOT, next_run_at=SLOT + HOUR,
                            run=[SLOT], missed=[])
    second = dispatch.dispatch(job=job, job_id=job_id, expected_next_run_at=SLOT, next_run_at=SLOT + HOUR,
                             run=[SLOT], missed=[])
    assert first.advanced and len(first.to_publish) == 1
    assert second == dispatch.Dispatched(advanced=False, to_publish=[])
    assert CronExecution.objects.filter(job_id=job_id).count() == 1


@pytest.mark.django_db
def test_a_slot_that_already_has_a_row_is_not_published_again():
    job, job_id = make_job()
    dispatch.enqueue(job=job, job_id=job_id, slot=SLOT, execution_date=SLOT.date(), trigger=Trigger.ENQUEUE)
    set_next(job_id, SLOT)
    done = dispatch.dispatch(job=job, job_id=job_id, expected_next_run_at=SLOT, next_run_at=SLOT + HOUR,
                           run=[SLOT], missed=[])
    assert done.advanced and done.to_publish == []
    assert CronJob.objects.get(id=job_id).next_run_at == SLOT + HOUR


@pytest.mark.django_db
def test_due_jobs_lists_only_unpaused_jobs_whose_slot_has_come():
    (_, due), (_, later), (_, paused), (_, unscheduled) = (make_job() for _ in range(4))
    set_next(due, SLOT)
    set_next(later, SLOT + HOUR)
    set_next(paused, SLOT - HOUR)
    CronJob.objects.filter(id=paused).update(paused=True)
    found = {row.job_id: row.next_run_at for row in dispatch.due_jobs(SLOT)}
    assert due in found and later not in found and paused not in found and unscheduled not in found


@pytest.mark.django_db(transaction=True)
def test_two_schedulers_dispatching_at_once_publish_each_slot_once():
    job, job_id = make_job()
    slots = [SLOT + i * HOUR for i in range(20)]
    set_next(job_id, slots[0])
    published: list[list[tuple[int, dt.datetime]]] = [[], []]
    barrier = threading.Barrier(2)

    def scheduler(index):
        try:
            barrier.wait()
            for i, slot in enumerate(slots):
                done = dispatch.dispatch(job=job, job_id=job_id, expected_next_run_at=slot,
                                       next_run_at=slot + HOUR, run=[slot], missed=[])
                published[index] += done.to_publish
                if not done.advanced:
                    # Lost the race for this slot: re-read like a real scheduler would.
                    assert CronJob.objects.get(id=job_id).next_run_at >= slots[i] + HOUR
        finally:
            connection.close()

    threads = [threading.Thread(target=scheduler, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    all_published = sorted(published[0] + published[1], key=lambda row: row[1])
    assert [slot for _, slot in all_published] == slots
    assert CronExecution.objects.filter(job_id=job_id).count() == 20


@pytest.mark.django_db
def test_due_jobs_can_be_limited_to_the_jobs_a_scheduler_knows_and_reports_catch_ups():
    (job, known), (_, forgotten) = make_job(), make_job()
    set_next(known, SLOT - HOUR)
    set_next(forgotten, SLOT - 2 * HOUR)  # older, but no longer declared anywhere
    assert [(row.job_id, row.next_run_at) for row in dispatch.due_jobs(SLOT, limit=1, among=[known])] == [
        (known, SLOT - HOUR)]
    done = dispatch.dispatch(job=job, job_id=known, expected_next_run_at=SLOT - HOUR, next_run_at=SLOT + HOUR,
                           run=[SLOT - HOUR, SLOT], missed=[])
    # Two slots at once are a catch-up, the newest too: each waits for the job's live run.
    assert done.catch_up_ids == frozenset(execution_id for execution_id, _ in done.to_publish)
    assert [CronExecution.objects.get(id=execution_id).trigger for execution_id, _ in done.to_publish] == [
        Trigger.CATCH_UP, Trigger.CATCH_UP]


@pytest.mark.django_db
def test_many_jobs_are_recorded_in_one_statement_and_only_advanced_jobs_get_rows():
    jobs = [make_job() for _ in range(3)]
    for _, job_id in jobs:
        set_next(job_id, SLOT)
    (_, first), (_, stale), (_, paused) = jobs
    CronJob.objects.filter(id=paused).update(paused=True)
    decisions = [
        dispatch.Decision(job_id=first, expected_next_run_at=SLOT, next_run_at=SLOT + 3 * HOUR,
                        run=[SLOT, SLOT + HOUR, SLOT + 2 * HOUR], missed=[], tz=dt.UTC),
        dispatch.Decision(job_id=stale, expected_next_run_at=SLOT - HOUR, next_run_at=SLOT + HOUR,
                        run=[SLOT], missed=[], tz=dt.UTC),
        dispatch.Decision(job_id=paused, expected_next_run_at=SLOT, next_run_at=SLOT + HOUR,
                        run=[SLOT], missed=[], tz=dt.UTC),
    ]
    with CaptureQueriesContext(connection) as queries:
        advanced, publish, missed = dispatch.dispatch_many(decisions)
    assert len(queries) == 1 and advanced == {first} and missed == 0
    assert [(item.job_id, item.slot, item.trigger) for item in publish] == [
        (first, SLOT + hour * HOUR, Trigger.CATCH_UP) for hour in range(3)]
    rows = {row.id: row for row in CronExecution.objects.filter(job_id=first)}
    assert {rows[item.execution_id].celery_task_id for item in publish} == {item.celery_task_id for item in publish}
    assert all(len(item.celery_task_id) == 36 for item in publish)  # chosen before publishing, stored with the row
    assert not CronExecution.objects.filter(job_id__in=[stale, paused]).exists()
    assert CronJob.objects.get(id=paused).next_run_at == SLOT


def test_a_sigterm_during_a_dispatch_round_is_delivered_when_the_round_ends():
    received: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    idle = threading.Event()
    bystander = threading.Thread(target=idle.wait, daemon=True)  # the kernel may pick any thread
    bystander.start()
    try:
        with beat.signals_deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            assert received == []  # a committed row would not be stranded before its publish
        time.sleep(0.01)
        assert received == [signal.SIGTERM]  # delivered once, to the handler that was in place
        assert signal.getsignal(signal.SIGTERM) is not None
    finally:
        idle.set()
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.django_db(transaction=True)
def test_the_periodic_tasks_count_gives_way_to_a_row_someone_holds():
    """An admin's save holding a periodic task's row: the beat's count of what it sent gives up
    within its short lock wait (the beat keeps the counts for its next round), and never waits
    for the save to end."""
    from django.db import OperationalError
    from django_celery_beat.models import PeriodicTask

    from cron_celery.beat import schedule_sync
    from tests.jobsapp import tasks as jobs
    from tests.model.harness import RowHolder

    schedule_sync.sync()
    job = CronJob.objects.get(name=jobs.nightly_report.job.name)
    assert job.periodic_task_id is not None
    holder = RowHolder(f"SELECT 1 FROM {PeriodicTask._meta.db_table} WHERE id = %s FOR UPDATE",
                       [job.periodic_task_id])
    holder.start()
    assert holder.locked.wait(10) and holder.raised is None
    try:
        with pytest.raises(OperationalError, match="lock timeout"):
            dispatch.count_sent({job.id: 2})
    finally:
        holder.release.set()
        holder.join(10)
    dispatch.count_sent({job.id: 2})  # next round, the row free again
    task = PeriodicTask.objects.get(id=job.periodic_task_id)
    assert task.total_run_count == 2 and task.last_run_at is not None
