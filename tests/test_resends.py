"""Sends of stranded executions the broker cannot tell about (``resends``), pass by pass, against real
PostgreSQL and the session's Redis queue. Redis answers "cannot tell" when a look would read more
entries than ``inflight.SCAN_LIMIT``; set to 0 here, every look is "cannot tell" (as a RabbitMQ
queue with a backlog answers). The real-process test is tests/faults/test_broker_unknown.py."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import override_settings

from cron_celery import reconciler
from cron_celery.decisions import claims, executions, finishes, resends, waiting
from cron_celery.models import CronExecution, Status, Trigger
from cron_celery.reconciler import inflight
from cron_celery.run import tasks
from tests.conftest import make_job
from tests.test_retries import NOW, SLOT, backdate, report, row
from tests.test_retries import enqueue as enqueue_row

pytestmark = pytest.mark.django_db

GRACE = 60.0
RECONCILE = {"INTERVAL": 0, "PENDING_GRACE": GRACE, "MISSED_GRACE": 120, "REPUBLISH_LIMIT": 2, "BATCH": 100}
reconcile_settings = override_settings(CRON_CELERY={"RECONCILE": RECONCILE})


@pytest.fixture
def cannot_tell(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inflight, "SCAN_LIMIT", 0)


def sql(statement: str, params: list[Any]) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def with_task_id(execution_id: int) -> int:
    """The Celery task id its message was sent under, recorded as every sending path records it: the
    reconciler looks for the message by it."""
    sql(f"UPDATE {executions.EXE} SET celery_task_id = gen_random_uuid()::text WHERE id = %s", [execution_id])
    return execution_id


def enqueue(job: Any, job_id: int, **kw: Any) -> int:
    return with_task_id(enqueue_row(job, job_id, **kw))


def looked_at_last(execution_id: int, seconds_ago: float) -> None:
    """Its next look is due now: its grace (from ``lease_until``) ran out ``seconds_ago`` - GRACE ago."""
    sql(f"UPDATE {executions.EXE} SET lease_until = now() - make_interval(secs => %s) WHERE id = %s",
        [seconds_ago, execution_id])


def ahead(execution_id: int) -> float:
    """Seconds from now (the database's) to the execution's ``lease_until``."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT extract(epoch FROM lease_until - now()) FROM {executions.EXE} WHERE id = %s",
                       [execution_id])
        return float(cursor.fetchone()[0])


def test_the_gap_doubles_from_the_grace_up_to_an_hour():
    assert [resends.gap(60, sent) for sent in range(8)] == [60, 120, 240, 480, 960, 1920, 3600, 3600]
    assert resends.gap(5000, 3) == 5000  # never shorter than the grace
    assert resends.gap(1, 10_000) == 3600


@reconcile_settings
def test_sends_without_an_answer_are_counted_spaced_and_stop_at_the_limit_without_giving_up(queue, cannot_tell):
    job, job_id = make_job(catch_up="none")
    execution_id = enqueue(job, job_id)
    backdate(execution_id)
    assert reconciler.run_pass(NOW) == report(resent=1)
    assert (row(execution_id).status, row(execution_id).republished) == (Status.PENDING, 1)
    assert ahead(execution_id) == pytest.approx(2 * GRACE - GRACE, abs=1)  # next look 2 graces after the send
    assert reconciler.run_pass(NOW) == report()  # not before
    looked_at_last(execution_id, GRACE + 1)
    assert reconciler.run_pass(NOW) == report(resent=1)
    assert row(execution_id).republished == 2
    assert ahead(execution_id) == pytest.approx(4 * GRACE - GRACE, abs=1)
    looked_at_last(execution_id, GRACE + 1)
    assert reconciler.run_pass(NOW) == report(capped=1)  # the limit (2): left waiting, not sent
    r = row(execution_id)
    assert (r.status, r.republished, r.error_code) == (Status.PENDING, 2, "")
    assert ahead(execution_id) == pytest.approx(4 * GRACE - GRACE, abs=1)
    assert len(queue.headers()) == 2


@reconcile_settings
def test_a_beat_slot_of_a_catch_up_all_job_sent_without_an_answer_is_sent_as_a_catch_up(queue, cannot_tell):
    """Sent again because the broker cannot tell, a beat slot of an 'all' job is late as much as a lost
    one: a catch-up; the other policies' slots go as they were."""
    every, every_id = make_job(catch_up="all")
    latest, latest_id = make_job(catch_up="latest")
    slots = {enqueue(every, every_id): Trigger.CATCH_UP, enqueue(latest, latest_id): Trigger.BEAT}
    for execution_id in slots:
        backdate(execution_id)
    assert reconciler.run_pass(NOW) == report(resent=2)
    assert {execution_id: row(execution_id).trigger for execution_id in slots} == slots
    assert {h[tasks.HEADER_EXECUTION]: h[tasks.HEADER_TRIGGER] for h in queue.headers()} == slots


@reconcile_settings
def test_once_the_broker_answers_gone_an_execution_sent_to_the_limit_is_lost(queue, monkeypatch):
    """Sends without an answer count with the others: once the broker can tell, and the message is
    gone, every copy was lost."""
    job, job_id = make_job(catch_up="all")
    execution_id = enqueue(job, job_id)
    backdate(execution_id)
    sql(f"UPDATE {executions.EXE} SET republished = 2 WHERE id = %s", [execution_id])
    monkeypatch.setattr(inflight, "SCAN_LIMIT", 0)
    assert reconciler.run_pass(NOW) == report(capped=1)
    monkeypatch.setattr(inflight, "SCAN_LIMIT", 100_000)
    looked_at_last(execution_id, GRACE + 1)
    assert reconciler.run_pass(NOW) == report(abandoned=1)
    assert (row(execution_id).status, row(execution_id).error_code) == (Status.LOST, "NOT_DELIVERED")
    assert queue.headers() == []


@reconcile_settings
def test_a_retry_with_a_countdown_is_looked_at_once_due_and_bounded_like_the_rest(queue, cannot_tell):
    job, job_id = make_job(max_retries=1)
    claim = claims.begin(job=job, job_id=job_id, slot=SLOT, execution_date=SLOT.date(), trigger=Trigger.MANUAL,
                         lease_seconds=60)
    assert claim.execution_id is not None and claim.fence is not None
    execution_id = with_task_id(claim.execution_id)
    assert finishes.retry(job_id=job_id, execution_id=execution_id, fence=claim.fence, status=Status.FAILED,
                          message="boom", error_code="E1", traceback="tb", countdown=600)
    assert reconciler.run_pass(NOW) == report()  # due in ten minutes: not stranded
    looked_at_last(execution_id, GRACE + 1)  # its retry was due a grace ago and never came
    assert reconciler.run_pass(NOW) == report(resent=1)
    r = row(execution_id)
    assert (r.status, r.republished) == (Status.RETRYING, 1)
    assert ahead(execution_id) == pytest.approx(GRACE, abs=1)


@reconcile_settings
def test_a_waiting_execution_without_an_answer_is_bounded_and_counts_again_each_time_it_waits(queue, cannot_tell):
    job, job_id = make_job(overlap="skip")
    execution_id = enqueue(job, job_id, trigger=Trigger.ENQUEUE)
    with connection.cursor() as cursor:
        waiting.mark(cursor, execution_id, None)
    for sent in (1, 2):
        looked_at_last(execution_id, 10 * GRACE)
        assert reconciler.run_pass(NOW) == report(resent=1)
        assert row(execution_id).republished == sent
    looked_at_last(execution_id, 10 * GRACE)
    assert reconciler.run_pass(NOW) == report(capped=1)
    with connection.cursor() as cursor:  # a copy arrived and found the job busy: it waits again
        waiting.mark(cursor, execution_id, None)
    looked_at_last(execution_id, 10 * GRACE)
    assert reconciler.run_pass(NOW) == report(resent=1)
    assert (row(execution_id).status, row(execution_id).republished) == (Status.PENDING, 1)
    assert len(queue.headers()) == 3


@reconcile_settings
def test_a_waiting_execution_whose_message_is_gone_is_sent_every_grace_uncounted_as_before(queue):
    job, job_id = make_job(overlap="skip")
    execution_id = enqueue(job, job_id, trigger=Trigger.ENQUEUE)
    with connection.cursor() as cursor:
        waiting.mark(cursor, execution_id, None)
    for _ in range(3):
        queue.client.delete(queue.name)  # the copy was taken and dropped again: gone
        looked_at_last(execution_id, GRACE + 1)
        assert reconciler.run_pass(NOW) == report(resent=1)
        assert row(execution_id).republished == 0
        assert ahead(execution_id) == pytest.approx(0, abs=1)


@reconcile_settings
def test_a_pass_that_outlived_its_lease_does_not_count_a_send_another_pass_counted(queue):
    job, job_id = make_job()
    execution_id = enqueue(job, job_id)
    assert resends.counted(execution_id, 0, GRACE)
    assert not resends.counted(execution_id, 0, GRACE)  # read before the other pass counted
    assert row(execution_id).republished == 1
    CronExecution.objects.filter(id=execution_id).update(status=Status.SUCCEEDED)
    assert not resends.counted(execution_id, 1, GRACE) and not resends.held(execution_id, 1, GRACE)


def test_the_report_names_what_was_left_alone():
    text = str(reconciler.Report(unanswered=4, capped=2))
    assert "unanswered 4" in text and "capped 2" in text
