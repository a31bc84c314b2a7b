"""What a pause and a live run do to the slots somebody asked for, on real processes: a real
``celery worker`` (prefork), a real beat where the schedule matters, real PostgreSQL and Redis.

- A regular beat slot that meets a running backfill slot is ``SKIPPED`` ``OVERLAP`` (the overlap
  policy, kept on purpose), and the backfill runs on.
- A pause holds the backfill slots that wait: none is ``SKIPPED`` ``PAUSED``, however long the pause
  lasts; resumed, each runs once, in order — also when the resume comes while no worker runs and the
  worker that held them was killed.
- django-celery-beat's ``one_off``: the task's last slot that meets a live run of its job waits for
  it, then runs once; the task stays disabled and sends no other slot.

Each job body waits for a gate file the test opens (``CRON_TEST_GATE``), so what overlaps what is
decided by the test, never by a race.
"""

from __future__ import annotations

import datetime as dt
import itertools
from pathlib import Path

import pytest
from django.db import connection
from django_celery_beat.models import PeriodicTask

from cron_celery.decisions import dispatch, leadership
from cron_celery.decisions import jobs as job_rows
from cron_celery.models import CronExecution, CronJob, SkipReason, Status, Trigger
from cron_celery.run import backfill, tasks
from tests.celery_app import app
from tests.conftest import manage, marked, subprocess_env, wait_for
from tests.faults import test_buffered as buffered
from tests.faults.test_beat import start_beat, stop
from tests.jobsapp import jobs_buffer as jobs
from tests.redis_servers import RedisServer
from tests.workers import Worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

lock_redis = buffered.lock_redis
workers = buffered.workers
DAY = dt.datetime(2026, 11, 20, tzinfo=dt.UTC)
DASHBOARD = "/admin/cron_celery/cronjob/"


@pytest.fixture
def gate(tmp_path: Path) -> Path:
    """The file the job bodies wait for: ``gate.touch()`` lets them end."""
    return tmp_path / "gate"


def backfilled(count: int) -> list[CronExecution]:
    """Backfill ``count`` hourly slots of hourly-exclusive (W001), the first at 00:00 on DAY."""
    job = jobs.hourly_exclusive.job
    slots = [DAY + dt.timedelta(hours=hour) for hour in range(count)]
    sent = backfill.send(job, backfill.Plan(slots=slots, done=[]))
    return [CronExecution.objects.get(id=item.execution_id) for item in sent]


def reconciled_since(moment: dt.datetime | None, seconds: float) -> bool:
    """Whether a reconciler pass finished at least ``seconds`` after ``moment`` (the database's clock)."""
    assert moment is not None
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT lease_until FROM {leadership.LEASE} WHERE name = %s", [leadership.RECONCILED])
        found = cursor.fetchone()
    return found is not None and found[0] >= moment + dt.timedelta(seconds=seconds)


def status_of(execution_id: int) -> CronExecution:
    return CronExecution.objects.get(id=execution_id)


def one_runs_the_others_wait(found: list[CronExecution]) -> tuple[CronExecution, list[CronExecution]]:
    """Wait until one of these executions runs and the others wait for it (a worker with several
    processes may start any of them first); (the running one, the waiting ones, oldest first)."""
    wait_for(lambda: any(status_of(row.id).status == Status.RUNNING for row in found),
             what="a backfill slot to start")
    (live,) = [row for row in found if status_of(row.id).status == Status.RUNNING]
    others = [row for row in found if row.id != live.id]
    wait_for(lambda: all(status_of(row.id).waiting_since is not None for row in others),
             what="the other backfill slots to wait for it")
    return live, others


def ran_once_each(marker: Path, live: CronExecution, others: list[CronExecution]) -> None:
    """Every slot succeeded, its body once; the live one first, then those that waited, oldest first,
    never two at once."""
    found = [status_of(row.id) for row in [live, *others]]
    assert [(row.status, row.skip_reason) for row in found] == [(Status.SUCCEEDED, "")] * len(found), [
        (row.slot, row.status, row.skip_reason, row.message) for row in found]
    bodies = [line.split()[1] for line in marked(marker) if line.startswith("hourly-exclusive")]
    assert bodies == [row.slot.isoformat() for row in found], "each slot's body once, in that order"
    for before, after in itertools.pairwise(found):
        assert before.ended <= after.started, "two runs of the overlap-skip job overlapped"


def test_a_regular_slot_that_meets_a_running_backfill_slot_is_skipped_overlap_and_the_backfill_runs_on(
        workers, marker, gate):
    """The overlap policy, kept: a BEAT slot meeting the backfill's live run is skipped — one SKIPPED
    row, of that slot — and every backfill slot still runs, one at a time. The skip's reason is OVERLAP,
    or LOCK_UNAVAILABLE when the job's Redis lock told the claim first (the same skip)."""
    workers(concurrency=2, CRON_TEST_GATE=str(gate))
    live, others = one_runs_the_others_wait(backfilled(3))
    job = jobs.hourly_exclusive.job
    regular = DAY + dt.timedelta(days=1)
    dispatched = dispatch.dispatch(job=job, job_id=job_rows.job_id(job), expected_next_run_at=None,
                                   next_run_at=regular + dt.timedelta(hours=1), run=[regular], missed=[])
    ((beat_id, _),) = dispatched.to_publish
    app.send_task(job.task_name, task_id=status_of(beat_id).celery_task_id,
                  headers=tasks.headers(beat_id, regular, Trigger.BEAT))
    wait_for(lambda: status_of(beat_id).completed, what="the regular slot to be decided")
    assert status_of(live.id).status == Status.RUNNING, "the regular slot did meet the live backfill slot"
    gate.touch()
    wait_for(lambda: all(status_of(row.id).completed for row in [live, *others]), timeout=60,
             what="the backfill to finish")
    skipped = list(CronExecution.objects.filter(task_code="W001", status=Status.SKIPPED))
    assert [(row.id, row.slot, row.trigger) for row in skipped] == [(beat_id, regular, Trigger.BEAT)]
    assert skipped[0].skip_reason in (SkipReason.OVERLAP, SkipReason.LOCK_UNAVAILABLE), skipped[0].skip_reason
    ran_once_each(marker, live, others)


def test_a_pause_holds_the_waiting_backfill_slots_and_the_resume_runs_each_once_in_order(
        workers, marker, gate, admin_client):
    """Four backfill slots for a worker taking one message at a time; the job is paused (the admin's
    Pause) while the first runs. The three others reach the worker during the pause and are held,
    PENDING and waiting — not SKIPPED PAUSED — through reconciler passes (every second, a one-second
    PENDING_GRACE) well after the first ended. Resumed (the admin's Resume), each runs once, in order."""
    workers(concurrency=1, CRON_TEST_GATE=str(gate), CRON_TEST_RECONCILE_INTERVAL="1", CRON_TEST_PENDING_GRACE="1")
    first, *others = backfilled(4)  # one message at a time: the oldest slot runs first
    job_id = first.job_id
    wait_for(lambda: status_of(first.id).status == Status.RUNNING, what="the first backfill slot to start")
    admin_client.post(DASHBOARD, {"action": "pause", "apply": "1", "_selected_action": [job_id]})
    assert CronJob.objects.get(id=job_id).paused
    gate.touch()
    wait_for(lambda: status_of(first.id).completed, what="the first slot to end")
    wait_for(lambda: all(status_of(row.id).waiting_since is not None or status_of(row.id).completed
                         for row in others), what="the other slots to reach the worker")
    ended = status_of(first.id).ended
    wait_for(lambda: reconciled_since(ended, 4), what="reconciler passes well after the first slot ended")
    held = [status_of(row.id) for row in others]
    assert [(row.status, row.skip_reason) for row in held] == [(Status.PENDING, "")] * 3, [
        (row.slot, row.status, row.skip_reason, row.message) for row in held]
    assert all(row.waiting_since is not None and "paused" in row.message for row in held), [r.message for r in held]
    admin_client.post(DASHBOARD, {"action": "resume", "_selected_action": [job_id]})
    wait_for(lambda: all(status_of(row.id).completed for row in others), timeout=60,
             what="the held slots to run after the resume")
    ran_once_each(marker, first, others)


def test_held_slots_survive_a_killed_worker_and_a_resume_while_no_worker_runs(tmp_path, marker, gate, lock_redis):
    """Three backfill slots for a worker running two at a time: two wait for the one that runs; the
    job is paused (its row set directly, as a disabled periodic task does) and that run ends. The
    worker is killed, the job resumed while no worker runs (nobody sends anything then), and a new
    worker's reconciler sends the held slots: each runs once, in order."""
    env = {"CRON_TEST_MARKER": str(marker), "CRON_TEST_LOCK_MASTERS": lock_redis.url, "CRON_TEST_GATE": str(gate),
           "CRON_TEST_RECONCILE_INTERVAL": "1", "CRON_TEST_PENDING_GRACE": "1"}
    first_worker = Worker(tmp_path, env, pool="prefork", concurrency=2).start()
    second_worker: Worker | None = None
    try:
        live, others = one_runs_the_others_wait(backfilled(3))
        CronJob.objects.filter(id=live.job_id).update(paused=True)
        gate.touch()
        wait_for(lambda: status_of(live.id).completed, what="the live slot to end")
        ended = status_of(live.id).ended
        wait_for(lambda: reconciled_since(ended, 3), what="reconciler passes well after the live slot ended")
        first_worker.stop()  # SIGKILL: nothing of it says goodbye
        held = [status_of(row.id) for row in others]
        assert [(row.status, row.skip_reason) for row in held] == [(Status.PENDING, "")] * 2, [
            (row.slot, row.status, row.skip_reason, row.message) for row in held]
        CronJob.objects.filter(id=live.job_id).update(paused=False)  # resumed while no worker runs
        second_worker = Worker(tmp_path, env, pool="prefork", concurrency=2).start()
        wait_for(lambda: all(status_of(row.id).completed for row in others), timeout=60,
                 what="the new worker's reconciler to send the held slots")
    finally:
        first_worker.stop()
        if second_worker is not None:
            second_worker.stop()
    ran_once_each(marker, live, others)


def test_a_one_off_tasks_last_slot_that_meets_a_live_run_waits_runs_once_and_the_task_stays_disabled(
        tmp_path, marker, gate):
    """A two-second overlap-skip job whose periodic task is ``one_off``; a run sent by hand holds the job
    (it waits for the gate) when a beat starts. The beat sends the task's last slot and disables the
    task: that slot waits for the live run instead of being skipped, then runs, once; no other slot is
    sent."""
    lock = RedisServer(tmp_path).start()
    env = {"CRON_TEST_ONE_OFF_WAITS": "1", "CRON_TEST_MARKER": str(marker), "CRON_TEST_LOCK_MASTERS": lock.url,
           "CRON_TEST_GATE": str(gate)}
    worker: Worker | None = None
    beat = None
    try:
        synced = manage("sync_cron_schedules", env=subprocess_env(**env))
        assert synced.returncode == 0, synced.stderr
        task = PeriodicTask.objects.get(name="once-waits (W010)")
        task.one_off = True
        task.save()
        worker = Worker(tmp_path, env, pool="prefork", concurrency=2).start()
        by_hand = manage("run_cron_task", "once-waits", "--enqueue", env=subprocess_env(**env))
        assert by_hand.returncode == 0, by_hand.stderr
        (manual,) = CronExecution.objects.filter(task_code="W010")
        wait_for(lambda: status_of(manual.id).status == Status.RUNNING, what="the run sent by hand to start")
        beat = start_beat(tmp_path, env, 0)
        wait_for(lambda: CronExecution.objects.filter(task_code="W010").exclude(id=manual.id).exists(), timeout=60,
                 what="the beat to send the one_off task's slot")
        last = CronExecution.objects.filter(task_code="W010").exclude(id=manual.id).get()
        wait_for(lambda: status_of(last.id).waiting_since is not None or status_of(last.id).completed,
                 what="the slot to meet the live run")
        assert status_of(manual.id).status == Status.RUNNING, "the slot did meet the live run"
        gate.touch()
        wait_for(lambda: status_of(manual.id).completed and status_of(last.id).completed, timeout=60,
                 what="both runs to end")
    finally:
        if beat is not None:
            stop(beat)
        if worker is not None:
            worker.stop()
        lock.stop()
    found = list(CronExecution.objects.filter(task_code="W010").order_by("id"))
    assert [(row.trigger, row.status, row.skip_reason) for row in found] == [
        (Trigger.ENQUEUE, Status.SUCCEEDED, ""), (Trigger.BEAT, Status.SUCCEEDED, "")], [
        (row.trigger, row.status, row.skip_reason, row.message) for row in found]
    assert found[1].started >= found[0].ended
    assert not PeriodicTask.objects.get(id=task.id).enabled
    assert CronJob.objects.get(code="W010").paused
    assert len([line for line in marked(marker) if line.startswith("once-waits")]) == 2
