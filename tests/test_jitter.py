"""Jitter: a job's slots are sent a fixed offset after the slot, derived from its code; the
slot itself does not move. The offset, the declaration's rules, the beat's "is it due" (through
``due_at``, kept by a trigger), catch-up, health, metrics and Sentry's margin."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings

from cron_celery import beat, catch_up, checks, exceptions
from cron_celery.alerts import sentry
from cron_celery.beat import health, planning
from cron_celery.decisions import dispatch
from cron_celery.decisions import jobs as job_rows
from cron_celery.declaring import registry
from cron_celery.models import CronExecution, CronJob, Status, Trigger
from cron_celery.schedules import every
from cron_celery.web import metrics

SLOT = dt.datetime(2026, 11, 29, 10, 0, tzinfo=dt.UTC)


def declared(code: str = "JIT-1", **options: object) -> registry.Job:
    """A job declared on the fly with a fixed code, so its offset is known (a hash of the code)."""
    return registry.declare(name=f"jittery-{code.lower()}", code=code, task_name="tests.fake.jittery",
                            **options)  # type: ignore[arg-type]


def with_row(code: str, **options: object) -> tuple[registry.Job, int]:
    job = declared(code, **options)
    return job, job_rows.ensure_job(job)


def default_jitter(value: object) -> override_settings:
    return override_settings(CRON_CELERY={**settings.CRON_CELERY, "DEFAULT_JITTER": value})


def test_the_offset_is_fixed_by_the_code_below_the_jitter_and_spread_across_codes():
    job = declared(jitter=30)
    assert job.jitter == 30 and 0 <= job.jitter_ms < 30_000
    assert declared(jitter=30).jitter_ms == job.jitter_ms  # the same on every beat, after every deploy
    offsets = {registry.declare(name=f"j-{i}", code=f"C{i}", task_name="t", jitter=60).jitter_ms for i in range(200)}
    assert len(offsets) > 190 and min(offsets) < 6_000 and max(offsets) > 54_000  # spread over the minute
    assert declared().jitter_ms == 0 and declared(jitter=0).jitter_ms == 0


def test_a_jitter_as_long_as_the_schedules_interval_is_refused_and_a_bad_value_named():
    with pytest.raises(exceptions.ImproperlyDeclared, match=r"jitter \(60 s\) must be shorter than the "
                                                           r"schedule's shortest interval \(60 s\)"):
        declared(jitter=60, schedule=every(minutes=1))
    assert declared(jitter=59.5, schedule=every(minutes=1)).jitter == 59.5
    with pytest.raises(exceptions.ImproperlyDeclared, match=r"jitter must be a number of seconds at least 0, "
                                                           r"not 'soon'"):
        declared(jitter="soon")
    with pytest.raises(exceptions.ImproperlyDeclared, match="not -1"):
        declared(jitter=-1)


def test_the_default_jitter_applies_to_jobs_without_their_own_cut_to_a_tenth_of_the_interval():
    with default_jitter(300):
        assert declared(schedule=every(hours=1)).jitter == 300
        assert declared(schedule=every(minutes=1)).jitter == 6  # a tenth of a minute
        assert declared().jitter == 300  # no schedule in code: the admin's, unknown here
        assert declared(jitter=0, schedule=every(hours=1)).jitter == 0  # its own wins
        assert not [e for e in checks.check_timing() if "DEFAULT_JITTER" in e.msg]
    for bad in ("lots", -5, True):
        with default_jitter(bad):
            errors = [(e.id, e.msg) for e in checks.check_timing() if "DEFAULT_JITTER" in e.msg]
            assert errors == [("cron_celery.E002", "CRON_CELERY['DEFAULT_JITTER'] must be a number of seconds of "
                                                   f"at least 0, not {bad!r}.")]
            assert declared(schedule=every(hours=1)).jitter == 0  # the check stops workers; nothing breaks here


@pytest.mark.django_db
def test_due_at_follows_next_run_at_whoever_writes_it():
    job, job_id = with_row("JIT-1", jitter=50)
    CronJob.objects.filter(id=job_id).update(next_run_at=SLOT)
    row = CronJob.objects.get(id=job_id)
    assert row.jitter_ms == job.jitter_ms and row.due_at == SLOT + dt.timedelta(milliseconds=job.jitter_ms)
    with connection.cursor() as cursor:  # raw SQL too
        cursor.execute("UPDATE cron_celery_cronjob SET next_run_at = %s WHERE id = %s",
                       [SLOT + dt.timedelta(hours=1), job_id])
        cursor.execute("UPDATE cron_celery_cronjob SET due_at = now() WHERE id = %s", [job_id])  # cannot drift
    assert CronJob.objects.get(id=job_id).due_at == SLOT + dt.timedelta(hours=1, milliseconds=job.jitter_ms)
    CronJob.objects.filter(id=job_id).update(next_run_at=None)
    assert CronJob.objects.get(id=job_id).due_at is None


@pytest.mark.django_db
def test_a_slot_is_due_once_its_offset_has_passed_and_its_row_records_when_it_was_due():
    job, job_id = with_row("JIT-1", pattern="always", overlap="allow", jitter=50, catch_up="none")
    offset = dt.timedelta(milliseconds=job.jitter_ms)
    assert offset == dt.timedelta(milliseconds=11_340)  # JIT-1's, below 50 s
    CronJob.objects.filter(id=job_id).update(next_run_at=SLOT, schedule="0 * * * *", schedule_timezone="UTC")
    assert dispatch.next_due()[0] is not None
    assert job_id not in {row.job_id for row in dispatch.due_jobs(SLOT + offset - dt.timedelta(milliseconds=1))}
    (row,) = [row for row in dispatch.due_jobs(SLOT + offset) if row.job_id == job_id]
    assert row.jitter_ms == job.jitter_ms
    # On time at slot + offset: catch-up "none" runs it (its grace counts from the offset).
    decision = beat.plan(row, SLOT + offset, {}, {})
    assert decision is not None and decision.run == [SLOT] and decision.missed == []
    advanced, published, missed = dispatch.dispatch_many([decision])
    assert advanced == {job_id} and missed == 0 and [item.slot for item in published] == [SLOT]
    execution = CronExecution.objects.get(job_id=job_id)
    assert (execution.slot, execution.due_at, execution.status, execution.trigger) == (
        SLOT, SLOT + offset, Status.PENDING, Trigger.BEAT)
    assert CronJob.objects.get(id=job_id).due_at == SLOT + dt.timedelta(hours=1) + offset


def test_catch_up_is_planned_as_of_the_offset():
    """A slot sent up to its grace after slot + offset is on time; later it is overdue."""
    row = dispatch.DueJob(job_id=1, next_run_at=SLOT, task="t", name="n", schedule="0 * * * *", timezone="UTC",
                          catch_up="none", job_timezone="UTC", jitter_ms=40_000)
    on_time = beat.plan(row, SLOT + dt.timedelta(seconds=40 + 59), {}, {})
    assert on_time is not None and on_time.run == [SLOT]
    late = beat.plan(row, SLOT + dt.timedelta(seconds=40 + 61), {}, {})
    assert late is not None and late.run == [] and late.missed == [SLOT]
    without = beat.plan(dataclasses.replace(row, jitter_ms=0), SLOT + dt.timedelta(seconds=61), {}, {})
    assert without is not None and without.missed == [SLOT]
    # Jobs that differ only by their offset do not share a plan.
    plans: dict[planning.PlanKey, catch_up.CatchUpPlan | None] = {}
    beat.plan(row, SLOT + dt.timedelta(seconds=70), plans, {})
    beat.plan(dataclasses.replace(row, jitter_ms=0), SLOT + dt.timedelta(seconds=70), plans, {})
    assert len(plans) == 2


@pytest.mark.django_db
def test_health_and_metrics_count_lateness_from_the_slot_plus_its_offset():
    job, job_id = with_row("JIT-6", jitter=100)
    assert job.jitter_ms == 87_732
    health.beat_seen("host-a:1", True)

    def slot_ago(seconds: float) -> None:
        with connection.cursor() as cursor:
            cursor.execute("UPDATE cron_celery_cronjob SET next_run_at = now() - make_interval(secs => %s) "
                           "WHERE id = %s", [seconds, job_id])

    def overdue_metric() -> str:
        text = metrics.render()[0].decode()
        return next(line for line in text.splitlines() if line.startswith(f'cron_overdue{{cron_job="{job.name}"}}'))

    slot_ago(150)  # 150 s after the slot, 62 s after it was due: within OVERDUE_SECONDS (120)
    report = health.check()
    assert report.ok, report.reasons
    assert overdue_metric().endswith(" 0.0")
    slot_ago(87.732 + 150)
    report = health.check()
    assert not report.ok and report.overdue[0]["job"] == job.name
    assert 150 <= report.overdue[0]["late_seconds"] <= 155
    assert overdue_metric().endswith(" 1.0")


def test_sentrys_check_in_margin_covers_the_offset():
    plain = declared(schedule=every(hours=1))
    jittery = declared(schedule=every(hours=1), jitter=600)
    assert sentry.monitor_config(plain)["checkin_margin"] == 1
    assert sentry.monitor_config(jittery)["checkin_margin"] == 1 + -(-jittery.jitter_ms // 60_000)
    assert sentry.monitor_config(jittery)["checkin_margin"] > 1
