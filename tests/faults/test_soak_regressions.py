"""Defects the nemesis soak (``scripts/soak``, ``tests/soak``) found, each reproduced on real
processes against the real PostgreSQL."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connection

from cron_celery.models import Alert, CronExecution, CronJob, Status
from cron_celery.run import backfill
from tests.conftest import ROOT, Queue, db_now, lock_job_row, manage, subprocess_env, wait_for
from tests.jobsapp import jobs_buffer
from tests.workers import Worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def reconcile_pass() -> None:
    """One reconciler pass in a real ``manage.py reconcile_cron`` process: slots more than a second
    overdue are late, and failures alert a webhook (whose delivery task only goes to the queue)."""
    result = manage("reconcile_cron", env=subprocess_env(CRON_TEST_MISSED_GRACE="1",
                                                         CRON_TEST_WEBHOOK_URL="http://127.0.0.1:9/hook"))
    assert result.returncode == 0, result.stdout + result.stderr


def missed_alerts(job: CronJob) -> list[int]:
    return list(Alert.objects.filter(job=job, event="MISSED").order_by("id").values_list("execution_id", flat=True))


def test_a_beat_outage_alerts_missed_once_however_many_reconciler_passes_record_its_slots(queue: Queue) -> None:
    """While no beat runs, every reconciler pass records the slots that became overdue since the
    last one MISSED; the outage alerts once (docs/notifications.md: one alert per job and outage),
    not once per pass. Once the job has run again, the next outage alerts again.
    (Before: the soak saw a one-second job alert MISSED at every pass of a one-second reconciler.)"""
    job = CronJob.objects.create(name="outage", code="OUTAGE1", task="tests.soak.nothing", pattern="standard",
                                 overlap="skip", catch_up="none", schedule="every 1s",
                                 next_run_at=db_now().replace(microsecond=0) - dt.timedelta(seconds=5))
    reconcile_pass()
    first = CronExecution.objects.filter(job=job, status=Status.MISSED).count()
    assert first >= 3
    assert len(missed_alerts(job)) == 1
    time.sleep(2.5)  # two more slots become overdue
    reconcile_pass()
    assert CronExecution.objects.filter(job=job, status=Status.MISSED).count() > first
    assert len(missed_alerts(job)) == 1, "a second MISSED alert for the same outage"

    # The job ran (a slot after the missed ones started): that outage is over.
    ran = CronExecution.objects.filter(job=job).order_by("-slot").values_list("slot", flat=True)[0]
    CronExecution.objects.create(job=job, task_code=job.code, task_name=job.name, slot=ran + dt.timedelta(seconds=1),
                                 execution_date=ran.date(), run_number=1, status=Status.SUCCEEDED, trigger="BEAT",
                                 started=db_now(), ended=db_now(), completed=True, success=True)
    CronJob.objects.filter(id=job.id).update(last_run_at=db_now(), next_run_at=ran + dt.timedelta(seconds=2))
    time.sleep(2.5)
    reconcile_pass()
    alerted = missed_alerts(job)
    assert len(alerted) == 2, "a new outage after a run alerts again"
    newest = CronExecution.objects.filter(job=job, status=Status.MISSED).order_by("-slot").first()
    assert newest is not None and alerted[-1] == newest.id


def test_a_stranded_execution_that_starts_waiting_while_the_reconciler_decides_is_not_recorded_lost(
        queue: Queue) -> None:
    """The reconciler reads a stranded catch-up slot sent its last time, and decides to record it
    LOST; before it writes, the slot's last copy arrives and its claim, meeting the job's live run,
    marks it waiting (its message arrived: ``republished`` starts again). The reconciler's write must
    see that the execution is no longer stranded and leave it waiting: written LOST, a slot that was
    delivered never runs. (Before: the hour-long soak recorded eleven such slots LOST NOT_DELIVERED
    'after 0 sends'.) The pass runs in a real ``reconcile_cron`` process; the test holds the job's row
    so the pass waits between its read and its write, and writes what the claim writes then."""
    now = db_now()
    job = CronJob.objects.create(name="stranded-wait", code="STRAND1", task="tests.soak.nothing", pattern="always",
                                 overlap="skip", catch_up="all", schedule="every 60s",
                                 next_run_at=now + dt.timedelta(seconds=60))
    execution = CronExecution.objects.create(
        job=job, task_code=job.code, task_name=job.name, slot=now - dt.timedelta(seconds=30),
        execution_date=now.date(), run_number=1, status=Status.PENDING, trigger="CATCH_UP", republished=3,
        celery_task_id="6f1d4b1e-0000-4000-8000-000000000001", lease_until=now - dt.timedelta(seconds=20))
    holder = lock_job_row(job.code)
    try:
        reconciler = subprocess.Popen(
            [sys.executable, "-m", "django", "reconcile_cron"], cwd=ROOT, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, env=subprocess_env(CRON_TEST_PENDING_GRACE="5"))
        wait_for(lambda: _waiting_on_a_lock() or reconciler.poll() is not None, timeout=60,
                 what="the reconciler's write to wait for the job's row")
        assert reconciler.poll() is None, f"the pass ended without waiting for the row: {reconciler.stdout}"
        # What the claim of the slot's arriving copy writes, under the job's row, when it meets a live run.
        holder.execute("UPDATE cron_celery_cronexecution SET waiting_since = coalesce(waiting_since, now()),"
                       " lease_until = now(), republished = 0, message = 'Waiting: another execution of this"
                       " job is running; this one runs when it ends.' WHERE id = %s", [execution.id])
        holder.commit()
        output, _ = reconciler.communicate(timeout=60)
        assert reconciler.returncode == 0, output
    finally:
        holder.rollback()
        holder.close()
    execution.refresh_from_db()
    assert execution.status == Status.PENDING, (
        f"recorded {execution.status} {execution.error_code}: {execution.message!r} although its copy arrived "
        "and it waits for the job's live run")
    assert execution.waiting_since is not None



def _waiting_on_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                       " AND wait_event_type = 'Lock'")
        row = cursor.fetchone()
    return bool(row and row[0] >= 1)


def test_a_run_of_a_slot_whose_message_could_not_be_sent_does_not_use_the_slot_up(tmp_path: Path,
                                                                                  marker: Path) -> None:
    """A person sends a slot of a standard job twice (``run_cron_task --enqueue``, real processes); the
    second send meets a broker that is down, so its execution is closed FAILED (PUBLISH_FAILED) and
    never runs. The first message then reaches a worker: the slot never ran, so it runs. (Before: the
    slot check counted the unsent run as the slot's failed run, and the delivered one was SKIPPED
    ALREADY_RAN — a slot asked for twice, run never; the soak found it, seed 3.)"""
    slot = "2026-11-20T01:00Z"
    first = manage("run_cron_task", "nightly-report", "--at", slot, "--enqueue")
    assert first.returncode == 0, first.stdout + first.stderr
    refused = manage("run_cron_task", "nightly-report", "--at", slot, "--enqueue",
                     env=subprocess_env(CRON_TEST_BROKER_URL="redis://127.0.0.1:1/0"))
    assert refused.returncode == 1, refused.stdout + refused.stderr
    sent, unsent = CronExecution.objects.filter(task_code="T107").order_by("id")
    assert (unsent.status, unsent.error_code, unsent.started) == (Status.FAILED, "PUBLISH_FAILED", None)
    worker = Worker(tmp_path, {"CRON_TEST_MARKER": str(marker)}).start()
    try:
        wait_for(lambda: CronExecution.objects.get(id=sent.id).completed, timeout=60,
                 what="the delivered run to be decided")
    finally:
        worker.stop()
    decided = CronExecution.objects.get(id=sent.id)
    assert (decided.status, decided.skip_reason) == (Status.SUCCEEDED, ""), (
        f"{decided.status} {decided.skip_reason}: {decided.message!r}")


def test_a_run_that_finds_its_job_free_does_not_go_before_older_runs_that_wait(tmp_path: Path, marker: Path) -> None:
    """Three backfill slots of an overlap-skip job; the two older ones wait (as after they met a live run
    whose worker died before it sent them on). The newest one's message reaches a real worker while the
    job is free: it must not run before them — the slots run oldest first (docs/concepts.md), as the
    hour-long soak expects of S05's catch-up slots (seed 2027: slot 19:28:28 ran 22 minutes late, after
    newer slots, and hundreds were left waiting at the end). Before (failed on 8731fda, as a strict
    xfail): the newest ran first; now it waits behind them and sends the oldest."""
    job = jobs_buffer.hourly_exclusive.job
    day = dt.datetime(2026, 11, 20, tzinfo=dt.UTC)
    recorded = backfill.record(job, backfill.Plan(slots=[day + dt.timedelta(hours=hour) for hour in range(3)],
                                                  done=[]))
    oldest, older, newest = recorded
    CronExecution.objects.filter(id__in=[oldest.execution_id, older.execution_id]).update(
        waiting_since=db_now(), lease_until=db_now(), message="Waiting: another execution of this job is running.")
    worker = Worker(tmp_path, {"CRON_TEST_MARKER": str(marker), "CRON_TEST_RECONCILE_INTERVAL": "1",
                               "CRON_TEST_PENDING_GRACE": "2"}).start()
    try:
        backfill.publish(job, [newest])
        wait_for(lambda: CronExecution.objects.filter(id__in=[row.execution_id for row in recorded],
                                                      status=Status.SUCCEEDED).count() == 3,
                 timeout=60, what="the three slots to run")
    finally:
        worker.stop()
    started = [CronExecution.objects.get(id=row.execution_id).started for row in recorded]
    times = [moment for moment in started if moment is not None]
    assert len(times) == 3 and times == sorted(times), f"not run oldest first: {[t.isoformat() for t in times]}"
