"""Tracked periodic tasks on every worker pool, acknowledged early and late, and on workers that die:
plain Celery tasks, unchanged, each slot claimed before the body and run once. Each slot is sent the
way the beat sends it (``run.tasks.send_run``, the periodic task's own message with the slot's
headers), on the test session's broker or one of the test's own."""

from __future__ import annotations

import datetime as dt
import json
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from cron_celery import reconciler
from cron_celery.beat import schedule_sync
from cron_celery.decisions import dispatch, tracked
from cron_celery.decisions import jobs as job_rows
from cron_celery.declaring import registry
from cron_celery.models import CronExecution, Status, Trigger
from cron_celery.run import tasks
from tests.celery_app import app
from tests.conftest import marked, wait_for
from tests.faults.test_retries import broker, started  # noqa: F401  (fixtures)
from tests.faults.test_revoke import control
from tests.redis_servers import RedisServer
from tests.settings import CRON_CELERY
from tests.workers import Worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
TASKS = "tests.jobsapp.tasks"
SLOT = dt.datetime(2026, 11, 30, 1, 0, tzinfo=dt.UTC)


def tracked_job(name: str, task: str, args: list[Any], kwargs: dict[str, Any] | None = None) -> registry.Job:
    """A periodic task of the plain ``task``, tracked: its job row linked, its arguments read."""
    every_hour, _ = IntervalSchedule.objects.get_or_create(every=3600, period=IntervalSchedule.SECONDS)
    periodic = PeriodicTask.objects.create(name=name, task=f"{TASKS}.{task}", args=json.dumps(args),
                                           kwargs=json.dumps(kwargs or {}), interval=every_hour)
    with override_settings(CRON_CELERY={**CRON_CELERY, "TRACK_PERIODIC_TASKS": True}):  # this test's every one
        schedule_sync.sync(timezone.now())
    job = registry.loaded(f"PT{periodic.id}", fresh=True)
    assert job is not None and job.tracked
    return job


def send_slot(job: registry.Job, *, connection: Any = None) -> int:
    """The beat's send of ``SLOT``: a PENDING execution, then the periodic task's message with its headers."""
    if connection is None:
        return tasks.send_run(job, SLOT, Trigger.BEAT).execution_id
    execution_id, _ = dispatch.enqueue(job=job, job_id=job_rows.job_id(job), slot=SLOT, execution_date=SLOT.date(),
                                       trigger=Trigger.BEAT)
    contents = tracked.contents(job.code)
    sent = app.send_task(contents.task, args=contents.args, kwargs=contents.kwargs, connection=connection,
                         headers={**tasks.headers(execution_id, SLOT, Trigger.BEAT), tasks.HEADER_JOB: job.code})
    dispatch.set_celery_task_id(execution_id, sent.id)
    return execution_id


def bodies(marker: Path, prefix: str) -> Counter[str]:
    return Counter(" ".join(line.split()[:-2]) for line in marked(marker) if line.startswith(prefix))


@pytest.mark.parametrize("acks_late", ["0", "1"], ids=["acks-early", "acks-late"])
@pytest.mark.parametrize("pool", ["prefork", "solo", "threads"])
def test_every_pool_claims_a_tracked_slot_once_and_keeps_its_own_retries(tmp_path, marker, pool, acks_late):
    """A slot sent twice (a second send of the same execution) runs its body once and the second
    delivery is ignored; a task's own ``self.retry()`` is an attempt of the same execution; on the
    prefork, solo and threads pools, with ``task_acks_late`` off and on."""
    worker = Worker(tmp_path, {"CRON_TEST_MARKER": str(marker), "CRON_TEST_ACKS_LATE": acks_late}, pool=pool,
                    concurrency=1 if pool == "solo" else 2).start()
    try:
        mark = tracked_job(f"{pool} mark", "plain_mark", [pool])
        retrying = tracked_job(f"{pool} retry", "plain_retry", [pool], {"fail_times": 1})
        once = send_slot(mark)
        row = CronExecution.objects.get(id=once)
        tasks.send(app, mark.task_name, execution_id=once, slot=SLOT, trigger=Trigger.BEAT)  # the same slot again
        again = send_slot(retrying)
        wait_for(lambda: CronExecution.objects.filter(id__in=[once, again], completed=True).count() == 2, timeout=60,
                 what="both tracked slots to finish")
        wait_for(lambda: worker.output().count("ignored") >= 1, timeout=30, what="the second delivery to be ignored")
    finally:
        worker.stop()
    assert bodies(marker, "plain-mark ") == {f"plain-mark {pool}": 1}
    row = CronExecution.objects.get(id=once)
    assert (row.status, row.params, row.retry_count) == (Status.SUCCEEDED, {"args": [pool], "kwargs": {}}, 0)
    retried = CronExecution.objects.get(id=again)
    assert (retried.status, retried.retry_count, retried.message) == (Status.SUCCEEDED, 1, f"{pool} done after 1 "
                                                                                        "retries")
    assert [(attempt["status"], attempt.get("error_code", "")) for attempt in retried.attempts] == [
        (Status.FAILED, "ConnectionError"), (Status.SUCCEEDED, "")]
    assert CronExecution.objects.count() == 2


def test_a_tracked_slot_finished_before_its_worker_died_is_not_run_again_by_the_redelivery(
        started, broker: RedisServer, marker):  # noqa: F811
    """Acknowledged late, the worker dies after the slot's outcome is committed and before its ack: the
    message comes back after the visibility timeout to the next worker, which does nothing with it."""
    dying = started(pool="solo", CRON_TEST_DIE_AFTER_COMMIT="1", CRON_TEST_VISIBILITY_TIMEOUT="3",
                    CRON_TEST_ACKS_LATE="1")
    job = tracked_job("dies after commit", "plain_commit_then_die", ["x"])
    with app.connection_for_write(broker.url) as connection:
        execution_id = send_slot(job, connection=connection)
    assert dying.proc is not None
    dying.proc.wait(timeout=60)
    row = CronExecution.objects.get(id=execution_id)
    assert row.status == Status.SUCCEEDED
    assert broker.client().hlen("unacked") == 1, "the worker died holding the message unacknowledged"
    second = started(CRON_TEST_VISIBILITY_TIMEOUT="3", CRON_TEST_ACKS_LATE="1")
    wait_for(lambda: "ignored" in second.output(), timeout=60, what="the redelivered message to be ignored")
    wait_for(lambda: broker.client().hlen("unacked") == 0, timeout=20, what="the redelivery to be acknowledged")
    again = CronExecution.objects.get(id=execution_id)
    assert (again.status, again.ended, again.fence) == (row.status, row.ended, row.fence)
    assert bodies(marker, "plain-commit-then-die ") == {"plain-commit-then-die x": 1}, "the body ran twice"


def test_a_tracked_slot_whose_worker_is_killed_mid_body_is_recorded_lost_by_the_reconciler(
        started, broker: RedisServer, marker):  # noqa: F811
    """Acknowledged late, the whole worker is SIGKILLed while the body sleeps (no parent is left to say
    so). The message comes back to the next worker before the run's lease has run out: that delivery
    does nothing (the slot is RUNNING elsewhere, as far as anyone can tell). Once the lease has run
    out, the reconciler records the attempt LOST, as it does a cron job's (a tracked task retries only
    itself: the reconciler sends no retry of its own), and the body never ran a second time."""
    first = started(CRON_TEST_VISIBILITY_TIMEOUT="3", CRON_TEST_ACKS_LATE="1", CRON_TEST_LEASE_SECONDS="5",
                    CRON_TEST_LOCK_TTL="5")
    job = tracked_job("napping", "plain_nap", ["n", 3])
    with app.connection_for_write(broker.url) as connection:
        execution_id = send_slot(job, connection=connection)
    wait_for(lambda: bodies(marker, "plain-nap ") == {"plain-nap n start": 1}, timeout=60, what="the body to start")
    first.signal(signal.SIGKILL)
    assert first.proc is not None
    first.proc.wait(timeout=30)
    assert CronExecution.objects.get(id=execution_id).status == Status.RUNNING
    second = started(CRON_TEST_VISIBILITY_TIMEOUT="3", CRON_TEST_ACKS_LATE="1", CRON_TEST_LEASE_SECONDS="5",
                     CRON_TEST_LOCK_TTL="5")
    wait_for(lambda: "ignored" in second.output(), timeout=60, what="the redelivery to find the slot running")
    passes: list[str] = []

    def ended_lost() -> bool:  # passes until one of them ends the attempt (whichever rule finds it first)
        passes.append(str(reconciler.run_pass()))
        return CronExecution.objects.get(id=execution_id).completed

    try:
        wait_for(ended_lost, timeout=60, what="the reconciler to find the lease run out", poll=0.5)
    except AssertionError as timed_out:
        raise AssertionError(f"{timed_out}; its last passes: {passes[-3:]}") from None
    row = CronExecution.objects.get(id=execution_id)
    assert (row.status, row.completed) == (Status.LOST, True), (row.status, row.message, row.attempts)
    assert bodies(marker, "plain-nap ") == {"plain-nap n start": 1}
    assert CronExecution.objects.count() == 1


def test_a_tracked_run_revoked_with_terminate_is_recorded_revoked_at_once(started, broker: RedisServer,  # noqa: F811
                                                                          marker):
    """``celery control terminate`` on a tracked task's run: the worker's parent records it REVOKED
    before the child is signalled, as for a cron job's run; the body never runs again."""
    started()
    job = tracked_job("long nap", "plain_nap", ["long", 60])
    with app.connection_for_write(broker.url) as connection:
        execution_id = send_slot(job, connection=connection)
    wait_for(lambda: bodies(marker, "plain-nap ") == {"plain-nap long start": 1}, timeout=60, what="the body")
    task_id = CronExecution.objects.get(id=execution_id).celery_task_id
    control(broker, "terminate", "SIGTERM", task_id)
    wait_for(lambda: CronExecution.objects.get(id=execution_id).completed, timeout=30, what="the revoked run to end")
    row = CronExecution.objects.get(id=execution_id)
    assert (row.status, row.error_code) == (Status.REVOKED, "REVOKED"), (row.status, row.message)
    assert bodies(marker, "plain-nap ") == {"plain-nap long start": 1}
