"""Pauses on real processes: two real beats, a real prefork worker, real PostgreSQL and Redis.

- A pause whose end passes while nobody is around: the beats find the end by their idle tick's one
  query and resume the job at it, by the database's clock; nothing of the job was dispatched during
  the pause; a run somebody asked for during it waited, and runs once after. With no beat at all, a
  reconciler pass (``reconcile_cron``, a real process) ends the pause.
- ``pause_after_failures``: a job failing every slot pauses itself at its third failure in a row,
  says so once (a PAUSED alert to the test's own webhook, naming the failures), sends nothing while
  paused, and runs again once a person resumes it."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Any

import pytest

from cron_celery.decisions import leadership, pauses
from cron_celery.declaring import registry
from cron_celery.models import CronExecution, CronJob, ScheduleChange, Status, Trigger
from cron_celery.run import tasks
from tests.conftest import manage, marked, subprocess_env, wait_for
from tests.faults.test_beat import cluster, start_beat, stop
from tests.servers import HttpServer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

DASHBOARD = "/admin/cron_celery/cronjob/"
NOTE = "warehouse migration"


def paused_through_the_admin(admin_client: Any, job: CronJob, until: dt.datetime) -> None:
    response = admin_client.post(DASHBOARD, {"action": "pause", "apply": "1", "_selected_action": [job.id],
                                             "note": NOTE, "until": until.isoformat()}, follow=True)
    assert "1 job(s) paused." in response.content.decode()


def test_a_pause_ends_at_its_end_with_nobody_around_and_the_run_it_held_runs_once(
        tmp_path: Path, marker: Path, admin_client: Any) -> None:
    with cluster(tmp_path, marker, workers=1) as env:
        beats = [start_beat(tmp_path, env, index) for index in (0, 1)]
        try:
            wait_for(lambda: CronExecution.objects.filter(task_code="T109", status=Status.SUCCEEDED).exists(),
                     timeout=90, what="the beats to run tick-2s")
            job = CronJob.objects.get(code="T109")
            end = (leadership.database_now() + dt.timedelta(seconds=8)).replace(microsecond=0)
            paused_through_the_admin(admin_client, job, end)
            paused_at = CronJob.objects.get(id=job.id).paused_at
            assert paused_at is not None
            # Somebody asks for a run meanwhile: it reaches the worker, and waits for the resume.
            asked = tasks.send_run(registry.get("tick-2s"), end + dt.timedelta(hours=1), Trigger.ENQUEUE)
            wait_for(lambda: CronExecution.objects.get(id=asked.execution_id).waiting_since is not None,
                     timeout=30, what="the run asked for to wait for the resume")
            wait_for(lambda: not CronJob.objects.get(id=job.id).paused, timeout=60, what="the pause to end by itself")
            wait_for(lambda: CronExecution.objects.get(id=asked.execution_id).status == Status.SUCCEEDED, timeout=60,
                     what="the run the pause held to run")
            wait_for(lambda: CronExecution.objects.filter(task_code="T109", trigger=Trigger.BEAT, slot__gt=end,
                                                          status=Status.SUCCEEDED).exists(),
                     timeout=60, what="the job's slots to run again")
        finally:
            for beat in beats:
                stop(beat)
    (ended,) = ScheduleChange.objects.filter(job_id=job.id, source=pauses.PAUSE_ENDED, changes__has_key="enabled")
    assert ended.changes["enabled"] == [False, True] and ended.actor == ""
    assert ended.changed_at >= end, f"resumed at {ended.changed_at}, before its end {end}"
    assert ended.changed_at < end + dt.timedelta(seconds=10), "the beats took long to see the end"
    resumed = CronJob.objects.get(id=job.id)
    assert (resumed.pause_note, resumed.paused_until, resumed.paused_by) == ("", None, "")
    # Nothing of the job was dispatched while it was paused.
    during = CronExecution.objects.filter(task_code="T109", trigger__in=[Trigger.BEAT, Trigger.CATCH_UP],
                                          created_at__gt=paused_at, created_at__lt=ended.changed_at)
    assert not during.exists(), [(row.slot, row.status, row.created_at) for row in during]
    held = CronExecution.objects.get(id=asked.execution_id)
    assert held.started is not None and held.started >= ended.changed_at
    key = f"T109:{held.slot.astimezone(dt.UTC):%Y-%m-%dT%H:%M:%S}Z"
    assert len([line for line in marked(marker) if line.startswith(f"tick-2s {key} ")]) == 1, "its body ran once"


def test_with_no_beat_a_reconciler_pass_ends_the_pause(admin_client: Any, declare: Any) -> None:
    from cron_celery.beat import schedule_sync

    declare("paused-nightly", "PZ9", schedule="0 3 * * *", timezone="UTC")
    schedule_sync.sync()
    job = CronJob.objects.get(code="PZ9")
    end = leadership.database_now() + dt.timedelta(seconds=3)
    paused_through_the_admin(admin_client, job, end)
    before = manage("reconcile_cron", env=subprocess_env(CRON_TEST_LOG_LEVEL="INFO"))
    assert before.returncode == 0, before.stderr
    assert CronJob.objects.get(id=job.id).paused, "resumed before its end"
    wait_for(lambda: leadership.database_now() > end, timeout=10, what="the end to pass")
    after = manage("reconcile_cron", env=subprocess_env(CRON_TEST_LOG_LEVEL="INFO"))
    assert after.returncode == 0, after.stderr
    resumed = CronJob.objects.get(id=job.id)
    assert not resumed.paused and resumed.pause_note == ""
    assert "resumed 1" in after.stdout + after.stderr
    assert ScheduleChange.objects.filter(job_id=job.id, source=pauses.PAUSE_ENDED).exists()


def test_a_job_failing_again_and_again_pauses_itself_says_so_once_and_runs_again_when_resumed(
        tmp_path: Path, marker: Path, admin_client: Any) -> None:
    hook = HttpServer().start()
    fixed = tmp_path / "fixed"
    try:
        with cluster(tmp_path, marker, workers=1, CRON_TEST_PAUSE_AFTER="1", CRON_TEST_WEBHOOK_URL=hook.url,
                     CRON_TEST_FIXED=str(fixed)) as env:
            beats = [start_beat(tmp_path, env, index) for index in (0, 1)]
            try:
                wait_for(lambda: CronJob.objects.filter(code="PF1", paused=True).exists(), timeout=90,
                         what="the job to pause itself")
                job = CronJob.objects.get(code="PF1")
                time.sleep(6)  # three slots' worth of two beats: nothing of the paused job is sent
                fixed.touch()
                response = admin_client.post(DASHBOARD, {"action": "resume", "_selected_action": [job.id]},
                                             follow=True)
                assert "1 job(s) resumed." in response.content.decode()
                resumed_at = leadership.database_now()
                wait_for(lambda: CronExecution.objects.filter(task_code="PF1", status=Status.SUCCEEDED).exists(),
                         timeout=60, what="the job to run again once resumed")
                wait_for(lambda: any(request.json()["event"] == "RECOVERED" for request in hook.received()),
                         timeout=60, what="the recovery to be alerted")
            finally:
                for beat in beats:
                    stop(beat)
    finally:
        hook.stop()
    paused = CronJob.objects.get(id=job.id)
    assert not paused.paused and paused.pause_note == ""
    failed = list(CronExecution.objects.filter(task_code="PF1", status=Status.FAILED).order_by("slot"))
    (change,) = ScheduleChange.objects.filter(job_id=job.id, source=pauses.PAUSED_AFTER_FAILURES,
                                             changes__has_key="enabled")
    assert change.changes["enabled"] == [True, False]
    (said,) = ScheduleChange.objects.filter(job_id=job.id, source=pauses.PAUSED_AFTER_FAILURES,
                                           changes__has_key="pause_note")
    note = said.changes["pause_note"][1]
    first_three = failed[:3]
    assert note.startswith("Paused after 3 failures in a row (pause_after_failures=3): "), note
    assert all(f"execution {row.id} FAILED" in note for row in first_three), (note, [row.id for row in failed])
    # The failures before the pause: three, or four when the fourth slot had started before the third failed.
    before = [row for row in failed if row.created_at < change.changed_at]
    assert 3 <= len(before) <= 4, [(row.id, row.slot) for row in failed]
    during = CronExecution.objects.filter(task_code="PF1", created_at__gt=change.changed_at,
                                          created_at__lt=resumed_at)
    assert not during.exists(), [(row.slot, row.status, row.trigger) for row in during]
    events = [request.json() for request in hook.received() if request.json()["code"] == "PF1"]
    paused_alerts = [body for body in events if body["event"] == "PAUSED"]
    assert len(paused_alerts) == 1, events
    assert paused_alerts[0]["execution_id"] == first_three[-1].id
    assert all(str(row.id) in paused_alerts[0]["error"] for row in first_three), paused_alerts[0]["error"]
    assert [body["event"] for body in events].count("FAILED") == 1, "one incident, alerted once"
    assert [body["event"] for body in events].count("RECOVERED") == 1
