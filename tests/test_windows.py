"""Active windows (``active_from``/``active_until``, the periodic task's ``start_time``/``expires``)
and django-celery-beat's ``one_off``: the declaration's rules, the plan, ``due_at``, the sync and
admin edits, the reconciler and backfills; what a window means to the health check, the metrics,
the upcoming page and the beat's round. Real PostgreSQL; the beats are in tests/faults/test_windows.py."""

from __future__ import annotations

import datetime as dt
import io
import zoneinfo
from collections import Counter

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext
from django_celery_beat.models import PeriodicTask
from prometheus_client.parser import text_string_to_metric_families

from cron_celery import beat, exceptions, reconciler
from cron_celery import slots as slot_maths
from cron_celery.beat import health, planning, schedule_sync
from cron_celery.decisions import dispatch
from cron_celery.declaring import registry
from cron_celery.models import CronExecution, CronJob, Status
from cron_celery.run import backfill, tasks
from cron_celery.schedules import every
from cron_celery.web import metrics, upcoming
from tests.celery_app import app
from tests.conftest import Queue, db_now, wait_for

T0 = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)
MINUTE = dt.timedelta(minutes=1)


def due_job(**fields: object) -> dispatch.DueJob:
    values: dict[str, object] = {"job_id": 1, "next_run_at": T0, "task": "t", "name": "w", "schedule": "every 60s",
                                 "timezone": "UTC", "catch_up": "all", "job_timezone": "UTC"}
    return dispatch.DueJob(**{**values, **fields})  # type: ignore[arg-type]


# --- the declaration ---------------------------------------------------------------------------

def test_a_window_is_two_aware_datetimes_on_a_job_with_a_schedule_of_its_own():
    amsterdam = zoneinfo.ZoneInfo("Europe/Amsterdam")
    job = registry.declare(name="w", code="W1", task_name="t", schedule=every(minutes=1),
                           active_from=dt.datetime(2026, 12, 1, 9, tzinfo=amsterdam),
                           active_until=dt.datetime(2026, 12, 2, tzinfo=amsterdam))
    assert (job.active_from, job.active_until) == (dt.datetime(2026, 12, 1, 8, tzinfo=dt.UTC),
                                                   dt.datetime(2026, 12, 1, 23, tzinfo=dt.UTC))
    with pytest.raises(exceptions.ImproperlyDeclared, match=r"active_from must be an aware datetime .*"
                                                           r"not datetime.datetime\(2026, 12, 1, 0, 0\)"):
        registry.declare(name="w", code="W1", task_name="t", schedule=every(minutes=1),
                         active_from=dt.datetime(2026, 12, 1))
    with pytest.raises(exceptions.ImproperlyDeclared, match=r"active_until must be an aware datetime .* not '2027'"):
        registry.declare(name="w", code="W1", task_name="t", schedule=every(minutes=1), active_until="2027")
    with pytest.raises(exceptions.ImproperlyDeclared, match=r"active_until \(2026-11-29T12:00:00\+00:00\) must be "
                                                           r"later than active_from \(2026-11-29T12:00:00\+00:00\)"):
        registry.declare(name="w", code="W1", task_name="t", schedule=every(minutes=1), active_from=T0,
                         active_until=T0)
    with pytest.raises(exceptions.ImproperlyDeclared, match="has none of its own: add schedule="):
        registry.declare(name="w", code="W1", task_name="t", active_until=T0)
    with pytest.raises(exceptions.ImproperlyDeclared, match="give them the window"):
        registry.declare(name="w", code="W1", task_name="t", after="up", active_until=T0)


def test_both_decorators_take_the_window_as_a_job_option():
    from cron_celery import TrackedTask, cron_task, register_task

    def body(run: object) -> str:
        return "ok"

    class Body(TrackedTask):
        def execute(self, date: dt.date) -> str:
            return "ok"

    try:
        cron_task(name="window-deco", code="WD1", schedule=every(hours=1), active_until=T0)(body)
        register_task("window-class", "WD2", schedule=every(hours=1), active_from=T0)(Body)
        assert registry.get("window-deco").active_until == T0 and registry.get("window-class").active_from == T0
    finally:
        registry.unregister("window-deco")
        registry.unregister("window-class")


# --- the plan ------------------------------------------------------------------------------------

def test_slots_before_the_window_are_neither_run_nor_missed_and_the_first_is_the_windows_first():
    opens = T0 + dt.timedelta(minutes=10, seconds=30)
    # The beat was down since T0; the window opened at 12:10:30; it is 12:13:05.
    for policy, run, missed in (("all", [T0 + 11 * MINUTE, T0 + 12 * MINUTE, T0 + 13 * MINUTE], []),
                                ("latest", [T0 + 13 * MINUTE], [T0 + 11 * MINUTE, T0 + 12 * MINUTE]),
                                ("none", [T0 + 13 * MINUTE], [T0 + 11 * MINUTE, T0 + 12 * MINUTE])):
        decision = beat.plan(due_job(active_from=opens, catch_up=policy), T0 + dt.timedelta(minutes=13, seconds=5),
                             {}, {})
        assert decision is not None and (decision.run, decision.missed) == (run, missed), policy
        assert decision.next_run_at == T0 + 14 * MINUTE and decision.expected_next_run_at == T0
    # Before it opens, the job moves to the window's first slot and records nothing.
    early = beat.plan(due_job(active_from=opens), T0 + MINUTE, {}, {})
    assert early is not None and (early.run, early.missed, early.next_run_at) == ([], [], T0 + 11 * MINUTE)


def test_slots_at_or_after_the_windows_end_are_neither_run_nor_missed():
    closes = T0 + 3 * MINUTE  # slots 12:00, 12:01, 12:02 are inside; 12:03 is not
    decision = beat.plan(due_job(active_until=closes), T0 + 10 * MINUTE, {}, {})
    assert decision is not None and decision.run == [T0, T0 + MINUTE, T0 + 2 * MINUTE] and decision.missed == []
    assert decision.next_run_at == closes  # the first slot past the window: the job is due no more
    latest = beat.plan(due_job(active_until=closes, catch_up="latest"), T0 + 10 * MINUTE, {}, {})
    assert latest is not None and (latest.run, latest.missed) == ([T0 + 2 * MINUTE], [T0, T0 + MINUTE])
    # Late beyond its grace, "none" records the window's slots MISSED, never those after it.
    none = beat.plan(due_job(active_until=closes, catch_up="none"), T0 + 10 * MINUTE, {}, {})
    assert none is not None and (none.run, none.missed) == ([], [T0, T0 + MINUTE, T0 + 2 * MINUTE])
    # Jobs with other windows do not share a plan.
    plans: dict[planning.PlanKey, object] = {}
    first = beat.plan(due_job(active_until=closes), T0 + 10 * MINUTE, plans, {})  # type: ignore[arg-type]
    other = beat.plan(due_job(job_id=2), T0 + 10 * MINUTE, plans, {})  # type: ignore[arg-type]
    assert first is not None and other is not None and len(other.run) == 11 and len(first.run) == 3


def test_a_one_off_periodic_task_runs_its_newest_due_slot_and_no_other():
    decision = beat.plan(due_job(one_off=True, catch_up="all"), T0 + 3 * MINUTE, {}, {})
    assert decision is not None and (decision.run, decision.missed, decision.last) == ([T0 + 3 * MINUTE], [], True)
    plain = beat.plan(due_job(catch_up="all"), T0 + 3 * MINUTE, {}, {})
    assert plain is not None and len(plain.run) == 4 and not plain.last


# --- the job row ---------------------------------------------------------------------------------

def job_with_row(declare: object, code: str = "W01", **options: object) -> tuple[registry.Job, CronJob]:
    job = declare(f"windowed-{code.lower()}", code, schedule=every(minutes=1), pattern="always",  # type: ignore[operator]
                  overlap="allow", **options)
    schedule_sync.sync(T0)
    return job, CronJob.objects.select_related("periodic_task").get(code=code)


@pytest.mark.django_db
def test_due_at_waits_for_the_window_and_is_empty_once_it_has_ended(declare):
    _job, row = job_with_row(declare)
    with connection.cursor() as cursor:
        def set_row(next_run_at: dt.datetime | None, opens: dt.datetime | None,
                    closes: dt.datetime | None) -> object:
            cursor.execute("UPDATE cron_celery_cronjob SET next_run_at = %s, active_from = %s, active_until = %s "
                           "WHERE id = %s RETURNING due_at", [next_run_at, opens, closes, row.id])
            found = cursor.fetchone()
            assert found is not None
            return found[0]

        assert set_row(T0, None, None) == T0
        assert set_row(T0, T0 + 5 * MINUTE, None) == T0 + 5 * MINUTE  # not due before the window opens
        assert set_row(T0, None, T0 + MINUTE) == T0
        assert set_row(T0 + MINUTE, None, T0 + MINUTE) is None  # its next slot is past the end: never due
        assert set_row(None, T0, None) is None


@pytest.mark.django_db
def test_the_codes_window_goes_to_the_periodic_task_and_an_admin_edit_of_it_reaches_the_job(declare):
    opens, closes = T0 + dt.timedelta(hours=2, seconds=30), T0 + dt.timedelta(hours=5)
    _job, row = job_with_row(declare, active_from=opens, active_until=closes)
    task = row.periodic_task
    assert (task.start_time, task.expires) == (opens, closes)
    assert (row.active_from, row.active_until) == (opens, closes)
    assert row.next_run_at == T0 + dt.timedelta(hours=2, minutes=1)  # the window's first slot
    assert row.due_at == row.next_run_at

    # The admin widens the window's end and moves its start: the job starts afresh from its next slot.
    task.expires, task.start_time = T0 + dt.timedelta(hours=9), None
    task.save()
    row.refresh_from_db()
    assert row.schedule_version != row.schedule_seen  # the trigger saw the edit
    assert schedule_sync.apply_edits(T0 + dt.timedelta(minutes=30, seconds=5)) == 1
    row.refresh_from_db()
    assert (row.active_from, row.active_until) == (None, T0 + dt.timedelta(hours=9))
    assert row.next_run_at == T0 + dt.timedelta(minutes=31)
    # The code's window did not change: a sync keeps the admin's.
    assert "windowed-w01" in schedule_sync.sync(T0).kept
    assert PeriodicTask.objects.get(id=task.id).expires == T0 + dt.timedelta(hours=9)


@pytest.mark.django_db
def test_a_job_without_a_window_keeps_the_declaration_hash_it_had_before_windows(declare):
    import hashlib

    job, row = job_with_row(declare)
    before = hashlib.sha256(f"{job.task_name}|{job.schedule.expression}|UTC".encode()).hexdigest()  # type: ignore[union-attr]
    assert row.declaration_hash == schedule_sync.declaration_hash(job) == before  # no rewrite of admin edits on upgrade
    windowed = registry.declare(name="x", code="X", task_name=job.task_name, schedule=every(minutes=1),
                                active_until=T0)
    assert schedule_sync.declaration_hash(windowed) != before


@pytest.mark.django_db
def test_a_one_off_periodic_task_sends_one_forced_slot_then_is_disabled_and_its_job_paused(declare):
    _job, row = job_with_row(declare)
    task = row.periodic_task
    task.one_off = True
    task.save()
    schedule_sync.apply_edits(T0)
    (due,) = [item for item in dispatch.due_jobs(T0 + 2 * MINUTE) if item.job_id == row.id]
    assert due.one_off
    decision = beat.plan(due, T0 + dt.timedelta(minutes=2, seconds=1), {}, {})
    assert decision is not None and decision.last and decision.run == [T0 + 2 * MINUTE]
    advanced, published, _missed = dispatch.dispatch_many([decision])
    assert advanced == {row.id} and [item.slot for item in published] == [T0 + 2 * MINUTE]
    execution = CronExecution.objects.get(job_id=row.id)
    assert execution.force and execution.status == Status.PENDING  # it runs although the job is now paused
    assert not PeriodicTask.objects.get(id=task.id).enabled
    row.refresh_from_db()
    assert row.paused and row.next_run_at is None
    # A second beat with the same view writes nothing and disables nothing more.
    assert dispatch.dispatch_many([decision])[:2] == (set(), [])
    assert CronExecution.objects.filter(job_id=row.id).count() == 1


@pytest.mark.django_db
def test_the_reconciler_records_no_slot_outside_a_window_as_missed(declare):
    closes = T0 + 3 * MINUTE
    _job, row = job_with_row(declare, active_until=closes, catch_up="none")
    CronJob.objects.filter(id=row.id).update(next_run_at=T0)  # no beat since 12:00
    report = reconciler.Report()
    reconciler._undispatched(report, T0 + dt.timedelta(hours=1), {"MISSED_GRACE": 60, "BATCH": 100})
    slots = list(CronExecution.objects.filter(job_id=row.id).order_by("slot").values_list("slot", "status"))
    assert slots == [(T0, Status.MISSED), (T0 + MINUTE, Status.MISSED), (T0 + 2 * MINUTE, Status.MISSED)]
    row.refresh_from_db()
    assert row.next_run_at == closes and row.due_at is None


@pytest.mark.django_db
def test_a_backfill_runs_only_the_slots_inside_the_window_and_says_how_many_it_left_out(declare):
    opens = dt.datetime(2026, 11, 2, tzinfo=dt.UTC)
    job = declare("windowed-daily", "W09", schedule="0 6 * * *", active_from=opens,  # type: ignore[operator]
                  active_until=dt.datetime(2026, 11, 4, 7, tzinfo=dt.UTC))
    schedule_sync.sync(T0)
    planned = backfill.plan(job, "2026-11-01", "2026-11-05")
    assert planned.slots == [dt.datetime(2026, 11, day, 6, tzinfo=dt.UTC) for day in (2, 3, 4)]
    assert planned.outside == 2
    assert backfill.plan(job, "2026-11-02", "2026-11-03").outside == 0


@pytest.mark.django_db
def test_a_one_off_run_is_refused_at_a_slot_of_the_jobs_own_schedule_in_the_past_or_twice(declare):
    job, _row = job_with_row(declare)
    soon = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(hours=1, seconds=30)
    recorded = tasks.schedule_one_off(job, soon)
    with pytest.raises(exceptions.OneOffRefused, match="is already recorded"):
        tasks.schedule_one_off(job, soon)
    with pytest.raises(exceptions.OneOffRefused, match=r"a slot the job's schedule in effect runs anyway "
                                                       r"\(every minute\)"):
        tasks.schedule_one_off(job, soon.replace(second=0))
    with pytest.raises(exceptions.OneOffRefused, match="is not in the future"):
        tasks.schedule_one_off(job, soon - dt.timedelta(days=1))
    row = CronExecution.objects.get(id=recorded.execution_id)
    assert (row.status, row.trigger, row.slot, row.due_at, row.celery_task_id) == (
        Status.PENDING, "ONE_OFF", soon, soon, "")


# --- who needs a beat, and what is overdue -----------------------------------------------------

def in_process_beat() -> beat.Scheduler:
    """The beat's scheduler without the process around it (the real constructor starts a whole
    beat): ``dispatch_due`` is its round, as a leading beat runs it each tick, publishing to the
    session's queue."""
    scheduler = beat.Scheduler.__new__(beat.Scheduler)
    scheduler.app = app
    scheduler.leadership = beat.Leadership(30.0)
    scheduler._schedules, scheduler.published, scheduler.uncounted = {}, 0, Counter()
    return scheduler


def the_only_job(declare: object, code: str, start: dt.datetime, **window: object) -> CronJob:
    """A one-second job with a window, synced as of ``start``: the only job with a schedule not paused
    (the test app's other scheduled jobs are disabled in the admin's way, their periodic tasks)."""
    declare(f"windowed-{code.lower()}", code, schedule=every(seconds=1), pattern="always",  # type: ignore[operator]
            overlap="allow", catch_up="all", **window)
    schedule_sync.sync(start)
    row = CronJob.objects.select_related("periodic_task").get(code=code)
    PeriodicTask.objects.exclude(id=row.periodic_task_id).update(enabled=False)
    assert list(CronJob.objects.filter(paused=False, periodic_task__isnull=False).values_list("code", flat=True)) == [
        code]
    return row


def scraped(job: CronJob) -> tuple[float, float]:
    """``cron_beat_needed`` and the job's ``cron_overdue``, as Prometheus reads them."""
    body, _ = metrics.render()
    samples = {(sample.name, tuple(sample.labels.values())): sample.value
               for family in text_string_to_metric_families(body.decode()) for sample in family.samples}
    return samples["cron_beat_needed", ()], samples["cron_overdue", (job.name,)]


def ended_job(declare: object, code: str, queue: Queue) -> tuple[CronJob, dt.datetime, beat.Scheduler]:
    """A job whose window ended half an hour ago, after a beat sent each of its slots: its row,
    the window's end, and that beat."""
    closes = db_now().replace(microsecond=0) - 30 * MINUTE
    row = the_only_job(declare, code, closes - dt.timedelta(seconds=5), active_until=closes)
    scheduler = in_process_beat()
    assert scheduler.dispatch_due() == scheduler.tick_seconds  # edits taken in, the window's slots sent: idle
    slots = [closes - dt.timedelta(seconds=n) for n in range(4, 0, -1)]
    assert list(CronExecution.objects.filter(job_id=row.id).order_by("slot").values_list("slot", flat=True)) == slots
    assert [headers["cron_slot"] for headers in queue.headers()] == [slot_maths.iso(slot) for slot in slots]
    row.refresh_from_db()
    assert (row.next_run_at, row.due_at, row.active_until, row.paused) == (closes, None, closes, False)
    return row, closes, scheduler


@pytest.mark.django_db
def test_a_job_whose_window_has_ended_needs_no_beat_is_never_overdue_and_costs_the_beat_nothing(declare, queue):
    row, _closes, scheduler = ended_job(declare, "W11", queue)
    # No beat leads (none ever has): nothing needs one, and the job is not late for anything.
    assert scraped(row) == (0.0, 0.0)
    report = health.check()
    assert (report.ok, report.reasons, report.overdue, report.beat) == (True, [], [], None)
    out = io.StringIO()
    call_command("cron_check", stdout=out)
    assert out.getvalue().strip() == "cron: ok"
    # The beat's round is its one idle statement: the job is neither due nor edited, so never selected.
    sent = len(queue.headers())
    with CaptureQueriesContext(connection) as statements:
        assert scheduler.dispatch_due() == scheduler.tick_seconds
    assert len(statements.captured_queries) == 1
    assert dispatch.next_due()[:2] == (None, False)
    assert dispatch.due_jobs(db_now() + dt.timedelta(days=3650)) == []
    assert len(queue.headers()) == sent and CronExecution.objects.filter(job_id=row.id).count() == 4


@pytest.mark.django_db
def test_a_job_whose_window_opens_later_needs_a_beat_but_is_not_overdue_before_it_opens(declare):
    now = db_now()
    opens = now.replace(microsecond=0) + dt.timedelta(hours=1)
    row = the_only_job(declare, "W12", now, active_from=opens)
    schedule_sync.apply_edits(now)  # the other jobs' pause, taken in as a beat would
    row.refresh_from_db()
    assert (row.next_run_at, row.due_at) == (opens, opens)  # its first slot is the window's first
    assert scraped(row) == (1.0, 0.0)
    report = health.check()
    assert report.overdue == [] and len(report.reasons) == 1 and report.reasons[0].startswith("no beat is leading")
    health.beat_seen("host-a:1", True)
    assert health.check().ok

    # A next slot long before the window (the window given by SQL, or by ``cron_celery_job_due``): due when it opens.
    with connection.cursor() as cursor:
        cursor.execute("UPDATE cron_celery_cronjob SET next_run_at = %s WHERE id = %s", [now - dt.timedelta(days=1),
                                                                                        row.id])
    assert scraped(row) == (1.0, 0.0) and health.check().ok
    assert upcoming.upcoming(now).behind == []
    # Open ten seconds: not late yet, on the health check, the metrics and the upcoming page alike.
    for opened, late in ((now - dt.timedelta(seconds=10), False), (now - 10 * MINUTE, True)):
        CronJob.objects.filter(id=row.id).update(active_from=opened)
        assert scraped(row) == (1.0, float(late))
        assert [item["job"] for item in health.check().overdue] == ([row.name] if late else [])
        assert [(item.job.id, item.since) for item in upcoming.upcoming(now).behind] == (
            [(row.id, opened)] if late else [])


@pytest.mark.django_db
def test_an_edit_that_reopens_an_ended_window_makes_the_job_due_again_and_the_beat_sends_it(declare, queue):
    row, closes, scheduler = ended_job(declare, "W13", queue)
    task = row.periodic_task
    reopened = db_now() + dt.timedelta(days=1)
    task.expires = reopened  # the admin moves the window's end later
    task.save()
    # Until a beat takes the edit in, the job's row still has the old window: the edit needs a beat.
    assert scraped(row) == (1.0, 0.0)
    assert [reason.split(":")[0] for reason in health.check().reasons] == ["no beat is leading"]
    edited = dt.datetime.now(dt.UTC)

    def sent_again() -> bool:
        scheduler.dispatch_due()
        return CronExecution.objects.filter(job_id=row.id, slot__gt=closes).exists()

    wait_for(sent_again, timeout=30, what="the beat to send a slot of the reopened window")
    row.refresh_from_db()
    assert row.active_until == reopened and row.due_at is not None and row.due_at > edited
    new = list(CronExecution.objects.filter(job_id=row.id, slot__gt=closes).values_list("slot", flat=True))
    assert all(slot > edited - dt.timedelta(seconds=1) for slot in new), new  # afresh: no slot of the gap
    assert {slot_maths.iso(slot) for slot in new} <= {headers["cron_slot"] for headers in queue.headers()}
    assert scraped(row) == (1.0, 0.0)
    # Disabled in the admin: paused at once, so its edit waiting for a beat needs none.
    task.refresh_from_db()
    task.enabled = False
    task.save()
    assert scraped(row) == (0.0, 0.0) and health.check().ok


@pytest.mark.django_db
def test_a_fix_to_a_job_set_aside_for_its_schedule_needs_a_beat_to_take_it_in(declare):
    """A job the beat set aside (paused, with its ``schedule_problem``) whose schedule is then fixed
    in the admin: the fix reaches the row only through a beat, so a beat is needed, although the
    job is still paused until then."""
    row = the_only_job(declare, "WP1", db_now())
    CronJob.objects.filter(id=row.id).update(paused=True, schedule_problem="the schedule cannot be planned",
                                             schedule_seen=F("schedule_version"))
    assert scraped(row)[0] == 0.0  # set aside, nothing to take in: no beat needed for it
    CronJob.objects.filter(id=row.id).update(schedule_version=F("schedule_version") + 1)  # the fixing edit
    assert scraped(row)[0] == 1.0
