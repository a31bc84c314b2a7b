"""Operations against real PostgreSQL (and the session's own Redis queue): purging history,
the retention job, backfills, ``cron_check`` and the beat heartbeat. Commands whose exit
code matters run as real ``python -m django`` processes (``tests.conftest.manage``).
"""

from __future__ import annotations

import datetime as dt
import io
import tracemalloc
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from celery import Celery, current_app
from celery._state import get_current_app
from django.conf import settings
from django.core.management import call_command
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from cron_celery import beat, exceptions, models
from cron_celery.beat import health
from cron_celery.decisions import jobs as job_rows
from cron_celery.declaring import registry
from cron_celery.models import Alert, BeatHeartbeat, CronExecution, CronJob, Status, Trigger
from cron_celery.reconciler import retention
from cron_celery.run import backfill
from tests.conftest import make_job, manage

EXE = CronExecution._meta.db_table
ALERT = Alert._meta.db_table
JOB = CronJob._meta.db_table
BEAT = BeatHeartbeat._meta.db_table
#: Every status the purge must tell apart: two deletable, one final but not asked for, three open.
SIX = ("SUCCEEDED", "SKIPPED", "FAILED", "RUNNING", "PENDING", "RETRYING")
OLD = "timestamptz '2020-01-01 00:00Z'"
RECENT = "now() - interval '1 day'"


def cron_settings(**values: Any) -> override_settings:
    return override_settings(CRON_CELERY={**settings.CRON_CELERY, **values})


def sql(statement: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(statement, params or [])
        return list(cursor.fetchall()) if cursor.description else []


def insert(job: registry.Job, job_id: int, count: int, *, first: str, step: str, statuses: tuple[str, ...] = SIX,
           offset: int = 0) -> None:
    """``count`` executions in one INSERT ... SELECT generate_series: slots ``first + i * step``,
    statuses taking turns (row ``i`` gets ``statuses[(i + offset) % len]``)."""
    sql(
        f"""
        INSERT INTO {EXE} (job_id, task_code, task_name, slot, execution_date, run_number, status, trigger,
                           skip_reason, forced, created_at, completed, message, error_code, traceback,
                           retry_count, celery_task_id, worker)
        SELECT %s, %s, %s, s.at, s.at::date, 1, (%s::text[])[1 + (i + %s) %% %s], 'BEAT', '', false, now(),
               false, 'history', '', '', 0, '', ''
        FROM generate_series(1, %s) AS i, LATERAL (SELECT {first} + i * interval '{step}') AS s(at)
        """,
        [job_id, job.code, job.name, list(statuses), offset, len(statuses), count],
    )


def alert_every(nth: int) -> None:
    """An alert row on every ``nth`` execution (whatever its status and age)."""
    sql(f"""INSERT INTO {ALERT} (execution_id, job_id, event, channel, status, attempts, last_error)
            SELECT id, job_id, 'FAILED', 'webhook', 'SENT', 1, '' FROM {EXE} WHERE id %% %s = 0""", [nth])


def census(before: dt.datetime) -> dict[tuple[str, bool], tuple[int, int]]:
    """(executions, alerts) by (status, slot older than ``before``)."""
    rows = sql(f"""SELECT e.status, e.slot < %s, count(DISTINCT e.id), count(a.id)
                   FROM {EXE} e LEFT JOIN {ALERT} a ON a.execution_id = e.id GROUP BY 1, 2""", [before])
    return {(status, old): (int(executions), int(alerts)) for status, old, executions, alerts in rows}




# --- 6. purge ----------------------------------------------------------------------------------

@pytest.mark.django_db
def test_purge_deletes_exactly_the_old_final_rows_and_their_alerts_in_constant_memory():
    job, job_id = make_job()
    insert(job, job_id, 200_000, first=OLD, step="1 minute")
    insert(job, job_id, 600, first=RECENT, step="1 minute")  # the last day: kept whatever their status
    alert_every(7)
    before = timezone.now() - dt.timedelta(days=30)
    start = census(before)
    assert sum(n for n, _ in start.values()) == 200_600 and start["SUCCEEDED", True][0] > 33_000
    doomed = sum(start[status, True][0] for status in ("SUCCEEDED", "SKIPPED"))
    doomed_alerts = sum(start[status, True][1] for status in ("SUCCEEDED", "SKIPPED"))
    assert doomed_alerts > 9_000
    progress: list[int] = []

    tracemalloc.start()
    try:
        result = retention.purge(before, ("SUCCEEDED", "SKIPPED"), batch_size=5000, progress=progress.append)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert (result.executions, result.alerts) == (doomed, doomed_alerts)
    assert result.batches == -(-doomed // 5000)
    assert progress == [min(5000 * n, doomed) for n in range(1, result.batches + 1)]
    assert peak < 2 * 1024 * 1024, f"purge held {peak / 1e6:.1f} MB at its peak"  # a few rows' worth, not 66k
    end = census(before)
    assert ("SUCCEEDED", True) not in end and ("SKIPPED", True) not in end
    assert end == {key: value for key, value in start.items() if key not in {("SUCCEEDED", True), ("SKIPPED", True)}}
    with connection.cursor() as cursor:  # no alert is left pointing at a deleted execution
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    again = retention.purge(before, ("SUCCEEDED", "SKIPPED"), batch_size=5000)
    assert (again.executions, again.alerts, again.batches) == (0, 0, 0)


@pytest.mark.django_db(transaction=True)
def test_purge_skips_rows_another_transaction_holds_instead_of_waiting():
    job, job_id = make_job()
    insert(job, job_id, 10, first=OLD, step="1 hour", statuses=("SUCCEEDED",))
    held = CronExecution.objects.order_by("id").values_list("id", flat=True)[3]
    db = connection.settings_dict
    with psycopg.connect(dbname=db["NAME"], user=db["USER"], password=db["PASSWORD"] or None,
                         host=db["HOST"], port=db["PORT"]) as other:
        other.execute(f"SELECT id FROM {EXE} WHERE id = %s FOR UPDATE", [held])
        result = retention.purge(timezone.now(), ("SUCCEEDED",), batch_size=4)
        other.rollback()
    assert result.executions == 9
    assert list(CronExecution.objects.values_list("id", flat=True)) == [held]
    assert retention.purge(timezone.now(), ("SUCCEEDED",)).executions == 1  # once it is free


@pytest.mark.django_db
def test_statuses_refuses_open_and_unknown_statuses_and_normalises_the_rest():
    assert retention.statuses(" succeeded, SKIPPED ,SUCCEEDED,") == ("SUCCEEDED", "SKIPPED")
    assert retention.statuses(["lost", "TIMED_OUT", "missed"]) == ("LOST", "TIMED_OUT", "MISSED")
    for open_status in ("RUNNING", "PENDING", "RETRYING", "SUCCEEDED,running"):
        with pytest.raises(ValueError, match="not over and are never deleted"):
            retention.statuses(open_status)
    with pytest.raises(ValueError, match="unknown status BOGUS"):
        retention.statuses("SUCCEEDED,BOGUS")
    with pytest.raises(ValueError, match="name at least one status"):
        retention.statuses(" , ")
    job, job_id = make_job()
    insert(job, job_id, 12, first=OLD, step="1 hour")
    with pytest.raises(ValueError, match="not over"):
        retention.purge(timezone.now(), ("SUCCEEDED", "RUNNING"))
    assert CronExecution.objects.count() == 12  # refused before anything was deleted


# --- 7. purge_cron_executions ------------------------------------------------------------------

@pytest.mark.django_db
def test_purge_command_without_status_deletes_the_retention_statuses():
    job, job_id = make_job()
    insert(job, job_id, 30, first=OLD, step="1 hour")  # 5 of each of SIX (no LOST among them)
    out = io.StringIO()
    with override_settings(CRON_CELERY={"RETENTION_STATUSES": ["SUCCEEDED", "FAILED", "LOST"]}):
        call_command("purge_cron_executions", "--days", "30", "--dry-run", stdout=out)
    assert out.getvalue().startswith("Would delete 10 SUCCEEDED, FAILED, LOST executions with a slot before ")


@pytest.mark.django_db(transaction=True)
def test_purge_command_dry_run_counts_and_a_real_run_deletes():
    job, job_id = make_job()
    insert(job, job_id, 30, first=OLD, step="1 hour")  # 5 of each status
    insert(job, job_id, 6, first=RECENT, step="1 minute")
    sql(f"""INSERT INTO {ALERT} (execution_id, job_id, event, channel, status, attempts, last_error)
            SELECT id, job_id, 'FAILED', 'email', 'SENT', 1, '' FROM {EXE}
            WHERE status = 'SUCCEEDED' AND slot < '2021-01-01' ORDER BY id LIMIT 3""")
    dry = manage("purge_cron_executions", "--days", "30", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.startswith("Would delete 10 SUCCEEDED, SKIPPED executions with a slot before ")
    assert dry.stdout.rstrip().endswith("UTC (dry run).")
    assert (CronExecution.objects.count(), Alert.objects.count()) == (36, 3)

    real = manage("purge_cron_executions", "--days", "30", "--batch-size", "3")
    assert real.returncode == 0, real.stderr
    assert real.stdout.startswith("Deleted 10 SUCCEEDED, SKIPPED executions with a slot before ")
    assert real.stdout.rstrip().endswith("UTC, and 3 of their alerts, in 4 batches.")
    assert CronExecution.objects.count() == 26 and not Alert.objects.exists()
    assert not CronExecution.objects.filter(status__in=["SUCCEEDED", "SKIPPED"], slot__year=2020).exists()
    assert CronExecution.objects.filter(slot__gt=timezone.now() - dt.timedelta(days=2)).count() == 6

    failed = manage("purge_cron_executions", "--days", "30", "--status", "failed")
    assert failed.returncode == 0 and failed.stdout.startswith("Deleted 5 FAILED executions")
    assert set(CronExecution.objects.filter(slot__year=2020).values_list("status", flat=True)) == {
        "PENDING", "RETRYING", "RUNNING"}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("--days", "30", "--status", "RUNNING"), 1,
         "CommandError: --status: RUNNING executions are not over and are never deleted."),
        (("--days", "30", "--status", "SUCCEEDED,BOGUS"), 1, "CommandError: --status: unknown status BOGUS"),
        (("--days", "-1"), 1, "CommandError: --days must be 0 or more and --batch-size at least 1."),
        (("--days", "30", "--batch-size", "0"), 1, "CommandError: --days must be 0 or more"),
        ((), 2, "error: the following arguments are required: --days"),
    ],
)
def test_purge_command_refuses_bad_options_with_one_line_and_deletes_nothing(args, code, message):
    job, job_id = make_job()
    insert(job, job_id, 12, first=OLD, step="1 hour")
    result = manage("purge_cron_executions", *args)
    assert result.returncode == code
    assert message in result.stderr and "Traceback" not in result.stderr
    if code == 1:
        assert len(result.stderr.strip().splitlines()) == 1
    assert CronExecution.objects.count() == 12


# --- 8. backfill ------------------------------------------------------------------------------

def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> dt.datetime:
    return dt.datetime(year, month, day, hour, minute, tzinfo=dt.UTC)


@pytest.mark.django_db
def test_backfill_plans_the_days_slots_in_the_jobs_timezone():
    job = registry.get("nightly-report")  # daily at 02:00 in Europe/Amsterdam
    assert backfill.plan(job, "2026-01-10", "2026-01-12") == backfill.Plan(
        slots=[utc(2026, 1, 10, 1), utc(2026, 1, 11, 1), utc(2026, 1, 12, 1)], done=[])
    assert backfill.plan(job, dt.date(2026, 1, 10), dt.date(2026, 1, 10)).slots == [utc(2026, 1, 10, 1)]
    # 02:00 does not exist on 29 March (it runs at 03:00 CEST, 01:00Z); on 25 October it
    # happens twice and runs once, at the first.
    assert backfill.plan(job, "2026-03-28", "2026-03-30").slots == [
        utc(2026, 3, 28, 1), utc(2026, 3, 29, 1), utc(2026, 3, 30, 0)]
    assert backfill.plan(job, "2026-10-24", "2026-10-26").slots == [
        utc(2026, 10, 24, 0), utc(2026, 10, 25, 0), utc(2026, 10, 26, 1)]


@pytest.mark.django_db
def test_backfill_leaves_out_slots_that_ran_or_run_unless_forced():
    job = registry.get("nightly-report")
    job_id = job_rows.job_id(job)
    for day, status in ((10, Status.FAILED), (11, Status.SUCCEEDED), (12, Status.PENDING)):
        slot = utc(2026, 1, day, 1)
        CronExecution.objects.create(job_id=job_id, task_code=job.code, task_name=job.name, slot=slot,
                                     execution_date=slot.date(), status=status)
    planned = backfill.plan(job, "2026-01-10", "2026-01-13")
    assert planned.slots == [utc(2026, 1, 10, 1), utc(2026, 1, 13, 1)]  # a failure may run again
    assert planned.done == [utc(2026, 1, 11, 1), utc(2026, 1, 12, 1)]
    forced = backfill.plan(job, "2026-01-10", "2026-01-13", force=True)
    assert (len(forced.slots), forced.done) == (4, [])


@pytest.mark.django_db
def test_a_backfill_the_broker_refuses_records_every_slot_and_the_reconciler_sends_them_later(queue):
    job = registry.get("nightly-report")
    planned = backfill.plan(job, "2026-01-10", "2026-01-12")
    working = get_current_app()
    broken = Celery("broker-down", broker="redis://127.0.0.1:1/0", set_as_current=False)
    broken.set_current()
    try:
        with pytest.raises(exceptions.BackfillInterrupted) as caught:
            backfill.send(job, planned)
    finally:
        working.set_current()
        broken.close()
    message = str(caught.value)
    assert message.startswith("The backfill sent 0 of 3 slots and stopped at 2026-01-10T01:00:00Z: every slot is "
                              "recorded, and the reconciler sends those not sent yet")
    rows = list(CronExecution.objects.filter(job__name=job.name).order_by("slot"))
    assert [(row.status, row.trigger, row.forced, bool(row.celery_task_id)) for row in rows] == [
        (Status.PENDING, Trigger.BACKFILL, True, True)] * 3  # nothing lost: the intent is recorded
    assert queue.headers() == []
    sql(f"UPDATE {EXE} SET created_at = now() - interval '1 hour' WHERE job_id = %s", [rows[0].job_id])
    from cron_celery import reconciler

    assert reconciler.run_pass().resent == 3  # the broker answers again: each is sent, under its own id
    assert sorted(m["id"] for m in queue.headers()) == sorted(row.celery_task_id for row in rows)
    assert backfill.plan(job, "2026-01-10", "2026-01-12").slots == []  # a second backfill would not double them


@pytest.mark.django_db
def test_backfill_send_queues_one_forced_backfill_per_slot(queue):
    job = registry.get("nightly-report")
    sent = backfill.send(job, backfill.plan(job, "2026-01-10", "2026-01-11"))
    rows = list(CronExecution.objects.order_by("slot"))
    assert [(row.slot, row.status, row.trigger, row.forced) for row in rows] == [
        (utc(2026, 1, 10, 1), Status.PENDING, Trigger.BACKFILL, True),
        (utc(2026, 1, 11, 1), Status.PENDING, Trigger.BACKFILL, True)]
    assert [s.execution_id for s in sent] == [row.id for row in rows]
    messages = queue.headers()
    assert [(m["id"], m["cron_trigger"], m["cron_rerun"]) for m in messages] == [
        (row.celery_task_id, "BACKFILL", True) for row in rows]


@pytest.mark.django_db(transaction=True)
def test_backfill_command_dry_run_lists_the_slots_and_sends_nothing(queue):
    job = registry.get("nightly-report")
    slot = utc(2026, 1, 11, 1)
    CronExecution.objects.create(job_id=job_rows.job_id(job), task_code=job.code, task_name=job.name, slot=slot,
                                 execution_date=slot.date(), status=Status.SUCCEEDED)
    result = manage("backfill_cron_task", "nightly-report", "--from", "2026-01-10", "--to", "2026-01-12", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "nightly-report 2026-01-10T01:00:00Z",
        "nightly-report 2026-01-12T01:00:00Z",
        "Would send 2 slots of nightly-report, 1 already ran (dry run).",
    ]
    assert CronExecution.objects.count() == 1 and queue.headers() == []


@pytest.mark.django_db(transaction=True)
def test_backfill_command_sends_pending_forced_backfills(queue):
    result = manage("backfill_cron_task", "T107", "--from", "2026-01-10", "--to", "2026-01-12")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "Sent 3 slots of nightly-report to the workers."
    rows = list(CronExecution.objects.order_by("slot"))
    assert [(row.slot, row.execution_date, row.status, row.trigger, row.forced, row.run_number) for row in rows] == [
        (utc(2026, 1, day, 1), dt.date(2026, 1, day), Status.PENDING, Trigger.BACKFILL, True, 1)
        for day in (10, 11, 12)]
    assert [m["cron_execution_id"] for m in queue.headers()] == [row.id for row in rows]
    again = manage("backfill_cron_task", "nightly-report", "--from", "2026-01-10", "--to", "2026-01-12")
    assert again.stdout.strip() == "Sent 0 slots of nightly-report to the workers, 3 already ran."


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("nightly-report", "--from", "2026-01-12", "--to", "2026-01-10"), "the range ends (2026-01-10) before it"),
        (("nightly-report", "--from", "2026-01-10", "--to", "2026-01-12", "--limit", "2"), "holds more than 2 slots"),
        (("calc-commission", "--from", "2026-01-10", "--to", "2026-01-12"), "has no schedule"),
        (("no-such-job", "--from", "2026-01-10", "--to", "2026-01-12"), "Unknown job 'no-such-job'"),
    ],
)
def test_backfill_command_refuses_with_exit_1_and_one_line(queue, args, message):
    result = manage("backfill_cron_task", *args)
    assert result.returncode == 1
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not CronExecution.objects.exists() and queue.headers() == []


# --- 9. cron_check ----------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_cron_check_exits_0_when_healthy():
    nothing = manage("cron_check")  # nothing scheduled: no beat needed
    assert (nothing.returncode, nothing.stdout.strip(), nothing.stderr) == (0, "cron: ok", "")
    _, job_id = make_job()
    sql(f"UPDATE {JOB} SET next_run_at = now() + interval '1 hour' WHERE id = %s", [job_id])
    BeatHeartbeat.objects.create(identity="host-a:1", leading=True)  # the ORM quotes the column
    led = manage("cron_check")
    assert (led.returncode, led.stdout.strip()) == (0, "cron: ok")


@pytest.mark.django_db(transaction=True)
def test_cron_check_exits_1_with_one_line_per_problem():
    job, job_id = make_job()
    sql(f"UPDATE {JOB} SET next_run_at = now() - interval '1 hour' WHERE id = %s", [job_id])
    result = manage("cron_check")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("cron: ") for line in lines)
    assert lines[0].startswith("cron: no beat is leading")
    assert lines[1].startswith(f"cron: job {job.name} ({job.code}) is 36") and "s late for its slot" in lines[1]
    BeatHeartbeat.objects.create(identity="host-a:1", leading=True)
    sql(f"UPDATE {JOB} SET next_run_at = now() + interval '1 hour' WHERE id = %s", [job_id])
    assert manage("cron_check").returncode == 0


# --- 10. the retention job ----------------------------------------------------------------------

@pytest.fixture
def retention_job() -> Iterator[None]:
    """The retention job may be declared during the test; forget it afterwards."""
    yield
    registry.unregister(retention.JOB_NAME)
    current_app.tasks.pop("cron_celery.retention", None)


@pytest.mark.django_db
def test_declare_job_registers_the_daily_retention_job_once(retention_job):
    with cron_settings(RETENTION_DAYS=30):
        retention.declare_job()
        job = registry.get(retention.JOB_NAME)
        retention.declare_job()  # a second call is harmless
        assert registry.get(retention.JOB_NAME) is job
    assert (job.name, job.code, job.task_name) == ("cron-celery-retention", "CC.RETENTION", "cron_celery.retention")
    assert job.schedule is not None and job.schedule.expression == "17 3 * * *"
    assert (job.timezone, job.catch_up) == ("UTC", "latest")
    assert registry.get("CC.RETENTION") is job and registry.by_task_name("cron_celery.retention") is job
    assert current_app.tasks["cron_celery.retention"].name == "cron_celery.retention"


@pytest.mark.django_db
def test_run_retention_deletes_old_final_rows_only_when_configured(retention_job):
    job, job_id = make_job()
    insert(job, job_id, 12, first="now() - interval '60 days'", step="1 hour")  # two of each status
    insert(job, job_id, 6, first="now() - interval '2 days'", step="1 hour")
    with cron_settings(RETENTION_DAYS=None):
        assert retention.run_retention() == "RETENTION_DAYS is not set; nothing deleted"
    assert CronExecution.objects.count() == 18
    with cron_settings(RETENTION_DAYS=30):
        assert retention.run_retention() == (
            "deleted 4 executions older than 30 days (SUCCEEDED, SKIPPED) and 0 alerts")
    assert CronExecution.objects.count() == 14
    assert not CronExecution.objects.filter(status__in=["SUCCEEDED", "SKIPPED"],
                                            slot__lt=timezone.now() - dt.timedelta(days=30)).exists()
    with cron_settings(RETENTION_DAYS=30, RETENTION_STATUSES=("FAILED",)):
        assert retention.run_retention().startswith("deleted 2 executions older than 30 days (FAILED)")
    with cron_settings(RETENTION_DAYS=90):
        assert retention.run_retention().startswith("deleted 0 executions")
    assert sorted(CronExecution.objects.filter(slot__lt=timezone.now() - dt.timedelta(days=30))
                  .values_list("status", flat=True)) == ["PENDING", "PENDING", "RETRYING", "RETRYING",
                                                         "RUNNING", "RUNNING"]


@pytest.mark.django_db
def test_the_retention_job_runs_as_a_tracked_celery_task(retention_job):
    job, job_id = make_job()
    insert(job, job_id, 6, first="now() - interval '60 days'", step="1 hour")
    with cron_settings(RETENTION_DAYS=30):
        retention.declare_job()
        outcome = current_app.tasks["cron_celery.retention"].apply(kwargs={"slot": "2026-11-29T03:17Z"}).get()
    assert outcome["status"] == Status.SUCCEEDED
    assert outcome["result"] == "deleted 2 executions older than 30 days (SUCCEEDED, SKIPPED) and 0 alerts"
    row = CronExecution.objects.get(task_name=retention.JOB_NAME)
    assert (row.status, row.slot, row.trigger) == (Status.SUCCEEDED, utc(2026, 11, 29, 3, 17), Trigger.DIRECT)


# --- 11. the beat heartbeat ---------------------------------------------------------------------

def beats() -> list[tuple[str, bool, dt.datetime, dt.datetime]]:
    return list(BeatHeartbeat.objects.order_by("identity").values_list("identity", "leading", "started_at", "seen_at"))


@pytest.mark.django_db
def test_beat_seen_upserts_one_row_per_beat_and_beat_gone_stands_it_down():
    health.beat_seen("host-a:1", True)
    [(identity, leading, started, seen)] = beats()
    assert (identity, leading, started, seen) == ("host-a:1", True, seen, seen)
    sql(f"UPDATE {BEAT} SET seen_at = seen_at - interval '5 minutes', started_at = started_at - interval '1 hour'")
    health.beat_seen("host-a:1", True)  # seen again: the same row, seen now, started long ago
    [(_, leading, started_again, seen_again)] = beats()
    assert leading and seen_again == seen and started_again == started - dt.timedelta(hours=1)
    health.beat_seen("host-a:1", False)  # lost the lease: still alive, no longer leading
    assert [row[:2] for row in beats()] == [("host-a:1", False)]
    health.beat_seen("host-b:2", True)
    health.beat_gone("host-b:2")
    health.beat_gone("host-z:9")  # an unknown beat: nothing to do
    assert [row[:2] for row in beats()] == [("host-a:1", False), ("host-b:2", False)]
    long = "h" * 250
    health.beat_seen(long, True)
    health.beat_gone(long)
    assert BeatHeartbeat.objects.get(identity=long[:200]).leading is False


@pytest.mark.django_db
def test_a_beat_that_stops_no_longer_counts_as_leading_for_health():
    _, job_id = make_job()
    sql(f"UPDATE {JOB} SET next_run_at = now() + interval '1 hour' WHERE id = %s", [job_id])
    health.beat_seen("host-a:1", True)
    assert health.check().ok
    health.beat_gone("host-a:1")
    report = health.check()
    assert not report.ok and report.beat is None and report.reasons[0].startswith("no beat is leading")


@pytest.mark.django_db(transaction=True)
def test_the_scheduler_heartbeat_writes_on_changes_and_every_few_seconds():
    scheduler = beat.Scheduler.__new__(beat.Scheduler)  # the real constructor starts a whole beat
    scheduler.leadership = beat.Leadership(30.0)
    scheduler._beat_seen, scheduler._beat_leading = -1e9, False
    identity = scheduler.leadership.identity
    scheduler.heartbeat(True)
    assert [row[:2] for row in beats()] == [(identity, True)]
    sql(f"UPDATE {BEAT} SET seen_at = now() - interval '1 minute'")
    scheduler.heartbeat(True)  # nothing changed and it wrote just now: no write
    assert beats()[0][3] < timezone.now() - dt.timedelta(seconds=50)
    scheduler.heartbeat(False)  # a change is written at once
    assert [row[:2] for row in beats()] == [(identity, False)]
    assert beats()[0][3] > timezone.now() - dt.timedelta(seconds=10)
    sql(f"UPDATE {BEAT} SET seen_at = now() - interval '1 minute'")
    scheduler._beat_seen -= 11  # ten seconds (a third of the lease) have passed
    scheduler.heartbeat(False)
    assert beats()[0][3] > timezone.now() - dt.timedelta(seconds=10)


# --- tidying what would otherwise grow for ever ----------------------------------------------

def settled_alerts(job: registry.Job, job_id: int) -> dict[str, int]:
    """Four alerts on four old executions: PENDING and SENT a year ago, FAILED a year ago, SENT
    yesterday; returns their ids by label."""
    insert(job, job_id, 4, first=OLD, step="1 hour", statuses=("FAILED",))
    ids = [row[0] for row in sql(f"SELECT id FROM {EXE} WHERE job_id = %s ORDER BY id", [job_id])]
    made = {}
    for label, execution_id, status, age in (("pending-old", ids[0], "PENDING", "365 days"),
                                             ("sent-old", ids[1], "SENT", "365 days"),
                                             ("given-up-old", ids[2], "FAILED", "91 days"),
                                             ("sent-recent", ids[3], "SENT", "1 day")):
        alert = Alert.objects.create(execution_id=execution_id, job_id=job_id, event="FAILED", channel="webhook",
                                     status=status)
        sql(f"UPDATE {ALERT} SET updated_at = now() - interval '{age}' WHERE id = %s", [alert.id])
        made[label] = alert.id
    return made


def heartbeats(*ages: str) -> None:
    for n, age in enumerate(ages):
        sql(f"INSERT INTO {BEAT} (identity, \"leading\", started_at, seen_at) VALUES (%s, false, now(), now() - "
            f"interval '{age}')", [f"gone-host:{n}"])


@pytest.mark.django_db
def test_tidy_deletes_gone_beats_and_settled_old_alerts_and_nothing_else():
    job, job_id = make_job()
    made = settled_alerts(job, job_id)
    heartbeats("8 days", "30 days", "6 days", "1 minute")
    tidied = retention.tidy(batch=1000)
    assert (tidied.heartbeats, tidied.alerts) == (2, 2)
    assert sorted(BeatHeartbeat.objects.values_list("identity", flat=True)) == ["gone-host:2", "gone-host:3"]
    assert set(Alert.objects.values_list("id", flat=True)) == {made["pending-old"], made["sent-recent"]}
    assert CronExecution.objects.filter(job_id=job_id).count() == 4  # the executions are retention's to delete
    again = retention.tidy(batch=1000)
    assert (again.heartbeats, again.alerts) == (0, 0)


@pytest.mark.django_db
def test_tidy_deletes_in_batches_and_keeps_alerts_when_their_retention_is_off():
    job, job_id = make_job()
    made = settled_alerts(job, job_id)
    heartbeats("8 days", "9 days", "10 days")
    with cron_settings(ALERT_RETENTION_DAYS=None):
        first = retention.tidy(batch=2)
    assert (first.heartbeats, first.alerts) == (2, 0)
    assert Alert.objects.count() == 4
    with cron_settings(ALERT_RETENTION_DAYS=400):
        within = retention.tidy(batch=2)
    assert (within.heartbeats, within.alerts) == (1, 0)  # the third beat; a year is within 400 days
    second = retention.tidy(batch=1)
    assert (second.heartbeats, second.alerts) == (0, 1)
    assert retention.tidy(batch=1).alerts == 1
    assert set(Alert.objects.values_list("id", flat=True)) == {made["pending-old"], made["sent-recent"]}


@pytest.mark.django_db
def test_a_reconciler_pass_tidies_once_an_hour_across_workers():
    from cron_celery import reconciler

    sql(f"DELETE FROM {models.Lease._meta.db_table} WHERE name = %s", [reconciler.TIDY_LEASE])
    heartbeats("8 days")
    assert reconciler.run_pass().tidied == 1
    heartbeats("9 days")
    assert reconciler.run_pass().tidied == 0  # within the hour: another pass (any worker's) already tidied
    assert BeatHeartbeat.objects.filter(identity="gone-host:0").exists()
    sql(f"UPDATE {models.Lease._meta.db_table} SET lease_until = now() WHERE name = %s", [reconciler.TIDY_LEASE])
    assert reconciler.run_pass().tidied == 1
    assert not BeatHeartbeat.objects.filter(identity__startswith="gone-host").exists()


def test_a_bad_alert_retention_is_a_check_error():
    from cron_celery import checks

    for value in (0, "90", True, 1.5):
        with cron_settings(ALERT_RETENTION_DAYS=value):
            assert [message.id for message in checks.check_operations()] == ["cron_celery.E013"], value
    with cron_settings(ALERT_RETENTION_DAYS=None):
        assert checks.check_operations() == []
