"""Periodic tasks tracked as jobs (TRACK_PERIODIC_TASKS): which ones get a job row, linked to their
periodic task, with the schedule and arguments read from it; turning tracking off unlinks them."""

from __future__ import annotations

import datetime as dt
import io

import pytest
from celery import Celery, signals
from django.core.management import CommandError, call_command
from django.db import transaction
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone
from django_celery_beat.models import ClockedSchedule, CrontabSchedule, IntervalSchedule, PeriodicTask

from cron_celery import reconciler, schedules
from cron_celery.beat import Scheduler, schedule_sync
from cron_celery.decisions import audit, dispatch, tracked
from cron_celery.declaring import registry
from cron_celery.models import CronExecution, CronJob, ScheduleChange, Status, TrackedPeriodicTask, Trigger
from cron_celery.run import runs
from cron_celery.tracking import adoption, fires, rows, selection
from tests.admin_forms import submit
from tests.celery_app import app
from tests.settings import CRON_CELERY

pytestmark = pytest.mark.django_db(transaction=True)
MARK = "tests.jobsapp.tasks.plain_mark"


def tracking(value: object) -> override_settings:
    return override_settings(CRON_CELERY={**CRON_CELERY, "TRACK_PERIODIC_TASKS": value})


def every(seconds: int) -> IntervalSchedule:
    return IntervalSchedule.objects.get_or_create(every=seconds, period=IntervalSchedule.SECONDS)[0]


def test_each_tracked_periodic_task_gets_a_job_row_linked_to_it_with_its_schedule_and_arguments():
    now = timezone.now()
    by_interval = PeriodicTask.objects.create(name="Weekly digest!", task=MARK, args='["a"]', kwargs="{}",
                                              interval=every(30), queue="reports", priority=3)
    amsterdam = CrontabSchedule.objects.create(minute="5", hour="*", timezone="Europe/Amsterdam")
    by_crontab = PeriodicTask.objects.create(name="crontab one", task=MARK, crontab=amsterdam, args='["b"]')
    soon = ClockedSchedule.objects.create(clocked_time=now + dt.timedelta(minutes=2))  # read by its scheduler
    clocked = PeriodicTask.objects.create(name="clocked one", task=MARK, one_off=True, clocked=soon)
    untracked = PeriodicTask.objects.create(name="left alone", task=MARK, interval=every(30))
    with tracking(["Weekly digest!", "crontab one", "clocked one"]):
        schedule_sync.sync(now)
        rows = {row.code: row for row in CronJob.objects.filter(task__startswith=tracked.ALIAS)}
        assert set(rows) == {f"PT{by_interval.id}", f"PT{by_crontab.id}", f"PT{clocked.id}"}
        first = rows[f"PT{by_interval.id}"]
        assert (first.name, first.task, first.periodic_task_id) == (
            "weekly-digest", f"cron_celery.tracked:PT{by_interval.id}", by_interval.id)
        assert getattr(schedules.parse_expression(first.schedule, first.schedule_timezone or "UTC"), "seconds", 0) == 30
        assert first.next_run_at is not None and now < first.next_run_at <= now + dt.timedelta(seconds=30)
        assert first.params == {"args": ["a"], "kwargs": {}} and not first.schedule_problem
        second = rows[f"PT{by_crontab.id}"]
        assert (second.schedule, second.schedule_timezone, second.timezone) == (
            "5 * * * *", "Europe/Amsterdam", "Europe/Amsterdam")
        job = registry.get(f"PT{by_interval.id}")
        assert job.tracked and job.name == "weekly-digest" and job.task_name == first.task
        assert registry.get("weekly-digest") == job
        sent = tracked.contents(f"PT{by_interval.id}")
        assert sent.headers == {"periodic_task_name": "Weekly digest!"}  # as django-celery-beat sends it
        assert (sent.task, sent.args, sent.kwargs, sent.options) == (MARK, ["a"], {}, {"queue": "reports",
                                                                                      "priority": 3})
        assert not CronJob.objects.filter(periodic_task=untracked).exists()
        # A clocked one is recorded as it fires (tracking.fires): no slot ahead, no problem, never paused,
        # and django-celery-beat's scheduler still reads it, to say when it fires.
        fired = rows[f"PT{clocked.id}"]
        assert (fired.schedule, fired.next_run_at, fired.schedule_problem, fired.paused) == ("", None, "", False)
        assert fired.params == {"args": [], "kwargs": {}}
        reads = Scheduler(app=app, lazy=True).enabled_models_qs()
        assert set(reads.values_list("name", flat=True)) == {"clocked one", "left alone"}
        assert {found.code for found in adoption.adoptable()} == {first.code, second.code}  # no declaration of it
    with tracking(["crontab one"]):  # the first one left out: unlinked, its history kept, sent untracked again
        schedule_sync.sync(now)
    first.refresh_from_db()
    assert first.periodic_task_id is None and first.next_run_at is None
    assert PeriodicTask.objects.get(id=by_interval.id).enabled
    with tracking(True):  # back again: the same row, linked again
        schedule_sync.sync(now)
    first.refresh_from_db()
    assert first.periodic_task_id == by_interval.id and first.next_run_at is not None
    assert CronJob.objects.get(periodic_task=untracked).code == f"PT{untracked.id}"
    with tracking(False):
        schedule_sync.sync(now)
    assert not CronJob.objects.filter(task__startswith=tracked.ALIAS, periodic_task__isnull=False).exists()
    # Turned off: every row unlinked and marked removed (what it left waiting is closed, unalerted).
    assert not CronJob.objects.filter(task__startswith=tracked.ALIAS, removed_at__isnull=True).exists()


def test_edits_of_a_tracked_periodic_task_reach_its_job_and_a_deleted_one_stops_it():
    now = timezone.now()
    task = PeriodicTask.objects.create(name="edited", task=MARK, args='["x"]', interval=every(30))
    with tracking(True):
        schedule_sync.sync(now)
        job = CronJob.objects.get(periodic_task=task)
        task.interval = every(60)
        task.args = '["y"]'
        task.save()
        schedule_sync.apply_edits(now)
        job.refresh_from_db()
        assert getattr(schedules.parse_expression(job.schedule, job.schedule_timezone or "UTC"), "seconds", 0) == 60
        assert job.params == {"args": ["y"], "kwargs": {}}
        assert tracked.contents(job.code).args in (["x"], ["y"])  # kept a moment, then read again
        task.enabled = False
        task.save()
        schedule_sync.apply_edits(now)
        job.refresh_from_db()
        assert job.paused and job.next_run_at is None
        task.enabled = True
        task.save()
        schedule_sync.apply_edits(now)
        job.refresh_from_db()
        assert not job.paused and job.next_run_at is not None
        task.delete()
        rows.sync(source="test")
    job.refresh_from_db()
    assert job.periodic_task_id is None and job.next_run_at is None and job.removed_at is not None


def test_arguments_that_do_not_read_are_that_tasks_problem_and_every_other_task_goes_on():
    now = timezone.now()
    bad = PeriodicTask.objects.create(name="bad args", task=MARK, args="not json", interval=every(30))
    wrong = PeriodicTask.objects.create(name="kwargs a list", task=MARK, kwargs="[1]", interval=every(30))
    good = PeriodicTask.objects.create(name="good", task=MARK, args='["ok"]', interval=every(30))
    typo = PeriodicTask.objects.create(name="typo", task="tests.jobsapp.tasks.no_such_task", interval=every(30))
    with tracking(True):
        schedule_sync.sync(now)
    rows = {row.periodic_task_id: row for row in CronJob.objects.filter(task__startswith=tracked.ALIAS)}
    assert rows[bad.id].paused and rows[bad.id].next_run_at is None
    assert rows[bad.id].schedule_problem.startswith("args: not JSON"), rows[bad.id].schedule_problem
    assert rows[wrong.id].paused and "kwargs: a JSON object is needed" in rows[wrong.id].schedule_problem
    assert not rows[good.id].paused and rows[good.id].next_run_at is not None and not rows[good.id].schedule_problem
    # A task no worker knows: said and alerted, not held (a deploy may register it before its next slot).
    assert not rows[typo.id].paused and rows[typo.id].next_run_at is not None
    assert rows[typo.id].schedule_problem == ("its task 'tests.jobsapp.tasks.no_such_task' is not registered with "
                                              "the Celery app (a typo, or an app that is not installed?): every "
                                              "worker drops its messages")
    PeriodicTask.objects.filter(id=typo.id).update(task=MARK)  # the task's module deployed since, say
    with tracking(True):
        schedule_sync.sync(now)  # a beat's start: what it said is read again
    assert not CronJob.objects.get(periodic_task=typo).schedule_problem


def test_a_periodic_task_of_a_cron_job_or_of_cron_celery_itself_is_never_tracked():
    now = timezone.now()
    with tracking(True):
        schedule_sync.sync(now)
        own = PeriodicTask.objects.create(name="ours", task="cron_celery.deliver_alert", interval=every(30))
        job_task = registry.get("calc-commission").task_name
        declared = PeriodicTask.objects.create(name="a job's task", task=job_task, interval=every(30))
        schedule_sync.sync(now)
    assert not CronJob.objects.filter(periodic_task__in=[own, declared]).exists()
    assert not CronJob.objects.filter(task__startswith=tracked.ALIAS).exists()


def test_a_job_declared_with_a_tracked_tasks_code_takes_over_its_history_next_slot_and_periodic_task(declare):
    now = timezone.now()
    task = PeriodicTask.objects.create(name="Send invoices", task=MARK, args='["inv"]', kwargs='{"x": 1}',
                                       interval=every(60))
    with tracking(True):
        schedule_sync.sync(now)
        row = CronJob.objects.get(periodic_task=task)
        tracked_job = registry.get(row.code)
        slot = now.replace(second=0, microsecond=0)
        earlier, _ = dispatch.enqueue(job=tracked_job, job_id=row.id, slot=slot, execution_date=slot.date(),
                                      trigger="BEAT")
        job = declare("send-invoices", row.code, schedule="*/5 * * * *", timezone="UTC", catch_up="none",
                      overlap="allow")
        schedule_sync.sync(now)
        taken = CronJob.objects.get(id=row.id)  # the same row: its history stays its own
        assert (taken.code, taken.name, taken.task) == (row.code, "send-invoices", job.task_name)
        assert taken.periodic_task_id == task.id and taken.removed_at is None and not taken.paused
        assert taken.schedule == "*/5 * * * *" and taken.next_run_at is not None and not taken.schedule_problem
        assert CronExecution.objects.filter(id=earlier, job_id=row.id).exists()
        task.refresh_from_db()
        assert (task.task, task.args, task.kwargs, task.enabled) == (job.task_name, "[]", "{}", True)
        assert registry.get(row.code) is job  # the code's declaration, not the tracked one
        schedule_sync.sync(now)  # and it stays the code's: tracking leaves it alone
        assert CronJob.objects.get(id=row.id).task == job.task_name


def test_adopt_lists_each_tracked_task_as_a_declaration_and_writes_a_module_that_imports(tmp_path):
    now = timezone.now()
    nightly = CrontabSchedule.objects.create(minute="30", hour="2", timezone="Europe/Amsterdam")
    PeriodicTask.objects.create(name="Nightly export", task=MARK, args='["n"]', kwargs='{}', crontab=nightly,
                                queue="reports")
    PeriodicTask.objects.create(name="ping", task="tests.jobsapp.tasks.plain_ping", interval=every(300))
    with tracking(True):
        schedule_sync.sync(now)
    out = io.StringIO()
    call_command("adopt_periodic_tasks", stdout=out)
    text = out.getvalue()
    code = CronJob.objects.get(name="nightly-export").code
    assert (f"@cron_task(name='nightly-export', code='{code}', schedule=\"30 2 * * *\", "
            "timezone='Europe/Amsterdam', catch_up='none', overlap=\"allow\", queue='reports')") in text, text
    assert "return _nightly_export_task.run('n')" in text and "schedule=every(seconds=300)" in text
    target = tmp_path / "adopted.py"
    call_command("adopt_periodic_tasks", "nightly-export", "--write", str(target), stdout=io.StringIO())
    written = target.read_text()
    assert "nightly_export" in written and "ping" not in written
    compile(written, str(target), "exec")  # it parses as Python
    with pytest.raises(CommandError, match="exists"):
        call_command("adopt_periodic_tasks", "--write", str(target), stdout=io.StringIO())
    with pytest.raises(CommandError, match="not a tracked periodic task: nope"):
        call_command("adopt_periodic_tasks", "nope", stdout=io.StringIO())


def test_a_persons_choice_in_the_admin_tracks_or_leaves_out_one_task_over_the_setting_and_sets_its_catch_up(
        admin_client):
    now = timezone.now()
    wanted = PeriodicTask.objects.create(name="wanted", task=MARK, interval=every(30))
    unwanted = PeriodicTask.objects.create(name="unwanted", task=MARK, interval=every(30))
    url = reverse("admin:django_celery_beat_periodictask_change", args=[wanted.id])
    assert b"cron_tracking-0-track" in admin_client.get(url).content
    prefix = "cron_tracking"  # the inline's form prefix: the reverse name of its one-to-one field
    answer = submit(admin_client, url, {f"{prefix}-0-track": "true", f"{prefix}-0-catch_up": "all"})
    assert answer.status_code == 302, answer.content.decode()[:3000]
    with tracking(False):  # nothing tracked by the setting: the person's yes tracks this one
        schedule_sync.sync(now)
    assert CronJob.objects.get(periodic_task=wanted).catch_up == "all"
    assert not CronJob.objects.filter(periodic_task=unwanted).exists()
    TrackedPeriodicTask.objects.create(periodic_task=unwanted, track=False)
    with tracking(True):  # every one by the setting: the person's no leaves this one out
        schedule_sync.sync(now)
    assert not CronJob.objects.filter(periodic_task=unwanted).exists()
    assert CronJob.objects.filter(periodic_task=wanted).exists()
    choice = TrackedPeriodicTask.objects.get(periodic_task=wanted)
    choice.track, choice.catch_up = None, ""
    choice.save()
    with tracking(True):  # back to the setting's word, and its catch-up
        schedule_sync.sync(now)
    assert CronJob.objects.get(periodic_task=wanted).catch_up == "none"
    # A cron job's own periodic task offers no choice: it is always its job's.
    own = CronJob.objects.filter(periodic_task__isnull=False).exclude(task__startswith=tracked.ALIAS)[0].periodic_task
    assert own is not None
    page = admin_client.get(reverse("admin:django_celery_beat_periodictask_change", args=[own.id]))
    assert page.status_code == 200 and b"cron_tracking-0-track" not in page.content


def test_a_fire_the_broker_refuses_stays_pending_and_the_reconciler_sends_it(queue):
    """A tracked clocked task fired while the broker is down: its execution is recorded with its Celery
    task id and stays PENDING (nothing closed, nothing lost); the reconciler decides it by the task's
    catch-up policy, as a cron job's stranded slot: with ``latest`` (set in the admin) it sends it once
    the broker answers, under that id, as the periodic task's own task; with ``none`` it records it
    MISSED (NOT_DELIVERED), alerted."""
    at = timezone.now().replace(microsecond=0) + dt.timedelta(minutes=1)
    task = PeriodicTask.objects.create(name="fired", task=MARK, args='["x"]', one_off=True,
                                       clocked=ClockedSchedule.objects.create(clocked_time=at))
    TrackedPeriodicTask.objects.create(periodic_task=task, catch_up="latest")
    dropped = PeriodicTask.objects.create(name="dropped", task=MARK, one_off=True,
                                          clocked=ClockedSchedule.objects.create(clocked_time=at))
    with tracking(["fired", "dropped"]):
        schedule_sync.sync(timezone.now())
        broken = Celery("broker-down", broker="redis://127.0.0.1:1/0", set_as_current=False)
        try:
            recorded = fires.send(broken, PeriodicTask.objects.get(pk=task.pk))
            assert fires.send(broken, dropped) is not None
        finally:
            broken.close()
        assert recorded is not None
        row = CronExecution.objects.get(task_name="fired")
        assert (row.id, row.slot, row.status, row.trigger, row.celery_task_id) == (
            recorded.execution_id, at, Status.PENDING, Trigger.BEAT, recorded.celery_task_id)
        assert queue.headers() == []
        CronExecution.objects.update(created_at=timezone.now() - dt.timedelta(hours=1))
        passed = reconciler.run_pass()
        assert (passed.resent, passed.missed) == (1, 1)
        sent = queue.headers()
        assert [(m["id"], m["task"], m["cron_execution_id"]) for m in sent] == [(row.celery_task_id, MARK, row.id)]
        missed = CronExecution.objects.get(task_name="dropped")
        assert (missed.status, missed.error_code) == (Status.MISSED, "NOT_DELIVERED")
    untracked = PeriodicTask.objects.create(name="not tracked", task=MARK, one_off=True,
                                            clocked=ClockedSchedule.objects.create(clocked_time=at))
    assert fires.send(app, untracked) is None  # django-celery-beat sends it as before


def test_a_tracked_tasks_edits_and_its_tracking_in_and_out_are_in_the_audit_log():
    """A person's edit of a tracked periodic task is recorded on its job's audit log with who made it,
    as a cron job's is; taken out of tracking and back, the beat's unlinking and linking again are
    recorded too, by their source."""
    task = PeriodicTask.objects.create(name="audited one", task=MARK, interval=every(30))
    with tracking(True):
        schedule_sync.sync(timezone.now())
    job = CronJob.objects.get(periodic_task=task)
    with transaction.atomic():
        audit.set_author(source=audit.ADMIN_FORM, actor="ann")
        task.interval = every(60)
        task.save()
    edit = ScheduleChange.objects.filter(job=job).latest("id")
    assert (edit.source, edit.actor, edit.changes) == (
        audit.ADMIN_FORM, "ann", {"schedule": ["every 30s", "every 60s"]})
    with tracking(False):
        rows.sync(source=audit.BEAT_TRACKING)
    out = ScheduleChange.objects.filter(job=job).latest("id")
    assert out.source == audit.BEAT_TRACKING and out.changes["declared"] == [True, False]
    assert out.changes["periodic_task"] == ["audited one", None]
    with tracking(True):
        rows.sync(source=audit.BEAT_TRACKING)
    back = ScheduleChange.objects.filter(job=job).latest("id")
    assert back.changes["declared"] == [False, True] and back.changes["periodic_task"] == [None, "audited one"]


def test_a_person_asks_for_a_slot_of_a_tracked_task_as_for_any_jobs(queue):
    """``run_cron_task NAME --enqueue`` (and the admin's Run, the run endpoint: the same path) sends a run
    of a tracked task's slot: its execution recorded, its message the periodic task's own task and
    arguments with the slot's headers."""
    task = PeriodicTask.objects.create(name="on demand", task=MARK, args='["asked"]', interval=every(3600))
    with tracking(True):
        schedule_sync.sync(timezone.now())
    call_command("run_cron_task", "on-demand", "--at", "2026-12-01T10:00", "--enqueue", stdout=io.StringIO())
    (row,) = CronExecution.objects.filter(job__periodic_task=task)
    assert (row.status, row.trigger, row.slot.isoformat()) == (Status.PENDING, Trigger.ENQUEUE,
                                                              "2026-12-01T10:00:00+00:00")
    (message,) = queue.headers()
    assert (message["task"], message["cron_job"], message["cron_execution_id"]) == (MARK, f"PT{task.id}", row.id)
    assert message["argsrepr"] == "['asked']"


def test_a_clocked_one_off_runs_past_its_disabling_and_again_when_enabled_again(queue):
    """django-celery-beat disables a one-off once it fired, and the database pauses its job at once:
    the fire's run still runs (it goes past the pause; it was skipped PAUSED before). Enabled again in
    the admin, it fires its clocked time again: a run of that slot again, not ALREADY_RAN. Neither fire
    is counted on the periodic task by cron_celery (django-celery-beat counts its own fires)."""
    at = timezone.now().replace(microsecond=0) + dt.timedelta(minutes=5)
    task = PeriodicTask.objects.create(name="once", task=MARK, args='["x"]', one_off=True,
                                       clocked=ClockedSchedule.objects.create(clocked_time=at))
    with tracking(True):
        schedule_sync.sync(timezone.now())
    job = registry.get(f"PT{task.id}")
    ran: list[int] = []

    def run_fire() -> runs.Outcome:
        recorded = fires.send(app, PeriodicTask.objects.get(pk=task.pk))
        assert recorded is not None
        return runs.execute(job, at, lambda run: ran.append(run.execution_id), trigger=Trigger.BEAT,
                            execution_id=recorded.execution_id)

    PeriodicTask.objects.filter(pk=task.pk).update(total_run_count=1)  # django-celery-beat's reserve
    first_sent = fires.send(app, PeriodicTask.objects.get(pk=task.pk))
    assert first_sent is not None
    PeriodicTask.objects.filter(pk=task.pk).update(enabled=False, total_run_count=0)  # its next look at it
    assert CronJob.objects.get(periodic_task=task).paused  # the database's trigger
    first = runs.execute(job, at, lambda run: ran.append(run.execution_id), trigger=Trigger.BEAT,
                         execution_id=first_sent.execution_id)
    assert first.status == Status.SUCCEEDED, first
    PeriodicTask.objects.filter(pk=task.pk).update(enabled=True)  # a person enables it again
    second = run_fire()
    assert second.status == Status.SUCCEEDED, second
    assert ran == [first_sent.execution_id, second.execution_id]
    assert [row.run_number for row in CronExecution.objects.filter(job__periodic_task=task).order_by("id")] == [1, 2]
    dispatch.count_sent({CronJob.objects.get(periodic_task=task).id: 2})
    assert PeriodicTask.objects.get(pk=task.pk).total_run_count == 0  # django-celery-beat's own count, untouched


def test_an_edit_of_a_tracked_tasks_args_alone_reaches_its_runs():
    """Only ``args`` changed (the trigger did not fire on it before migration 0003: the runs were called
    with the old arguments while the message carried the new ones)."""
    task = PeriodicTask.objects.create(name="args only", task=MARK, args='["old"]', interval=every(30))
    with tracking(True):
        schedule_sync.sync(timezone.now())
        PeriodicTask.objects.filter(pk=task.pk).update(args='["new"]')
        schedule_sync.apply_edits(timezone.now())
    assert CronJob.objects.get(periodic_task=task).params == {"args": ["new"], "kwargs": {}}


def test_a_task_module_that_cannot_be_imported_checks_no_task_and_stops_none():
    """The beat checks each tracked task's name against the Celery app's tasks; when the app's task modules
    cannot all be imported in the beat's process (a worker-only dependency), it checks none and says so
    once, instead of refusing every tracked task's edit."""
    task = PeriodicTask.objects.create(name="checked", task=MARK, interval=every(30))
    def broken(**_: object) -> None:  # a tasks module that fails to import here, found by autodiscovery
        raise ImportError("No module named 'a_worker_only_dependency'")

    kept = dict(selection._imports)
    signals.import_modules.connect(broken, weak=False)
    selection._imports.update(done=False, failed=False)
    try:
        with tracking(True):
            schedule_sync.sync(timezone.now())
        assert selection.unregistered("tests.jobsapp.tasks.no_such_task") == ""
    finally:
        signals.import_modules.disconnect(broken)
        selection._imports.update(kept)
    job = CronJob.objects.get(periodic_task=task)
    assert job.next_run_at is not None and not job.schedule_problem
