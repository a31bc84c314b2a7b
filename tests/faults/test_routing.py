"""A job's ``queue=``/``priority=`` and ``CELERY_TASK_ROUTES`` on every path that sends its
message, seen by a real worker that consumes only the two custom queues (``-Q``): anything
sent to the default queue never runs there.

Paths: ``run_cron_task --enqueue`` (a process of its own), ``tasks.send_run`` from this
process (what the admin and the run API call), the retry of a failed attempt, the
parent's resend after the hard time limit, the reconciler's resend of a stranded
execution, and a real ``celery beat``. Each path is waited for on its own, and the test
names every path whose message never reached the worker.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings

from cron_celery import reconciler
from cron_celery.decisions import dispatch
from cron_celery.decisions import jobs as job_rows
from cron_celery.declaring import registry
from cron_celery.models import CronExecution, Status, Trigger
from cron_celery.run import tasks
from tests.celery_app import app
from tests.conftest import manage, marked, subprocess_env, wait_for
from tests.faults.test_beat import start_beat, stop
from tests.jobsapp import jobs_routing as jobs
from tests.redis_servers import RedisServer
from tests.workers import Worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

DAY = jobs.TRIAL_DAY
ROUTED = {"own-queue": (jobs.OWN_QUEUE, jobs.OWN_PRIORITY), "routed-by-settings": (jobs.ROUTED_QUEUE,
                                                                                    jobs.ROUTED_PRIORITY)}
CODES = {"own-queue": "Q001", "routed-by-settings": "Q002"}


def at(minute: int) -> dt.datetime:
    return dt.datetime(DAY.year, DAY.month, DAY.day, 0, minute, tzinfo=dt.UTC)


def all_final(**filters: object) -> bool:
    rows = CronExecution.objects.filter(**filters)
    return rows.exists() and not rows.filter(completed=False).exists()


def settled(missing: list[str], what: str, **filters: object) -> None:
    """Wait for these executions to be final; note ``what`` if they are not (a message sent to a
    queue the worker does not consume never runs), and go on with the next path."""
    try:
        wait_for(lambda: all_final(**filters), timeout=45, what=what)
    except AssertionError:
        missing.append(what)


def first_attempt_to_its_queue(code: str, slot: dt.datetime) -> None:
    """A PENDING execution and its message, sent with the queue and priority named here."""
    job = registry.get(code)
    execution_id, _ = dispatch.enqueue(job=job, job_id=job_rows.job_id(job), slot=slot, execution_date=DAY,
                                     trigger=Trigger.ENQUEUE)
    queue, priority = ROUTED[job.name]
    app.send_task(job.task_name, headers=tasks.headers(execution_id, slot, Trigger.ENQUEUE), queue=queue,
                  priority=priority)


def deliveries(marker: Path) -> list[tuple[str, str, str, int, str, str]]:
    """(job, trigger, slot, attempt, queue, priority) of every attempt the worker ran."""
    found = []
    for line in marked(marker):
        label, trigger, slot, attempt, queue, priority = line.split()
        found.append((label, trigger, slot, int(attempt.split("=")[1]), queue.split("=", 1)[1],
                      priority.split("=", 1)[1]))
    return found


def test_every_path_sends_a_jobs_message_to_its_queue_with_its_priority(tmp_path, marker):
    lock = RedisServer(tmp_path).start()
    env = {"CRON_TEST_MARKER": str(marker), "CRON_TEST_LOCK_MASTERS": lock.url, "CRON_TEST_LOG_LEVEL": "INFO"}
    worker = Worker(tmp_path, env, pool="prefork", concurrency=2, queues=[jobs.OWN_QUEUE, jobs.ROUTED_QUEUE])
    beat = None
    missing: list[str] = []
    try:
        worker.start()
        # run_cron_task --enqueue, in a process of its own (the Celery app is never finalized there).
        for code in ("Q001", "Q002", "Q003"):
            done = manage("run_cron_task", code, "--at", at(0).isoformat(), "--enqueue", env=subprocess_env(**env))
            assert done.returncode == 0, done.stderr
        settled(missing, "run_cron_task --enqueue", slot=at(0))
        # send_run from this process (what the admin and the run API call).
        for code in ("Q001", "Q002"):
            tasks.send_run(registry.get(code), at(4), Trigger.ADMIN)
        settled(missing, "send_run", slot=at(4))
        # A failure retried, and a hard-limit kill resent by the parent: the first attempts are
        # sent straight to the right queue, so only the second attempts' paths are on trial.
        for code in ("Q001", "Q002"):
            for minute in (jobs.FAILS_THEN_RETRIES, jobs.KILLED_BY_HARD_LIMIT):
                first_attempt_to_its_queue(code, at(minute))
        settled(missing, "the retry", slot=at(jobs.FAILS_THEN_RETRIES))
        settled(missing, "the parent's resend", slot=at(jobs.KILLED_BY_HARD_LIMIT))
        # A stranded execution (its message never sent), re-sent by the reconciler.
        for code in ("Q001", "Q002"):
            job = registry.get(code)
            dispatch.enqueue(job=job, job_id=job_rows.job_id(job), slot=at(3), execution_date=DAY,
                             trigger=Trigger.ENQUEUE)
        with connection.cursor() as cursor:
            cursor.execute(f"UPDATE {CronExecution._meta.db_table} SET created_at = now() - interval '10 minutes'"
                           " WHERE slot = %s", [at(3)])
        options = {"INTERVAL": 0, "PENDING_GRACE": 60, "MISSED_GRACE": 120, "REPUBLISH_LIMIT": 2, "BATCH": 100}
        with override_settings(CRON_CELERY={**settings.CRON_CELERY, "RECONCILE": options}):
            reconciler.run_pass()
        settled(missing, "the reconciler's resend", slot=at(3))
        # A real beat dispatching both jobs every two seconds.
        beat = start_beat(tmp_path, {"CRON_TEST_MARKER": str(marker), "CRON_TEST_LOCK_MASTERS": lock.url,
                                     "CRON_TEST_ROUTING_BEAT": "1"}, 0)
        try:
            wait_for(lambda: all(CronExecution.objects.filter(task_code=code, trigger=Trigger.BEAT,
                                                              status=Status.SUCCEEDED).exists()
                                 for code in ("Q001", "Q002")), timeout=60, what="beat's dispatch")
        except AssertionError:
            missing.append("beat's dispatch")
    finally:
        if beat is not None:
            stop(beat)
        worker.stop()
        lock.stop()
    seen = deliveries(marker)
    assert missing == [], f"never reached the worker's queues: {missing}; it ran {sorted(set(seen))}"
    for label, (queue, priority) in ROUTED.items():
        mine = [(trigger, slot, attempt) for job, trigger, slot, attempt, _q, _p in seen if job == label]
        assert {(trigger, slot, attempt) for trigger, slot, attempt in mine if slot.startswith(DAY.isoformat())} == {
            ("ENQUEUE", at(0).isoformat(), 1),
            ("ENQUEUE", at(1).isoformat(), 1), ("ENQUEUE", at(1).isoformat(), 2),  # the retry
            ("ENQUEUE", at(2).isoformat(), 1), ("ENQUEUE", at(2).isoformat(), 2),  # the parent's resend
            ("ENQUEUE", at(3).isoformat(), 1),  # the reconciler's resend
            ("ADMIN", at(4).isoformat(), 1),  # send_run
        }, label
        assert any(trigger == "BEAT" for trigger, _slot, _attempt in mine), label
        wrong = [line for line in seen if line[0] == label and line[4:] != (queue, str(priority))]
        assert wrong == [], f"{label}: delivered from another queue or without its priority"
        assert not CronExecution.objects.filter(task_code=CODES[label]).exclude(
            status__in=[Status.SUCCEEDED, Status.PENDING, Status.RUNNING]).exists()
    assert [line[4:] for line in seen if line[0] == "own-base"] == [(jobs.OWN_QUEUE, "5")]
    retried = CronExecution.objects.get(task_code="Q001", slot=at(2))
    assert [attempt["status"] for attempt in retried.attempts] == [Status.TIMED_OUT, Status.SUCCEEDED]
