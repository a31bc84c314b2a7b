"""One-off runs recorded ahead for a given time: taken once however many beats ask, cancelled
before they are sent, left to the beat by the reconciler, counted by the health check, and
recorded from the command, the endpoint and the admin. Real PostgreSQL (and the command in a
real child process); the beats that send them are in tests/faults/test_windows.py."""

from __future__ import annotations

import datetime as dt
import html
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, connections

from cron_celery import exceptions
from cron_celery.alerts import signals
from cron_celery.beat import health
from cron_celery.decisions import jobs as job_rows
from cron_celery.decisions import oneoffs, repairs
from cron_celery.declaring import registry
from cron_celery.models import CronExecution, CronJob, SkipReason, Status, Trigger
from cron_celery.run import outcomes, tasks
from tests.conftest import manage

pytestmark = pytest.mark.django_db(transaction=True)
DASHBOARD = "/admin/cron_celery/cronjob/"
HISTORY = "/admin/cron_celery/cronexecution/"


def soon(seconds: float = 3600.5) -> dt.datetime:
    """A future instant that is no minute's slot (the test jobs run every minute at most)."""
    return (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds)).replace(microsecond=0, second=30)


def record_due(job: registry.Job, count: int) -> list[int]:
    """``count`` one-offs of ``job``, made due at once (recorded for the future, then moved back)."""
    ids = [tasks.schedule_one_off(job, soon(7200 * (i + 1))).execution_id for i in range(count)]
    CronExecution.objects.filter(id__in=ids).update(due_at=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1))
    return ids


@pytest.fixture
def skipped() -> Iterator[list[dict[str, Any]]]:
    received: list[dict[str, Any]] = []

    def receiver(sender: str, **kwargs: Any) -> None:
        received.append({"sender": sender, **kwargs})

    signals.execution_skipped.connect(receiver, weak=False)
    yield received
    signals.execution_skipped.disconnect(receiver)


def test_a_due_one_off_is_taken_once_when_two_beats_ask_at_the_same_moment():
    job = registry.get("fast-always")
    ids = record_due(job, 12)
    taken: list[list[oneoffs.Due]] = [[], []]
    start = threading.Barrier(2)

    def beat(index: int) -> None:
        try:
            start.wait()
            for _ in range(6):
                taken[index] += oneoffs.take_due(dt.datetime.now(dt.UTC), 2)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=beat, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    got = [due.execution_id for side in taken for due in side]
    assert sorted(got) == sorted(ids)  # each once, none lost
    rows = CronExecution.objects.filter(id__in=ids)
    assert len({row.celery_task_id for row in rows}) == 12 and all(row.celery_task_id for row in rows)
    assert oneoffs.take_due(dt.datetime.now(dt.UTC), 100) == []


def test_a_one_off_not_due_yet_is_not_taken_and_the_beats_idle_query_sees_it():
    from cron_celery.decisions import dispatch

    job = registry.get("fast-always")
    at = soon()
    tasks.schedule_one_off(job, at)
    assert oneoffs.take_due(dt.datetime.now(dt.UTC), 100) == []
    assert not CronJob.objects.exclude(due_at=None).exists()  # no slot of any job comes first
    next_at, _edited, _now = dispatch.next_due()
    assert next_at == at  # the beat wakes for it
    (taken,) = oneoffs.take_due(at, 100)
    assert (taken.slot, taken.task, taken.force) == (at, job.task_name, False)


def test_cancelling_makes_an_unsent_one_off_a_skip_and_leaves_a_sent_one_alone(skipped):
    job = registry.get("fast-always")
    waiting = tasks.schedule_one_off(job, soon()).execution_id
    (sent,) = record_due(job, 1)
    oneoffs.take_due(dt.datetime.now(dt.UTC), 100)
    done = outcomes.cancelled([waiting, sent], "ops")
    assert [item.execution_id for item in done] == [waiting]
    row = CronExecution.objects.get(id=waiting)
    assert (row.status, row.skip_reason, row.completed, row.message) == (
        Status.SKIPPED, SkipReason.CANCELLED, True, "Cancelled before it was sent, by ops.")
    assert CronExecution.objects.get(id=sent).status == Status.PENDING
    assert [(s["execution_id"], s["error_code"]) for s in skipped] == [(waiting, "CANCELLED")]
    assert oneoffs.take_due(row.slot + dt.timedelta(seconds=1), 100) == []  # never sent


def test_a_cancelled_one_off_of_an_upstream_decides_nothing_for_its_downstream_job():
    up = registry.register(registry.declare(name="oo-up", code="OOU", task_name="tests.fake.oo_up",
                                            schedule="0 3 * * *"))
    down = registry.register(registry.declare(name="oo-down", code="OOD", task_name="tests.fake.oo_down",
                                              after="oo-up"))
    try:
        from cron_celery.decisions import dependencies

        dependencies.sync(registry.all_jobs())
        job_rows.ensure_job(down)
        recorded = tasks.schedule_one_off(up, soon())
        outcomes.cancelled([recorded.execution_id], "ops")
        assert not CronExecution.objects.filter(task_name="oo-down").exists()
    finally:
        registry.unregister("oo-down")
        registry.unregister("oo-up")


def test_the_reconciler_leaves_an_unsent_one_off_to_the_beat_and_resends_one_a_beat_took_and_lost():
    job = registry.get("fast-always")
    (unsent,) = record_due(job, 1)
    CronExecution.objects.filter(id=unsent).update(created_at=dt.datetime.now(dt.UTC) - dt.timedelta(hours=2))
    assert unsent not in {row[0] for row in repairs.stranded(1, 100)}
    oneoffs.take_due(dt.datetime.now(dt.UTC), 100)  # a beat took it, then died before sending it
    CronExecution.objects.filter(id=unsent).update(lease_until=dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5))
    assert unsent in {row[0] for row in repairs.stranded(1, 100)}


def test_the_health_check_names_a_one_off_no_beat_has_sent():
    job = registry.get("fast-always")
    (late,) = record_due(job, 1)
    CronExecution.objects.filter(id=late).update(due_at=dt.datetime.now(dt.UTC) - dt.timedelta(hours=1))
    report = health.check()
    assert not report.ok
    assert any(f"one-off run (execution {late})" in reason and "fast-always" in reason for reason in report.reasons)
    assert [item["one_off"] for item in report.overdue if "one_off" in item] == [late]


def test_run_cron_task_schedule_records_a_one_off_and_refuses_what_it_cannot_do():
    at = soon()
    done = manage("run_cron_task", "fast-always", "--at", at.isoformat(), "--schedule")
    assert done.returncode == 0, done.stderr
    row = CronExecution.objects.get(task_name="fast-always", trigger=Trigger.ONE_OFF)
    assert (row.slot, row.due_at, row.status, row.celery_task_id) == (at, at, Status.PENDING, "")
    assert f"execution {row.id}; the beat sends it then" in done.stdout
    again = manage("run_cron_task", "fast-always", "--at", at.isoformat(), "--schedule")
    assert again.returncode == 1 and "No one-off run of job 'fast-always'" in again.stderr
    assert "already recorded" in again.stderr
    no_time = manage("run_cron_task", "fast-always", "--schedule")
    assert no_time.returncode == 1 and "--schedule needs --at" in no_time.stderr
    both = manage("run_cron_task", "fast-always", "--at", at.isoformat(), "--schedule", "--enqueue")
    assert both.returncode == 1 and "cannot be combined with --enqueue" in both.stderr
    assert CronExecution.objects.filter(task_name="fast-always").count() == 1


def test_the_run_endpoint_records_a_one_off_with_schedule(admin_client):
    at = soon()
    response = admin_client.post("/cron/run/fast-always/", {"at": at.isoformat(), "schedule": True},
                                 content_type="application/json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["scheduled"] is True and body["slot"] == at.isoformat()
    row = CronExecution.objects.get(id=body["execution_id"])
    assert (row.trigger, row.due_at) == (Trigger.ONE_OFF, at)
    status = admin_client.get("/cron/status/?job=fast-always").json()
    assert status["jobs"][0]["next_one_off"] == at.isoformat()
    missing = admin_client.post("/cron/run/fast-always/", {"schedule": True}, content_type="application/json")
    assert missing.status_code == 400 and "schedule needs at" in missing.json()["error"]
    past = admin_client.post("/cron/run/fast-always/", {"at": "2020-01-01T00:00Z", "schedule": True},
                             content_type="application/json")
    assert past.status_code == 400 and "is not in the future" in past.json()["error"]


def test_the_admin_schedules_shows_and_cancels_a_one_off(admin_client):
    job = registry.get("fast-always")
    job_id = job_rows.job_id(job)
    at = soon()
    form = admin_client.post(DASHBOARD, {"action": "schedule_one_off", "_selected_action": [job_id]})
    assert form.status_code == 200 and "Record the one-off run" in form.content.decode()
    done = admin_client.post(DASHBOARD, {"action": "schedule_one_off", "_selected_action": [job_id], "apply": "1",
                                         "at": at.strftime("%Y-%m-%d %H:%M:%S")}, follow=True)
    assert "one-off run at" in done.content.decode()
    row = CronExecution.objects.get(task_name="fast-always", trigger=Trigger.ONE_OFF)
    assert row.slot == at  # read in the job's timezone (UTC)
    page = admin_client.get(DASHBOARD).content.decode()
    assert "one-off" in page and at.strftime("%H:%M:%S UTC") in page
    bad = admin_client.post(DASHBOARD, {"action": "schedule_one_off", "_selected_action": [job_id], "apply": "1",
                                        "at": "yesterday"}, follow=True)
    assert "Cannot read 'yesterday' as a slot" in html.unescape(bad.content.decode())
    cancelled = admin_client.post(HISTORY, {"action": "cancel_one_off", "_selected_action": [row.id]}, follow=True)
    assert "1 one-off run(s) cancelled" in cancelled.content.decode()
    row.refresh_from_db()
    assert (row.status, row.skip_reason) == (Status.SKIPPED, SkipReason.CANCELLED)
    assert "by admin in the admin" in row.message


def test_the_upcoming_page_lists_a_one_off_due_within_the_hour(admin_client):
    job = registry.get("fast-always")
    recorded = tasks.schedule_one_off(job, soon(600))
    page = admin_client.get(f"{DASHBOARD}upcoming/").content.decode()
    assert f"one-off run (execution {recorded.execution_id})" in page


def test_a_one_off_on_an_instant_the_schedule_reaches_later_never_swallows_the_beats_slot():
    """A one-off is refused at a slot the beat runs anyway; one recorded before an edit moved the
    schedule onto its instant, or while the job was paused, then cancelled, leaves the beat's slot
    whole: it is recorded after the one-off (run 2) and sent."""
    from cron_celery import beat
    from cron_celery.beat import schedule_sync
    from cron_celery.decisions import dispatch

    job = registry.get("tick-2s")
    schedule_sync.sync()
    at = soon()  # an even second: a slot of the every-2-seconds schedule
    with pytest.raises(exceptions.OneOffRefused, match="a slot the job's schedule in effect runs anyway"):
        tasks.schedule_one_off(job, at)
    CronJob.objects.filter(code=job.code).update(paused=True)
    recorded = tasks.schedule_one_off(job, at.replace(tzinfo=None))  # naive: the job's timezone (UTC)
    assert recorded.at == at
    outcomes.cancelled([recorded.execution_id], "ops")
    CronJob.objects.filter(code=job.code).update(paused=False, next_run_at=at)
    (due,) = [row for row in dispatch.due_jobs(at) if row.name == job.name]
    decision = beat.plan(due, at, {}, {})
    assert decision is not None and decision.run == [at]
    _advanced, published, _missed = dispatch.dispatch_many([decision])
    assert [(item.slot, item.trigger) for item in published] == [(at, Trigger.BEAT)]
    rows = list(CronExecution.objects.filter(task_name=job.name, slot=at).order_by("run_number")
                .values_list("run_number", "trigger", "status"))
    assert rows == [(1, Trigger.ONE_OFF, Status.SKIPPED), (2, Trigger.BEAT, Status.PENDING)]


def test_a_one_off_recorded_with_force_carries_it_to_its_message():
    job = registry.get("fast-always")
    (execution_id,) = [tasks.schedule_one_off(job, soon(), force=True).execution_id]
    CronExecution.objects.filter(id=execution_id).update(due_at=dt.datetime.now(dt.UTC))
    (taken,) = oneoffs.take_due(dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1), 10)
    assert taken.force and CronExecution.objects.get(id=execution_id).force
    with pytest.raises(exceptions.OneOffRefused):
        tasks.schedule_one_off(job, dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
    with connection.cursor() as cursor:  # the beat's lookup goes through the partial index
        cursor.execute("EXPLAIN SELECT e.due_at FROM cron_celery_cronexecution AS e WHERE e.trigger = 'ONE_OFF' "
                       "AND e.status = 'PENDING' AND e.celery_task_id = '' ORDER BY e.due_at LIMIT 1")
        assert "cron_exec_one_off_due" in " ".join(row[0] for row in cursor.fetchall())
