"""The outbox's accounting and delivery on real processes.

- An execution whose worker dies on every attempt: the lost attempt alerts ``LOST`` at once,
  the final loss alerts again (the same row, sent again), and the job's incident
  (``alerted_at``, ``consecutive_failures``) agrees with what was sent.
- ``delivery.deliver`` holds no transaction or row lock while a channel's endpoint hangs, and
  two deliverers of one alert send it once.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.db import DatabaseError, connection
from django.test import override_settings

from cron_celery import exceptions
from cron_celery.alerts import delivery
from cron_celery.decisions import claims
from cron_celery.declaring import registry
from cron_celery.models import Alert, AlertStatus, CronExecution, CronJob, Status, Trigger
from cron_celery.run import outcomes, runs, tasks
from tests.conftest import ROOT, make_job, wait_for
from tests.servers import HttpServer
from tests.workers import Worker

pytestmark = pytest.mark.django_db(transaction=True)

SLOT = dt.datetime(2026, 11, 30, 1, 0, tzinfo=dt.UTC)


@pytest.fixture
def hook() -> Iterator[HttpServer]:
    server = HttpServer().start()
    yield server
    server.stop()


def webhook(url: str, **extra: Any) -> override_settings:
    return override_settings(CRON_CELERY={**settings.CRON_CELERY, "NOTIFICATIONS": {
        "on_failure": ["webhook"], "webhook": {"url": url}, **extra}})


def in_thread(target: Any, results: list[Any]) -> threading.Thread:
    """``target()`` in a thread with its own database connection; its result lands in ``results``."""

    def body() -> None:
        try:
            results.append(target())
        except Exception as error:  # the assertion on results shows it
            results.append(error)
        finally:
            connection.close()

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow
def test_a_job_lost_on_every_attempt_alerts_the_lost_attempt_and_then_its_final_loss(tmp_path, marker, hook):
    go = tmp_path / "go"
    worker = Worker(tmp_path, {"CRON_TEST_MARKER": str(marker), "CRON_TEST_WEBHOOK_URL": hook.url,
                               "CRON_TEST_GO": str(go), "CRON_TEST_LOG_LEVEL": "INFO"},
                    pool="prefork", concurrency=2)
    try:
        worker.start()
        sent = tasks.send_run(registry.get("Q010"), SLOT, Trigger.ENQUEUE)
        # Attempt 1 kills its process: the parent records the lost attempt and its LOST alert.
        wait_for(lambda: Alert.objects.filter(execution_id=sent.execution_id, status=AlertStatus.SENT).exists(),
                 what="the lost attempt's alert to be delivered")
        go.touch()  # attempt 2 (waiting for this) kills its process too: the execution is finally LOST
        wait_for(lambda: CronExecution.objects.get(id=sent.execution_id).completed, what="the final outcome")
        wait_for(lambda: len(hook.received()) >= 2, timeout=30, what="the final LOST alert to be delivered")
        wait_for(lambda: Alert.objects.filter(execution_id=sent.execution_id, status=AlertStatus.SENT).exists(),
                 what="the final alert's delivery to be recorded")
    finally:
        worker.stop()
    row = CronExecution.objects.get(id=sent.execution_id)
    assert (row.status, row.retry_count) == (Status.LOST, 1)
    bodies = [request.json() for request in hook.received()]
    assert [(body["event"], body["status"], body["execution_id"]) for body in bodies] == [
        ("LOST", Status.RETRYING, sent.execution_id), ("LOST", Status.LOST, sent.execution_id)]
    assert list(Alert.objects.filter(execution_id=sent.execution_id).values_list("event", "channel", "status")) == [
        ("LOST", "webhook", AlertStatus.SENT)]
    job = CronJob.objects.get(code="Q010")
    assert (job.last_status, job.consecutive_failures) == (Status.LOST, 1)
    assert job.alerted_at is not None  # the incident is open, and its alert was sent


def test_a_hanging_endpoint_holds_no_lock_and_a_second_deliverer_does_not_send_again(hook):
    job, job_id = make_job(notify={"on_failure": ["webhook"]})
    hook.hang = 60  # until released below
    with webhook(hook.url, timeout=30):
        outcome = runs.execute(job, SLOT, lambda run: {"error": True, "message": "partner down"},
                               trigger=Trigger.MANUAL)
        alert = Alert.objects.get(execution_id=outcome.execution_id)
        first: list[Any] = []
        sending = in_thread(lambda: delivery.deliver(alert.id), first)
        wait_for(lambda: len(hook.received()) == 1, what="the first deliverer to reach the endpoint")
        # While it waits for the endpoint: the alert's and the job's rows can be written at once.
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '1s'")
            try:
                cursor.execute(f"UPDATE {Alert._meta.db_table} SET last_error = last_error WHERE id = %s",
                               [alert.id])
                cursor.execute(f"UPDATE {CronJob._meta.db_table} SET consecutive_failures = consecutive_failures"
                               " WHERE id = %s", [job_id])
                blocked = ""
            except DatabaseError as error:
                blocked = str(error)
            finally:
                cursor.execute("SET lock_timeout = 0")
        second: list[Any] = []
        in_thread(lambda: delivery.deliver(alert.id), second).join(timeout=30)
        hook._release.set()  # let the endpoint answer the first deliverer
        sending.join(timeout=30)
    assert blocked == "", f"a row stayed locked during the HTTP call: {blocked}"
    assert second == ["GONE"] and first == [AlertStatus.SENT]
    assert len(hook.received()) == 1
    alert.refresh_from_db()
    assert (alert.status, alert.attempts, alert.last_error) == (AlertStatus.SENT, 1, "")
    with webhook(hook.url):
        assert delivery.deliver(alert.id) == "GONE"
    assert len(hook.received()) == 1



def test_a_final_loss_while_the_lost_attempts_alert_is_being_sent_is_sent_again_after_it(hook):
    """The final LOST re-arms the row while the first delivery waits on the endpoint: that
    delivery's result is not recorded (its claim was voided), and the row is sent again."""
    job, job_id = make_job(max_retries=1, notify={"on_failure": ["webhook"]})

    def lose(pid: int, execution_id: int | None = None) -> Any:
        # As the worker's parent does when its child died: by the execution it ran, worker and pid.
        claim = claims.begin(job=job, job_id=job_id, slot=SLOT, execution_date=SLOT.date(), trigger=Trigger.BEAT,
                             execution_id=execution_id, worker="w", pid=pid, lease_seconds=60)
        assert claim.claimed
        return outcomes.dead(job, job_id=job_id, status=Status.LOST, error_code="WORKER_LOST",
                             message=f"child {pid} died", worker="w", pid=pid, execution_id=claim.execution_id)

    hook.hang = 60
    with webhook(hook.url, timeout=30):
        first = lose(201)
        assert first.status == Status.RETRYING
        alert = Alert.objects.get(execution_id=first.execution_id)
        results: list[Any] = []
        sending = in_thread(lambda: delivery.deliver(alert.id), results)
        wait_for(lambda: len(hook.received()) == 1, what="the lost attempt's alert to reach the endpoint")
        final = lose(202, first.execution_id)
        assert final.status == Status.LOST
        hook._release.set()
        sending.join(timeout=30)
        assert results == ["GONE"]  # sent, but its claim was voided by the re-arm: not recorded
        alert.refresh_from_db()
        assert (alert.status, alert.attempts) == (AlertStatus.PENDING, 0)
        assert delivery.deliver(alert.id) == AlertStatus.SENT
    assert [request.json()["status"] for request in hook.received()] == [Status.RETRYING, Status.LOST]
    assert Alert.objects.filter(execution_id=first.execution_id).count() == 1
    row = CronJob.objects.get(id=job_id)
    assert row.alerted_at is not None and row.consecutive_failures == 1


# --- a receiver's check, as docs/notifications.md shows it -------------------------------------

def documented_receiver() -> dict[str, Any]:
    """The receiver code of docs/notifications.md (the python block that defines ``verify``),
    run as a reader would copy it: the page cannot drift from what is tested."""
    page = (ROOT / "docs" / "notifications.md").read_text(encoding="utf-8")
    [code] = [block for block in re.findall(r"```python\n(.*?)```", page, flags=re.S) if "def verify(" in block]
    namespace: dict[str, Any] = {}
    exec(compile(code, "docs/notifications.md", "exec"), namespace)  # our own page, on purpose
    return namespace


def test_the_documented_verify_accepts_real_deliveries_and_refuses_replays(hook):
    receiver = documented_receiver()
    verify, rejected = receiver["verify"], receiver["Rejected"]
    secret = "whsec-0123456789-abcdefghij"
    job, _job_id = make_job(notify={"on_failure": ["webhook"]})
    hook.answer(503, "busy")  # the first attempt fails: the alert is delivered again
    with override_settings(CRON_CELERY={**settings.CRON_CELERY, "NOTIFICATIONS": {
            "on_failure": ["webhook"], "webhook": {"url": f"{hook.url}/hooks/cron", "secret": secret}}}):
        outcome = runs.execute(job, SLOT, lambda run: {"error": True, "message": "=HYPERLINK(evil)"},
                               trigger=Trigger.MANUAL)
        alert = Alert.objects.get(execution_id=outcome.execution_id)
        with pytest.raises(exceptions.DeliveryFailed):
            delivery.deliver(alert.id)
        assert delivery.deliver(alert.id) == AlertStatus.SENT
    first, retry = hook.received("/hooks/")
    identity = json.loads(first.raw)["delivery_id"]  # the alert row's id, in the signed body
    assert first.headers["x-cron-celery-delivery"] == retry.headers["x-cron-celery-delivery"] == identity
    assert first.raw == retry.raw  # one alert, one body: each attempt signed its own timestamp

    # Each attempt verifies on its own: a receiver that answered the first with 503 takes the retry.
    got = verify(secret, retry.headers, retry.raw, set())
    assert got is not None and (got["event"], got["execution_id"], got["error"]) == (
        "FAILED", outcome.execution_id, "=HYPERLINK(evil)")
    # A receiver that handled the first: the retry, and a replay of either, are not acted on again.
    seen: set[str] = set()
    assert verify(secret, first.headers, first.raw, seen) == got
    assert verify(secret, retry.headers, retry.raw, seen) is None
    assert verify(secret, first.headers, first.raw, seen) is None
    # A replay after the tolerance is refused even by a receiver that no longer remembers it...
    stamp = int(retry.headers["x-cron-celery-timestamp"])
    assert verify(secret, retry.headers, retry.raw, set(), now=stamp + 299) == got
    with pytest.raises(rejected, match="too old"):
        verify(secret, retry.headers, retry.raw, set(), now=stamp + 301)
    # ... and re-dating it, changing the body or guessing the secret breaks the signature.
    redated = {**retry.headers, "x-cron-celery-timestamp": str(int(time.time()) + 1)}
    tampered = retry.raw.replace(b"FAILED", b"SUCCEEDED")
    for headers, body, key in ((redated, retry.raw, secret), (retry.headers, tampered, secret),
                               (retry.headers, retry.raw, "not-the-secret")):
        with pytest.raises(rejected, match="bad signature"):
            verify(key, headers, body, set())
    undated = {name: value for name, value in retry.headers.items() if name != "x-cron-celery-timestamp"}
    with pytest.raises(rejected, match="no timestamp"):
        verify(secret, undated, retry.raw, set())


def test_a_lost_attempts_alert_delivered_while_the_next_attempt_runs_describes_the_lost_attempt(hook):
    """The alert of a lost attempt may be delivered after the retry already started: it still
    says the execution is being retried and names the attempt that was lost (it said RUNNING
    and the next attempt's number, depending on who was faster)."""
    job, job_id = make_job(max_retries=2, notify={"on_failure": ["webhook"]})
    first = claims.begin(job=job, job_id=job_id, slot=SLOT, execution_date=SLOT.date(), trigger=Trigger.MANUAL,
                         lease_seconds=60, worker="w1", pid=4242)
    assert first.claimed and first.execution_id is not None
    ended = outcomes.dead(job, job_id=job_id, status=Status.LOST, error_code="WORKER_LOST",
                          message="its process died", worker="w1", pid=4242, execution_id=first.execution_id)
    assert ended is not None and ended.status == Status.RETRYING
    alert = Alert.objects.get(execution_id=first.execution_id, event="LOST")
    second = claims.begin(job=job, job_id=job_id, slot=SLOT, execution_date=SLOT.date(), trigger=Trigger.MANUAL,
                          lease_seconds=60, execution_id=first.execution_id, worker="w2", pid=4343)
    assert second.claimed and CronExecution.objects.get(id=first.execution_id).status == Status.RUNNING
    with webhook(hook.url):
        assert delivery.deliver(alert.id) == AlertStatus.SENT
    body = hook.received()[0].json()
    assert (body["event"], body["status"], body["attempt"], body["error_code"]) == (
        "LOST", Status.RETRYING, 1, "WORKER_LOST")
