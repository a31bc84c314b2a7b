"""``max_concurrency=N``: at most N live runs of an overlap-``allow`` job, decided in the claim under
the job's row lock. Real prefork workers with more processes than the limit, real PostgreSQL;
the bodies themselves record when they ran.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from cron_celery.decisions import dispatch
from cron_celery.decisions import jobs as job_rows
from cron_celery.models import CronExecution, Status, Trigger
from cron_celery.run import tasks
from tests.celery_app import app
from tests.conftest import marked, wait_for
from tests.faults.test_buffered import all_final, lock_redis, rows, workers  # noqa: F401 (fixtures)
from tests.jobsapp import jobs_buffer as jobs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

BASE = dt.datetime(2026, 11, 20, tzinfo=dt.UTC)


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The largest number of bodies running at one instant."""
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = highest = 0
    for _, step in events:  # an end at the same instant as a start comes first
        running += step
        highest = max(highest, running)
    return highest


def send_beat_slot(job: Any) -> int:
    """Dispatch one slot of ``job`` as the beat does and send its message; its execution's id."""
    beat_slot = BASE + dt.timedelta(hours=5)
    dispatched = dispatch.dispatch(job=job, job_id=job_rows.job_id(job), expected_next_run_at=None,
                                   next_run_at=beat_slot + dt.timedelta(hours=1), run=[beat_slot], missed=[])
    ((beat_id, slot),) = dispatched.to_publish
    app.send_task(job.task_name, task_id=CronExecution.objects.get(id=beat_id).celery_task_id,
                  headers=tasks.headers(beat_id, slot, Trigger.BEAT))
    return beat_id


def test_eight_deliveries_at_once_run_at_most_three_bodies_and_a_scheduled_slot_over_the_limit_is_skipped(
        workers, marker):  # noqa: F811
    """Eight runs sent at once to eight worker processes: three run, five wait for room and run as
    runs end; a beat slot that arrives while three run is SKIPPED (CONCURRENCY), never a fourth body."""
    workers(concurrency=8, CRON_TEST_SLEEP="2")
    job = jobs.three_at_once.job
    sent = [tasks.send_run(job, BASE + dt.timedelta(minutes=minute), Trigger.ENQUEUE) for minute in range(8)]
    wait_for(lambda: CronExecution.objects.filter(task_code="W006", status=Status.RUNNING).count() == 3,
             what="three runs to start")
    beat_id = send_beat_slot(job)
    wait_for(lambda: all_final("W006", 9), timeout=120, what="nine executions to end")

    found = {row.id: row for row in rows("W006")}
    assert [found[run.execution_id].status for run in sent] == [Status.SUCCEEDED] * 8, [
        (row.slot, row.status, row.skip_reason, row.error_code, row.message, row.attempts) for row in found.values()]
    beat = found[beat_id]
    assert (beat.status, beat.skip_reason) == (Status.SKIPPED, "CONCURRENCY"), (beat.status, beat.message)
    spans = [(float(start), float(end)) for _label, _slot, start, end, _pid in
             (line.split() for line in marked(marker) if line.startswith("three-at-once"))]
    assert len(spans) == 8
    assert most_at_once(spans) == 3  # the limit held, and was used: eight processes could have run all


def _spans(marker: Any, label: str) -> list[tuple[float, float]]:
    return [(float(start), float(end)) for name, _slot, start, end, _pid in
            (line.split() for line in marked(marker)) if name == label]


def test_two_jobs_of_one_concurrency_group_share_its_two_places_across_eight_worker_processes(
        workers, marker):  # noqa: F811
    """Four requested runs of warehouse-load (overlap allow) and three of warehouse-vacuum (overlap
    skip) sent at once to eight worker processes, the ``warehouse`` group allowing two: never more
    than two bodies of the group at once, never two vacuums at once, every requested run ends
    SUCCEEDED, and a beat slot that arrives while the group is full is SKIPPED (CONCURRENCY)."""
    workers(concurrency=8, CRON_TEST_SLEEP="2")
    load, vacuum = jobs.warehouse_load.job, jobs.warehouse_vacuum.job
    sent = [tasks.send_run(job, BASE + dt.timedelta(minutes=minute), Trigger.ENQUEUE)
            for minute, job in enumerate([load, vacuum, load, vacuum, load, vacuum, load])]
    wait_for(lambda: CronExecution.objects.filter(task_code__in=["W007", "W008"], status=Status.RUNNING).count() == 2,
             what="two runs of the group to start")
    beat_id = send_beat_slot(load)
    wait_for(lambda: all_final("W007", 5) and all_final("W008", 3), timeout=120, what="eight executions to end")

    found = {row.id: row for row in rows("W007") + rows("W008")}
    assert [found[run.execution_id].status for run in sent] == [Status.SUCCEEDED] * 7, [
        (row.task_code, row.slot, row.status, row.skip_reason, row.message) for row in found.values()]
    beat = found[beat_id]
    assert (beat.status, beat.skip_reason) == (Status.SKIPPED, "CONCURRENCY"), (beat.status, beat.message)
    assert "concurrency group 'warehouse'" in beat.message, beat.message
    loads, vacuums = _spans(marker, "warehouse-load"), _spans(marker, "warehouse-vacuum")
    assert (len(loads), len(vacuums)) == (4, 3)
    assert most_at_once(loads + vacuums) == 2  # the group's limit held, and was used
    assert most_at_once(vacuums) == 1  # and each job's own limit inside it
