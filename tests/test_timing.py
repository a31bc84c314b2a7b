"""Timing alerts on real PostgreSQL: a run not started by its job's ``start_deadline`` (LATE), one
still running past ``max_runtime`` (LONG_RUNNING), a success faster than ``min_runtime`` (TOO_FAST).
The declaration's rules, the reconciler's marks (once each, through their partial indexes), the
alert rows and what they say, delivered to a real local webhook, the dashboard's badges and Sentry's
monitor. Real workers, a beat and a queue nobody consumes: tests/faults/test_timing.py."""

from __future__ import annotations

import datetime as dt
import re
import time
from typing import Any

import pytest
from django.conf import settings
from django.core import checks as django_checks
from django.db import connection
from django.test import override_settings

from cron_celery import alerts, checks, reconciler
from cron_celery.alerts import delivery, sentry, timing_texts
from cron_celery.decisions import dispatch, timing
from cron_celery.decisions import jobs as job_rows
from cron_celery.declaring import registry
from cron_celery.models import Alert, AlertStatus, CronExecution, CronJob, Event, Status, Trigger
from cron_celery.run import runs, tasks
from cron_celery.schedules import every
from cron_celery.web import dashboard
from tests.conftest import db_now
from tests.servers import HttpServer

pytestmark = pytest.mark.django_db

SLOT = dt.datetime(2026, 11, 29, 1, 0, tzinfo=dt.UTC)


def with_webhook(url: str = "http://127.0.0.1:9/hook", **extra: Any) -> override_settings:
    """The test settings with failure alerts going to one webhook."""
    return override_settings(CRON_CELERY={**settings.CRON_CELERY, **extra, "NOTIFICATIONS": {
        "on_failure": ["webhook"], "webhook": {"url": url, "secret": "timing"}}})


def pending(job: registry.Job, *, due_ago: float | None, trigger: str = Trigger.BEAT,
            slot: dt.datetime = SLOT) -> int:
    """A PENDING execution of ``job``; a scheduled one (``due_ago`` seconds ago) has its ``due_at``,
    and was recorded then."""
    execution_id, _ = dispatch.enqueue(job=job, job_id=job_rows.job_id(job), slot=slot,
                                       execution_date=slot.date(), trigger=trigger)
    if due_ago is not None:  # as the beat writes it: recorded when it was due
        due = db_now() - dt.timedelta(seconds=due_ago)
        CronExecution.objects.filter(id=execution_id).update(due_at=due, created_at=due)
    return execution_id


def running(job: registry.Job, *, started_ago: float, slot: dt.datetime = SLOT) -> int:
    execution_id = pending(job, due_ago=None, slot=slot)
    CronExecution.objects.filter(id=execution_id).update(
        status=Status.RUNNING, started=db_now() - dt.timedelta(seconds=started_ago), worker="w1@host", pid=4242,
        lease_until=db_now() + dt.timedelta(hours=1))  # its worker renews the lease
    return execution_id


def events_of(execution_id: int) -> list[tuple[str, str]]:
    return list(Alert.objects.filter(execution_id=execution_id).order_by("event", "channel")
                .values_list("event", "channel"))


# --- the declaration ---------------------------------------------------------------------------

def test_the_three_bounds_are_seconds_above_zero_and_the_shortest_below_the_longest():
    job = registry.declare(name="t", code="TM0", task_name="t", start_deadline=300, max_runtime=7200,
                           min_runtime=0.5)
    assert (job.start_deadline, job.max_runtime, job.min_runtime) == (300.0, 7200.0, 0.5)
    assert registry.declare(name="t", code="TM0", task_name="t").start_deadline is None
    bad: tuple[tuple[str, object], ...] = (("start_deadline", 0), ("max_runtime", -1), ("min_runtime", "5"),
                                           ("max_runtime", True), ("start_deadline", float("inf")),
                                           ("max_runtime", float("nan")), ("min_runtime", 1e13))
    for option, value in bad:
        with pytest.raises(Exception, match=rf"{option} must be a number of seconds greater than 0 and at most "
                                            rf"1e\+08, not {re.escape(repr(value))}"):
            registry.declare(name="t", code="TM0", task_name="t", **{option: value})  # type: ignore[arg-type]
    with pytest.raises(Exception, match=r"min_runtime \(60 s\) must be shorter than max_runtime \(60 s\)"):
        registry.declare(name="t", code="TM0", task_name="t", min_runtime=60, max_runtime=60)


def test_default_start_deadline_applies_to_jobs_that_declare_none_and_is_checked():
    with override_settings(CRON_CELERY={**settings.CRON_CELERY, "DEFAULT_START_DEADLINE": 120}):
        assert registry.declare(name="t", code="TM0", task_name="t").start_deadline == 120.0
        assert registry.declare(name="t", code="TM0", task_name="t", start_deadline=5).start_deadline == 5.0
        # False opts one job out of the default.
        assert registry.declare(name="t", code="TM0", task_name="t", start_deadline=False).start_deadline is None
        assert not [e for e in checks.check_timing() if "DEFAULT_START_DEADLINE" in e.msg]
    for wrong in ("soon", float("inf"), 2e9, 0):
        with override_settings(CRON_CELERY={**settings.CRON_CELERY, "DEFAULT_START_DEADLINE": wrong}):
            assert registry.declare(name="t", code="TM0", task_name="t").start_deadline is None
            (error,) = [e for e in checks.check_timing() if "DEFAULT_START_DEADLINE" in e.msg]
            assert error.id == "cron_celery.E002" and error.level == django_checks.ERROR
            assert f"must be a number of seconds above 0 and at most 1e+08, or None, not {wrong!r}" in error.msg


def test_both_decorators_take_the_bounds_and_the_job_row_keeps_them():
    from cron_celery import TrackedTask, cron_task, register_task

    def body(run: object) -> str:
        return "ok"

    task = cron_task(name="timed-fn", code="TM1", task_name="tests.fake.timed_fn", start_deadline=30,
                     max_runtime=600, min_runtime=1)(body)  # type: ignore[arg-type]

    @register_task("timed-cls", code="TM2", task_name="tests.fake.TimedCls", max_runtime=60)
    class TimedCls(TrackedTask):
        def execute(self, execution_date: dt.date) -> str:
            return "ok"

    try:
        function_job, class_job = registry.get("timed-fn"), registry.get("timed-cls")
        assert (function_job.start_deadline, function_job.max_runtime, function_job.min_runtime) == (30, 600, 1)
        assert (class_job.start_deadline, class_job.max_runtime, class_job.min_runtime) == (None, 60, None)
        job_rows.ensure_jobs([function_job, class_job])
        assert dict(CronJob.objects.filter(code__in=["TM1", "TM2"]).values_list("code", "max_runtime")) == {
            "TM1": 600.0, "TM2": 60.0}
        row = CronJob.objects.get(code="TM1")
        assert (row.start_deadline, row.max_runtime, row.min_runtime) == (30.0, 600.0, 1.0)
        # A deploy that drops the bound clears it (ensure_job, one job at a time this time).
        job_rows.ensure_job(registry.declare(name="timed-fn", code="TM1", task_name="tests.fake.timed_fn"))
        row.refresh_from_db()
        assert (row.start_deadline, row.max_runtime, row.min_runtime) == (None, None, None)
        assert task.name == "tests.fake.timed_fn"
    finally:
        registry.unregister("timed-fn")
        registry.unregister("timed-cls")


# --- late and long runs: the reconciler's marks ----------------------------------------------------

def test_a_run_not_started_by_its_deadline_is_marked_and_alerted_late_once(declare):
    job = declare("late-job", "TL1", schedule=every(minutes=1), start_deadline=60)
    other = declare("no-deadline", "TL2", schedule=every(minutes=1))
    job_rows.ensure_jobs([job, other])
    late = pending(job, due_ago=90)
    on_time = pending(job, due_ago=30, slot=SLOT + dt.timedelta(minutes=1))
    # A run a person sent, even for a slot three days old, is not watched (somebody asked for it).
    asked = pending(job, due_ago=None, trigger=Trigger.ENQUEUE, slot=SLOT - dt.timedelta(days=3))
    never = pending(other, due_ago=3600)
    with with_webhook():
        first = reconciler.run_pass()
        second = reconciler.run_pass()
    assert (first.late, second.late) == (1, 0)
    assert events_of(late) == [("LATE", "webhook")]
    assert events_of(on_time) == events_of(asked) == events_of(never) == []
    assert set(CronExecution.objects.filter(late_alerted=True).values_list("id", flat=True)) == {late}
    # Still PENDING: the alert is about a run that waits; nothing else about it changed.
    row = CronExecution.objects.get(id=late)
    assert (row.status, row.started, row.completed) == (Status.PENDING, None, False)


def test_what_is_watched_and_when_each_was_due(declare):
    """A beat slot is due at its due_at, or when the beat sent it if later (the newest slot after an
    outage); a downstream slot when it was sent; an unsent one-off at its time. Catch-up slots and
    backfills queue behind each other on purpose: not watched."""
    job = declare("late-asked", "TL3", schedule=every(minutes=1), start_deadline=60)
    job_rows.ensure_job(job)
    old = SLOT - dt.timedelta(days=1)
    rows = {trigger: pending(job, due_ago=None, trigger=trigger, slot=old + dt.timedelta(minutes=n))
            for n, trigger in enumerate((Trigger.BEAT, Trigger.UPSTREAM, Trigger.CATCH_UP, Trigger.BACKFILL))}
    CronExecution.objects.filter(id__in=rows.values()).update(created_at=db_now() - dt.timedelta(seconds=30),
                                                              due_at=old)
    # At :30 of a minute: a whole minute is a slot the every-minute schedule runs anyway (refused).
    one_off = tasks.schedule_one_off(job, (db_now() + dt.timedelta(hours=1)).replace(second=30, microsecond=0))
    with with_webhook():
        assert reconciler.run_pass().late == 0  # sent 30 s ago: within the deadline, whatever the slot
        CronExecution.objects.filter(id__in=rows.values()).update(created_at=db_now() - dt.timedelta(seconds=61))
        # No beat sent the one-off: an hour later (the test moves its times back instead) it is late too.
        CronExecution.objects.filter(id=one_off.execution_id).update(
            due_at=db_now() - dt.timedelta(seconds=75), created_at=db_now() - dt.timedelta(hours=1, seconds=75))
        assert reconciler.run_pass().late == 3
    assert [events_of(rows[trigger]) for trigger in (Trigger.BEAT, Trigger.UPSTREAM)] == [[("LATE", "webhook")]] * 2
    assert events_of(one_off.execution_id) == [("LATE", "webhook")]
    assert events_of(rows[Trigger.CATCH_UP]) == events_of(rows[Trigger.BACKFILL]) == []
    # Each alert keeps what it was decided on: when the run was due.
    (fact,) = Alert.objects.filter(execution_id=rows[Trigger.BEAT]).values_list("facts", flat=True)
    assert dt.datetime.fromisoformat(fact["due"]) == CronExecution.objects.get(id=rows[Trigger.BEAT]).created_at
    story = timing_texts.story(Event.LATE, CronExecution.objects.get(id=one_off.execution_id))
    assert story.endswith("no beat has sent this one-off run (is a beat running?).")


def test_a_retry_counts_its_running_time_from_its_own_start(declare):
    job = declare("long-retry", "TLC", schedule=every(minutes=1), max_runtime=600)
    job_rows.ensure_job(job)
    retried = running(job, started_ago=1200)  # attempt 1 began 20 min ago; attempt 2 began just now
    CronExecution.objects.filter(id=retried).update(retry_count=1, attempts=[
        {"attempt": 1, "started": (db_now() - dt.timedelta(seconds=1200)).isoformat(), "status": "FAILED",
         "ended": (db_now() - dt.timedelta(seconds=1100)).isoformat()},
        {"attempt": 2, "started": (db_now() - dt.timedelta(seconds=5)).isoformat()}])
    with with_webhook():
        assert reconciler.run_pass().long_running == 0
        assert dashboard.with_figures(CronJob.objects.filter(code="TLC")).get().timing == [None, None]
        CronExecution.objects.filter(id=retried).update(attempts=[
            {"attempt": 1, "started": (db_now() - dt.timedelta(seconds=1200)).isoformat(), "status": "FAILED"},
            {"attempt": 2, "started": (db_now() - dt.timedelta(seconds=650)).isoformat()}])
        assert reconciler.run_pass().long_running == 1
    assert events_of(retried) == [("LONG_RUNNING", "webhook")]


def test_a_run_past_max_runtime_is_alerted_long_running_once_and_not_stopped(declare):
    job = declare("long-job", "TL4", schedule=every(minutes=1), max_runtime=600)
    job_rows.ensure_job(job)
    long = running(job, started_ago=601)
    short = running(job, started_ago=30, slot=SLOT + dt.timedelta(minutes=1))
    with with_webhook():
        assert [reconciler.run_pass().long_running for _ in range(2)] == [1, 0]
    assert events_of(long) == [("LONG_RUNNING", "webhook")] and events_of(short) == []
    row = CronExecution.objects.get(id=long)
    assert (row.status, row.long_alerted, row.ended) == (Status.RUNNING, True, None)


def test_a_mark_and_its_alert_commit_together(declare, caplog):
    """A pass whose alert write fails leaves the execution unmarked and says so: the next pass alerts it."""
    job = declare("late-rollback", "TL5", schedule=every(minutes=1), start_deadline=10)
    job_rows.ensure_job(job)
    late = pending(job, due_ago=20)
    with with_webhook(), connection.cursor() as cursor:
        cursor.execute("ALTER TABLE cron_celery_alert ADD CONSTRAINT no_late CHECK (event <> 'LATE') NOT VALID")
        try:
            report = reconciler.Report()
            reconciler._timing(report, 100)  # the pass's other steps are done already: it goes on
            assert report.late == 0
            assert "the LATE check failed; the next pass tries again" in caplog.text and "no_late" in caplog.text
        finally:
            cursor.execute("ALTER TABLE cron_celery_alert DROP CONSTRAINT no_late")
        assert not CronExecution.objects.get(id=late).late_alerted
        assert reconciler.run_pass().late == 1
    assert events_of(late) == [("LATE", "webhook")]


def test_the_marks_read_a_partial_index_not_the_history(declare):
    """The statements the marks really run, explained over 20,000 finished executions: each reads
    its partial index (the in-flight rows), never the history."""
    from django.db import transaction

    job = declare("late-index", "TL6", schedule=every(minutes=1), start_deadline=10, max_runtime=10)
    job_id = job_rows.ensure_job(job)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {timing.EXE} (job_id, task_code, task_name, slot, execution_date, run_number, status,"
            " trigger, skip_reason, forced, force, created_at, started, ended, completed, success, message,"
            " error_code, traceback, retry_count, celery_task_id, worker, attempts)"
            " SELECT %s, 'TL6', 'late-index', %s - make_interval(mins => n), %s, 1, 'SUCCEEDED', 'BEAT', '', false,"
            " false, now(), now(), now(), true, true, '', '', '', 0, '', '', '[]'::jsonb"
            " FROM generate_series(1, 20000) AS n", [job_id, SLOT, SLOT.date()])
        cursor.execute(f"ANALYZE {timing.EXE}")
    pending(job, due_ago=20, slot=SLOT + dt.timedelta(minutes=1))
    running(job, started_ago=20, slot=SLOT + dt.timedelta(minutes=2))
    statements: list[tuple[str, Any]] = []

    def capture(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if "SAVEPOINT" not in sql:
            statements.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture), transaction.atomic():
        assert [len(timing.mark_late(100)), len(timing.mark_long_running(100))] == [1, 1]
        transaction.set_rollback(True)
    assert len(statements) == 4  # per mark: the job rows, then the executions
    plans = []
    with connection.cursor() as cursor:
        for sql, params in statements:
            cursor.execute("EXPLAIN " + sql, params)
            plans.append("\n".join(row[0] for row in cursor.fetchall()))
    for plan, index in zip(plans, ["cron_exec_late_unalerted"] * 2 + ["cron_exec_long_unalerted"] * 2, strict=True):
        assert index in plan, plan
        assert "Seq Scan on cron_celery_cronexecution" not in plan, plan


# --- finished too fast --------------------------------------------------------------------------

def test_a_success_faster_than_min_runtime_alerts_too_fast_and_a_slower_one_does_not(declare):
    job = declare("too-fast", "TL7", schedule=every(minutes=1), min_runtime=0.3, pattern="always")
    job_rows.ensure_job(job)
    with with_webhook():
        quick = runs.execute(job, SLOT, lambda run: "nothing to do", trigger=Trigger.MANUAL)
        slow = runs.execute(job, SLOT + dt.timedelta(minutes=1), lambda run: time.sleep(0.4) or "done",
                            trigger=Trigger.MANUAL)
        failed = runs.execute(job, SLOT + dt.timedelta(minutes=2), lambda run: {"error": True},
                              trigger=Trigger.MANUAL)
    assert (quick.status, slow.status, failed.status) == (Status.SUCCEEDED, Status.SUCCEEDED, Status.FAILED)
    assert quick.execution_id and slow.execution_id and failed.execution_id
    assert events_of(quick.execution_id) == [("TOO_FAST", "webhook")]
    assert events_of(slow.execution_id) == []
    assert events_of(failed.execution_id) == [("FAILED", "webhook")]  # a failure is not "too fast"


# --- what the alerts say, delivered for real -------------------------------------------------------

def test_each_timing_alert_says_what_was_late_or_long_to_a_real_webhook(declare):
    hook = HttpServer().start()
    try:
        job = declare("said-job", "TL8", schedule=every(minutes=1), start_deadline=60, max_runtime=600,
                      min_runtime=5, pattern="always", overlap="allow")  # runs beside its long run
        job_rows.ensure_job(job)
        late = pending(job, due_ago=90)
        long = running(job, started_ago=700, slot=SLOT + dt.timedelta(minutes=1))
        with with_webhook(hook.url):
            reconciler.run_pass()
            quick = runs.execute(job, SLOT + dt.timedelta(minutes=2), lambda run: "ok", trigger=Trigger.MANUAL)
            for alert in Alert.objects.filter(job__code="TL8"):
                assert delivery.deliver(alert.id) == AlertStatus.SENT
        bodies = {body["event"]: body for body in (request.json() for request in hook.received())}
    finally:
        hook.stop()
    assert set(bodies) == {"LATE", "LONG_RUNNING", "TOO_FAST"}
    assert (bodies["LATE"]["execution_id"], bodies["LATE"]["status"], bodies["LATE"]["error_code"]) == (
        late, "PENDING", "LATE")
    # the time it had waited or run when the reconciler found it, beside the bound (90 s and 700 s ago)
    assert re.match(r"Not started 1 min 3\d s after it was due \(.*; found at .*; start_deadline 60 s\)",
                    bodies["LATE"]["error"]), bodies["LATE"]["error"]
    assert "start_deadline 60 s): no worker has taken its message" in bodies["LATE"]["error"]
    assert (bodies["LONG_RUNNING"]["execution_id"], bodies["LONG_RUNNING"]["status"]) == (long, "RUNNING")
    assert re.match(r"Still running 11 min 4\d s after its attempt started at .* \(found at .*; max_runtime 600 s\), "
                    r"on w1@host \(pid 4242\)\. It is not stopped", bodies["LONG_RUNNING"]["error"]), \
        bodies["LONG_RUNNING"]["error"]
    assert bodies["TOO_FAST"]["execution_id"] == quick.execution_id
    assert bodies["TOO_FAST"]["error"].startswith("Succeeded faster than its min_runtime of 5 s (its body took 0.")


def test_a_late_run_waiting_for_the_live_one_says_so_and_one_that_started_says_when():
    from cron_celery.models import CronJob as Job

    job = Job(start_deadline=60)
    due = SLOT
    waiting = CronExecution(job=job, status=Status.PENDING, due_at=due, created_at=due, waiting_since=due,
                            message="Waiting for execution 41 of the job to end (overlap skip).\nmore")
    assert timing_texts.story(Event.LATE, waiting).endswith(
        "it waits for room to run: Waiting for execution 41 of the job to end (overlap skip).")
    started = CronExecution(job=job, status=Status.RUNNING, due_at=due, created_at=due,
                            started=due + dt.timedelta(minutes=4, seconds=10))
    assert timing_texts.story(Event.LATE, started).endswith(
        "It started at 2026-11-29 01:04:10 UTC, 4 min 10 s after it was due.")
    assert [timing_texts._seconds(value) for value in (0.421, 48, 250, 7500, 600, 7200)] == [
        "0.42 s", "48 s", "4 min 10 s", "2 h 5 min", "10 min", "2 h"]


# --- the dashboard and Sentry ------------------------------------------------------------------

def test_the_dashboard_shows_late_and_running_badges_past_the_bounds(declare):
    job = declare("badge-job", "TL9", schedule=every(minutes=1), start_deadline=60, max_runtime=3600)
    calm = declare("badge-calm", "TLA", schedule=every(minutes=1), start_deadline=600, max_runtime=36000)
    job_rows.ensure_jobs([job, calm])
    pending(job, due_ago=250)
    running(job, started_ago=7300, slot=SLOT + dt.timedelta(minutes=1))
    pending(calm, due_ago=250)
    running(calm, started_ago=7300, slot=SLOT + dt.timedelta(minutes=1))
    rows = {row.code: row for row in dashboard.with_figures(CronJob.objects.filter(code__in=["TL9", "TLA"]))}
    assert rows["TLA"].timing == [None, None]
    late, ran = rows["TL9"].timing
    assert 250 <= late < 300 and 7300 <= ran < 7350
    shown = str(dashboard.timing_badges(rows["TL9"].timing))
    assert ">late 4 min</span>" in shown and ">running 2 h</span>" in shown
    assert str(dashboard.timing_badges(rows["TLA"].timing)) == ""


def test_sentry_monitors_take_the_declared_deadline_and_max_runtime():
    plain = registry.declare(name="m", code="TM9", task_name="t", schedule=every(minutes=5))
    bounded = registry.declare(name="m", code="TM9", task_name="t", schedule=every(minutes=5),
                               start_deadline=300, max_runtime=7200)
    assert (sentry.monitor_config(plain)["checkin_margin"], sentry.monitor_config(plain)["max_runtime"]) == (1, 60)
    assert (sentry.monitor_config(bounded)["checkin_margin"], sentry.monitor_config(bounded)["max_runtime"]) == (
        5, 120)
    with override_settings(CRON_CELERY={**settings.CRON_CELERY, "NOTIFICATIONS": {
            "sentry": {"checkin_margin": 10}}}):  # a wider configured margin is kept
        assert sentry.monitor_config(bounded)["checkin_margin"] == 10


def test_the_history_marks_runs_that_were_alerted_late_or_long(declare, admin_client):
    job = declare("history-marks", "TLB", schedule=every(minutes=1), start_deadline=60, max_runtime=60)
    job_rows.ensure_job(job)
    late = pending(job, due_ago=90)
    long = running(job, started_ago=90, slot=SLOT + dt.timedelta(minutes=1))
    calm = pending(job, due_ago=10, slot=SLOT + dt.timedelta(minutes=2))
    with with_webhook():
        reconciler.run_pass()
    page = admin_client.get(f"/admin/cron_celery/cronexecution/?job={job_rows.job_id(job)}").content.decode()
    rows = {execution_id: page[page.index(f'name="_selected_action" value="{execution_id}"'):].split("</tr>")[0]
            for execution_id in (late, long, calm)}
    assert ">late</span>" in rows[late] and ">ran long</span>" not in rows[late]
    assert ">ran long</span>" in rows[long] and ">late</span>" not in rows[long]
    assert ">late</span>" not in rows[calm] and ">ran long</span>" not in rows[calm]


@pytest.mark.django_db(transaction=True)
def test_a_mark_and_a_final_write_of_the_same_job_wait_for_each_other_and_never_deadlock(declare):
    """The reconciler marks a long run and, before it commits, the run's worker writes its success
    (which locks the job row first): the mark holds the job row already, so the final write waits
    for it and both commit. (Before, the mark locked only the execution, the alert rows' foreign key
    asked for the job row at commit, and one of the two was aborted: deadlock detected.)"""
    import threading

    from django.db import connections, transaction

    from cron_celery.run import outcomes

    job = declare("long-race", "TLD", schedule=every(minutes=1), max_runtime=1)
    job_id = job_rows.ensure_job(job)
    execution_id = running(job, started_ago=60)
    CronExecution.objects.filter(id=execution_id).update(fence=7, lease_until=db_now() + dt.timedelta(minutes=5))
    marked, results = threading.Event(), dict[str, object]()

    def reconcile() -> None:
        try:
            with with_webhook(), transaction.atomic():
                flagged = timing.mark_long_running(100)
                marked.set()
                time.sleep(1.0)  # the worker's final write comes now
                alerts.record_timing(flagged, Event.LONG_RUNNING)
            results["reconciler"] = [f.execution_id for f in flagged]
        except Exception as error:  # reported by the assertion
            results["reconciler"] = repr(error)
        finally:
            marked.set()
            connections.close_all()

    def finish() -> None:
        marked.wait(10)
        try:
            results["worker"] = outcomes.finish(job, job_id, execution_id, SLOT, fence=7, status=Status.SUCCEEDED,
                                                message="", error_code="", traceback="", result=None,
                                                history=False, runtime=60.0)
        except Exception as error:  # reported by the assertion
            results["worker"] = repr(error)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=reconcile), threading.Thread(target=finish)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert results == {"reconciler": [execution_id], "worker": True}
    row = CronExecution.objects.get(id=execution_id)
    assert (row.status, row.long_alerted) == (Status.SUCCEEDED, True)
    assert events_of(execution_id) == [("LONG_RUNNING", "webhook")]
