"""Alerts, end to end and for real: outcomes recorded by ``runs.execute`` (and the parent,
and the reconciler) write ``Alert`` rows by the job's policy, and ``delivery.deliver`` sends
them to real local servers — HTTP for Slack, Telegram and webhooks, aiosmtpd for email,
and an ingestion endpoint for Sentry's events and Crons check-ins. The assertions read the
database rows and what the servers received.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import hashlib
import hmac
import itertools
import json
import re
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from typing import Any, ClassVar

import pytest
import redis
import sentry_sdk
from celery.contrib.testing.worker import start_worker
from django.conf import settings
from django.db import connection
from django.test import override_settings

from cron_celery import alerts, checks, exceptions, reconciler
from cron_celery.alerts import channels, delivery, sentry, signals
from cron_celery.decisions import claims, dispatch, executions, finishes, repairs
from cron_celery.models import Alert, AlertStatus, CronExecution, CronJob, Event, Status, Trigger
from cron_celery.notifiers.base import Channel, Message
from cron_celery.notifiers.http import TelegramChannel
from cron_celery.run import outcomes, runs
from cron_celery.schedules import every
from tests.celery_app import app
from tests.conftest import make_job, wait_for
from tests.redis_servers import free_port
from tests.servers import HttpServer, SmtpServer, envelope_items

pytestmark = pytest.mark.django_db

SLOT = dt.datetime(2026, 11, 29, 1, 0, tzinfo=dt.UTC)
ADMIN = "https://ops.example.com"
ERROR = 'partner said <b>&"evil"</b> — Überweisung fehlgeschlagen 送金失敗 🚫\nsecond line'
TOKEN = "123456:AAE-s3cr3t-bot-token"
SECRET = "a long random string"
SENT, PENDING, GIVEN_UP = AlertStatus.SENT, AlertStatus.PENDING, AlertStatus.FAILED


# --- helpers ------------------------------------------------------------------------------

def notifying(notifications: dict[str, Any], *, admin: str = ADMIN, **extra: Any) -> override_settings:
    """The test settings' CRON_CELERY with these NOTIFICATIONS and ADMIN_BASE_URL."""
    return override_settings(CRON_CELERY={**settings.CRON_CELERY, "ADMIN_BASE_URL": admin,
                                          "NOTIFICATIONS": notifications, **extra})


def smtp_backend(port: int) -> override_settings:
    return override_settings(EMAIL_BACKEND="django.core.mail.backends.smtp.EmailBackend", EMAIL_HOST="127.0.0.1",
                             EMAIL_PORT=port, EMAIL_USE_TLS=False, EMAIL_USE_SSL=False, EMAIL_HOST_USER="",
                             EMAIL_HOST_PASSWORD="")


def slot(n: int = 0) -> dt.datetime:
    return SLOT + dt.timedelta(hours=n)


def reporting(message: str = ERROR, code: str = "PARTNER_DOWN") -> Callable[[runs.Run], dict[str, Any]]:
    """A body that reports a failure (``{"error": True}``)."""
    return lambda run: {"error": True, "message": message, "error_code": code}


def ok(run: runs.Run) -> str:
    return "all good"


def raising(run: runs.Run) -> None:
    raise ConnectionError("partner down")


def execute(job, n=0, body=ok, **kw):
    """``runs.execute`` of slot ``n`` (an ``Outcome``)."""
    return runs.execute(job, slot(n), body, trigger=kw.pop("trigger", Trigger.MANUAL), **kw)


def alert_rows(job_id: int) -> list[tuple[int, str, str]]:
    return list(Alert.objects.filter(job_id=job_id).order_by("execution_id", "event", "channel")
                .values_list("execution_id", "event", "channel"))


def admin_url(execution_id: int | None) -> str:
    return f"{ADMIN}/admin/cron_celery/cronexecution/{execution_id}/change/"


def sql(statement: str, params: list[Any]) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def facts(execution: CronExecution) -> list[tuple[str, str]]:
    """The facts every message carries for a failure of ``execute(job, 0, reporting())``."""
    assert execution.duration is not None
    return [("Job", f"{execution.task_name} ({execution.task_code})"), ("Slot", "2026-11-29 01:00:00 UTC"),
            ("Execution date", "2026-11-29"), ("Status", "FAILED"), ("Attempt", "1"), ("Run", "#1 (manual)"),
            ("Duration", f"{execution.duration.total_seconds():.1f} s"), ("Error code", "PARTNER_DOWN")]


class Markup(HTMLParser):
    """The tags of a Telegram message, and the text inside ``<pre>``."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []
        self.pre = ""
        self._in_pre = False
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))
        self._in_pre = tag == "pre"

    def handle_endtag(self, tag: str) -> None:
        self._in_pre = False

    def handle_data(self, data: str) -> None:
        if self._in_pre:
            self.pre += data


#: An ``&`` that does not start one of the entities Telegram's HTML mode knows.
BROKEN_ENTITY = re.compile(r"&(?!(?:amp|lt|gt|quot|#\d+|#x[0-9a-fA-F]+);)")


class MyChannel(Channel):
    """A custom channel named by dotted path in the tests below."""

    required = ("routing_key",)
    secrets = ("routing_key",)
    sent: ClassVar[list[tuple[str, dict[str, Any], Message, float]]] = []

    def send(self, message: Message, timeout: float) -> None:
        MyChannel.sent.append((self.name, dict(self.options), message, timeout))


class NotAChannel:
    """Importable, but not a Channel."""


# --- fixtures -----------------------------------------------------------------------------

@pytest.fixture
def http() -> Iterator[HttpServer]:
    server = HttpServer().start()
    yield server
    server.stop()


@pytest.fixture
def smtp() -> Iterator[SmtpServer]:
    server = SmtpServer().start()
    yield server
    server.stop()


@pytest.fixture
def session_queue() -> Iterator[redis.Redis]:
    """The session's own Celery queue (its name is unique to this pytest session)."""
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    client.delete(settings.CELERY_TASK_DEFAULT_QUEUE)
    yield client
    client.delete(settings.CELERY_TASK_DEFAULT_QUEUE)
    client.close()


def queued_deliveries(client: redis.Redis) -> list[list[Any]]:
    """The arguments of every ``cron_celery.deliver_alert`` message waiting in the queue."""
    found = []
    for raw in reversed(client.lrange(settings.CELERY_TASK_DEFAULT_QUEUE, 0, -1)):
        message = json.loads(raw)
        if message["headers"]["task"] == "cron_celery.deliver_alert":
            args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
            found.append(args)
    return found


def _no_sentry() -> None:
    """Back to a process where ``sentry_sdk.init`` never ran: ``init(dsn=None)`` replaces
    (and we close) the test's client, but still leaves a client that calls itself active,
    so the global scope gets no client at all."""
    sentry_sdk.get_client().close(timeout=2)
    sentry_sdk.init(dsn=None, default_integrations=False, auto_enabling_integrations=False)
    sentry_sdk.get_global_scope().set_client(None)


@pytest.fixture
def sentry_server() -> Iterator[HttpServer]:
    """A Sentry ingestion endpoint (``/api/1/envelope/``) and the SDK initialised to send
    there, uncompressed and without any integration."""
    server = HttpServer().start()
    sentry_sdk.init(dsn=f"http://public@127.0.0.1:{server.port}/1", default_integrations=False,
                    auto_enabling_integrations=False, environment="tests", release="cron-celery-tests",
                    _experiments={"transport_compression_level": 0})
    try:
        yield server
    finally:
        _no_sentry()
        server.stop()
        assert not sentry.active()


def sentry_items(server: HttpServer, kind: str) -> list[Any]:
    """Flush the SDK, then the payloads of every envelope item of this type received."""
    sentry_sdk.flush(timeout=5)
    found = []
    for request in server.received("/api/1/envelope/"):
        assert request.method == "POST" and "sentry_key=public" in request.headers["x-sentry-auth"]
        found += [payload for header, payload in envelope_items(request) if header.get("type") == kind]
    return found


# --- 1. Slack, Telegram and webhooks ------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_slack_telegram_and_webhook_receive_the_failure_escaped_linked_and_signed(http, session_queue):
    job, _job_id = make_job(notify={"on_failure": ["slack", "telegram", "webhook"]})
    config = {"slack": {"webhook_url": f"{http.url}/services/T000/B000/XXXX"},
              "telegram": {"bot_token": TOKEN, "chat_id": "-100123456", "api_url": http.url},
              "webhook": {"url": f"{http.url}/hooks/cron", "secret": SECRET}}
    with notifying(config):
        outcome = execute(job, body=reporting())
        assert outcome.status == Status.FAILED
        execution = CronExecution.objects.get(id=outcome.execution_id)
        rows = {alert.channel: alert for alert in Alert.objects.filter(execution=execution)}
        assert sorted(rows) == ["slack", "telegram", "webhook"]
        assert {(a.event, a.status, a.attempts, a.last_error, a.sent_at) for a in rows.values()} == {
            (Event.FAILED, PENDING, 0, "", None)}
        # The commit queued one delivery task per row on the broker (the outbox's hand-over).
        assert sorted(queued_deliveries(session_queue)) == sorted([[a.id] for a in rows.values()])
        for name in ("slack", "telegram", "webhook"):
            assert delivery.deliver(rows[name].id) == SENT
            assert delivery.deliver(rows[name].id) == "GONE"  # sent once, never twice
    assert len(http.requests) == 3 and {r.method for r in http.requests} == {"POST"}
    link = admin_url(execution.id)
    lines = facts(execution)

    (slack,) = http.received("/services/")
    assert slack.path == "/services/T000/B000/XXXX"
    assert slack.headers["content-type"] == "application/json; charset=utf-8"
    assert slack.json() == {"text": "\n".join([
        f":red_circle: *[cron] {job.name} ({job.code}) failed*",
        *[f"*{label}:* {value}" for label, value in lines],
        '```partner said &lt;b&gt;&amp;"evil"&lt;/b&gt; — Überweisung fehlgeschlagen 送金失敗 🚫\nsecond line```',
        f"<{link}|Open the execution in the admin>",
    ])}

    (telegram,) = http.received("/bot")
    assert telegram.path == f"/bot{TOKEN}/sendMessage"
    sent = telegram.json()
    assert {key: sent[key] for key in ("chat_id", "parse_mode", "disable_web_page_preview")} == {
        "chat_id": "-100123456", "parse_mode": "HTML", "disable_web_page_preview": True}
    assert sent["text"] == "\n".join([
        f"<b>[cron] {job.name} ({job.code}) failed</b>",
        *[f"<b>{label}:</b> {value}" for label, value in lines],
        '<pre>partner said &lt;b&gt;&amp;"evil"&lt;/b&gt; — Überweisung fehlgeschlagen 送金失敗 🚫\nsecond line</pre>',
        f'<a href="{link}">Open the execution in the admin</a>',
    ])
    markup = Markup(sent["text"])
    assert {tag for tag, _ in markup.tags} == {"b", "pre", "a"}  # the job's <b> stayed text
    assert markup.pre == ERROR

    (hook,) = http.received("/hooks/")
    assert hook.path == "/hooks/cron" and hook.headers["x-cron-celery-event"] == "FAILED"
    assert hook.headers["user-agent"] == "cron_celery"
    stamp = hook.headers["x-cron-celery-timestamp"]  # the signature covers "<timestamp>.<body>"
    expected = "sha256=" + hmac.new(SECRET.encode(), stamp.encode() + b"." + hook.raw, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(hook.headers["x-cron-celery-signature"], expected)
    assert hook.headers["x-cron-celery-delivery"] == hook.json()["delivery_id"]  # the alert row's, signed
    assert "送金失敗".encode() in hook.raw  # UTF-8 on the wire, not \u escapes
    assert execution.duration is not None
    assert hook.json() == {
        "event": "FAILED", "job": job.name, "code": job.code, "slot": "2026-11-29T01:00:00+00:00",
        "execution_date": "2026-11-29", "execution_id": execution.id, "run_number": 1, "attempt": 1,
        "status": "FAILED", "trigger": "MANUAL", "duration_seconds": execution.duration.total_seconds(),
        "error_code": "PARTNER_DOWN", "error": ERROR, "admin_url": link,
        "delivery_id": hook.headers["x-cron-celery-delivery"],
    }

    for alert in Alert.objects.filter(execution=execution):
        assert (alert.status, alert.attempts, alert.last_error) == (SENT, 1, "")
        assert alert.sent_at is not None and alert.sent_at >= alert.created_at


def test_a_webhook_without_a_secret_is_unsigned_and_a_recovery_is_reported_too(http):
    job, _job_id = make_job(notify={"on_failure": ["webhook"], "on_recovery": ["webhook"]})
    with notifying({"webhook": {"url": f"{http.url}/hooks/plain"}}, admin=""):
        failed = execute(job, 0, reporting())
        recovered = execute(job, 1, ok)
        for alert in Alert.objects.filter(job__code=job.code).order_by("id"):
            assert delivery.deliver(alert.id) == SENT
    first, second = http.requests
    assert "x-cron-celery-signature" not in first.headers and "x-cron-celery-signature" not in second.headers
    assert first.headers["x-cron-celery-timestamp"].isdigit()  # unsigned, but still dated and identified
    assert first.headers["x-cron-celery-delivery"] == first.json()["delivery_id"]
    assert (first.headers["x-cron-celery-event"], second.headers["x-cron-celery-event"]) == ("FAILED", "RECOVERED")
    assert (first.json()["execution_id"], first.json()["admin_url"]) == (failed.execution_id, None)  # no base URL
    body = second.json()
    assert (body["event"], body["status"], body["execution_id"], body["error"], body["error_code"]) == (
        "RECOVERED", "SUCCEEDED", recovered.execution_id, "all good", "")


def test_a_20000_character_error_is_bounded_on_every_channel(http):
    huge = "\n".join(f"line {i:02d} " + "é" * 490 for i in range(40))
    assert len(huge) > 19_000
    job, _job_id = make_job(notify={"on_failure": ["slack", "telegram", "webhook"]})
    config = {"slack": {"webhook_url": f"{http.url}/services/T/B/X"},
              "telegram": {"bot_token": TOKEN, "chat_id": "1", "api_url": http.url},
              "webhook": {"url": f"{http.url}/hooks/cron"}}
    with notifying(config):
        outcome = execute(job, body=reporting(huge))
        assert len(CronExecution.objects.get(id=outcome.execution_id).message) < 10_100  # MESSAGE_MAX_CHARS
        for alert in Alert.objects.filter(execution_id=outcome.execution_id):
            assert delivery.deliver(alert.id) == SENT
    link = admin_url(outcome.execution_id)
    slack = http.received("/services/")[0].json()["text"]
    telegram = http.received("/bot")[0].json()["text"]
    error = http.received("/hooks/")[0].json()["error"]
    assert len(slack) <= 3500 and len(telegram) <= 4096
    assert len(error) == 1502 and error.endswith(" …") and error.startswith("line 00 é")
    for text in (slack, telegram, error):
        assert "line 02" in text and "line 03" not in text  # the first lines, cut at 1,500 characters
    assert link in slack and link in telegram
    assert slack.count("```") == 2 and telegram.count("<pre>") == telegram.count("</pre>") == 1


# --- 2. email -----------------------------------------------------------------------------

def test_email_goes_through_djangos_smtp_backend_to_a_real_smtp_server(smtp):
    job, job_id = make_job(notify={"on_failure": ["email"], "on_recovery": ["email"]})
    config = {"email": {"recipients": ["ops@example.com", "oncall@example.com"], "from_email": "cron@example.com"}}
    with notifying(config), smtp_backend(smtp.port):
        failed = execute(job, 0, reporting())
        execute(job, 1, ok)
        for alert in Alert.objects.filter(job_id=job_id).order_by("id"):
            assert delivery.deliver(alert.id) == SENT
    assert [(mail.mail_from, mail.rcpt_tos) for mail in smtp.mails] == [
        ("cron@example.com", ["ops@example.com", "oncall@example.com"])] * 2
    failure, recovery = (mail.message() for mail in smtp.mails)
    assert failure["Subject"] == f"[cron] {job.name} ({job.code}) failed"
    assert (failure["From"], failure["To"]) == ("cron@example.com", "ops@example.com, oncall@example.com")
    text = failure.get_content().replace("\r\n", "\n")  # SMTP lines end in CRLF
    execution = CronExecution.objects.get(id=failed.execution_id)
    for label, value in facts(execution):
        assert f"{label}: {value}\n" in text
    assert ERROR in text and admin_url(failed.execution_id) in text
    assert recovery["Subject"] == f"[cron] {job.name} ({job.code}) recovered"
    assert "Status: SUCCEEDED" in recovery.get_content()


# --- 3. failed deliveries -----------------------------------------------------------------

def test_a_failing_endpoint_is_retried_until_sent_and_the_execution_is_untouched(http):
    job, _job_id = make_job(notify={"on_failure": ["webhook"]})
    with notifying({"webhook": {"url": f"{http.url}/hooks/cron"}}):
        outcome = execute(job, body=reporting())
        before = CronExecution.objects.filter(id=outcome.execution_id).values().get()
        alert = Alert.objects.get(execution_id=outcome.execution_id)
        http.answer(500, '{"error": "upstream exploded"}', times=3)
        for attempt in (1, 2, 3):
            with pytest.raises(exceptions.DeliveryFailed, match="HTTP 500"):
                delivery.deliver(alert.id)
            alert.refresh_from_db()
            assert (alert.status, alert.attempts, alert.sent_at) == (PENDING, attempt, None)
            assert alert.last_error == ('DeliveryFailed: The alert could not be delivered: HTTP 500: '
                                        '{"error": "upstream exploded"}')
        assert delivery.deliver(alert.id) == SENT
    alert.refresh_from_db()
    assert (alert.status, alert.attempts, alert.last_error) == (SENT, 4, "") and alert.sent_at is not None
    assert len(http.requests) == 4 and len({request.raw for request in http.requests}) == 1
    after = CronExecution.objects.filter(id=outcome.execution_id).values().get()
    assert after == before and (after["status"], after["message"]) == (Status.FAILED, ERROR)


def test_after_max_attempts_the_alert_is_failed_for_good(http):
    job, _job_id = make_job(notify={"on_failure": ["webhook"]})
    http.answer(503, "nope", times=10)
    with notifying({"webhook": {"url": f"{http.url}/hooks/cron"}, "max_attempts": 2}):
        outcome = execute(job, body=reporting())
        alert = Alert.objects.get(execution_id=outcome.execution_id)
        with pytest.raises(exceptions.DeliveryFailed):
            delivery.deliver(alert.id)
        assert delivery.deliver(alert.id) == GIVEN_UP  # the last attempt: recorded, not raised
        assert delivery.deliver(alert.id) == "GONE"
    alert.refresh_from_db()
    assert (alert.status, alert.attempts, alert.sent_at) == (GIVEN_UP, 2, None)
    assert alert.last_error.endswith("HTTP 503: nope")
    assert len(http.requests) == 2


def test_a_hanging_endpoint_is_given_up_after_the_timeout(http):
    job, _job_id = make_job(notify={"on_failure": ["webhook"]})
    http.hang = 30
    with notifying({"webhook": {"url": f"{http.url}/hooks/cron"}, "timeout": 0.5}):
        outcome = execute(job, body=reporting())
        alert = Alert.objects.get(execution_id=outcome.execution_id)
        # The server holds the request for 30 s: returning at all with a timeout is the proof.
        with pytest.raises(exceptions.DeliveryFailed, match="timed out"):
            delivery.deliver(alert.id)
    alert.refresh_from_db()
    assert (alert.status, alert.attempts) == (PENDING, 1)
    assert "TimeoutError: timed out" in alert.last_error
    assert len(http.requests) == 1


def test_secrets_never_reach_last_error_or_the_logs(http, caplog):
    closed = free_port()  # nothing listens there
    slack_secret, hook_secret = "s3cr3tSlackPath", "s3cr3tHookPath"
    job, _job_id = make_job(notify={"on_failure": ["slack", "telegram", "webhook"]})
    config = {"slack": {"webhook_url": f"http://127.0.0.1:{closed}/services/T000/B000/{slack_secret}"},
              # an endpoint that echoes the path in its error, as many servers do
              "telegram": {"bot_token": TOKEN, "chat_id": "1", "api_url": http.url},
              # a URL without its scheme: urllib's error quotes all of it
              "webhook": {"url": f"hooks.example.com/cron/{hook_secret}", "secret": SECRET}}
    http.answer(404, "Cannot POST {path}")
    with notifying(config), caplog.at_level("WARNING", logger="cron_celery"):
        outcome = execute(job, body=reporting())
        for alert in Alert.objects.filter(execution_id=outcome.execution_id):
            with pytest.raises(exceptions.DeliveryFailed) as caught:
                delivery.deliver(alert.id)
            for secret in (slack_secret, TOKEN, hook_secret):
                assert secret not in str(caught.value)
    rows = {a.channel: a.last_error for a in Alert.objects.filter(execution_id=outcome.execution_id)}
    assert "ConnectionRefusedError" in rows["slack"]
    assert rows["telegram"] == ("DeliveryFailed: The alert could not be delivered: "
                                "HTTP 404: Cannot POST /bot***/sendMessage")
    assert rows["webhook"] == "ValueError: unknown url type: '***'"
    logged = [record.getMessage() for record in caplog.records if record.name == "cron_celery.alerts.delivery"]
    assert len(logged) == 3
    for text in [*rows.values(), *logged]:
        assert slack_secret not in text and TOKEN not in text and hook_secret not in text


@pytest.mark.django_db(transaction=True)
def test_the_delivery_task_retries_with_backoff_on_a_real_worker_until_sent(http, session_queue):
    job, _job_id = make_job(notify={"on_failure": ["webhook"]})
    http.answer(500, "try later", times=3)
    with notifying({"webhook": {"url": f"{http.url}/hooks/cron"}}), start_worker(
        app, pool="threads", concurrency=2, perform_ping_check=False, loglevel="WARNING", shutdown_timeout=30
    ):
        outcome = execute(job, body=reporting())  # its commit queues cron_celery.deliver_alert
        alert = Alert.objects.get(execution_id=outcome.execution_id)
        wait_for(lambda: Alert.objects.get(id=alert.id).status == SENT, timeout=45, what="the alert to be sent")
    alert.refresh_from_db()
    assert (alert.status, alert.attempts, alert.last_error) == (SENT, 4, "")
    arrivals = [request.at for request in http.requests]
    assert len(arrivals) == 4
    gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
    for gap, backoff in zip(gaps, (2, 4, 8), strict=True):
        assert gap >= backoff - 0.5, gaps  # at least the backoff (a minimum, not a timing)
    assert CronExecution.objects.get(id=outcome.execution_id).status == Status.FAILED


@pytest.mark.django_db(transaction=True)
def test_the_reconciler_queues_again_an_alert_whose_delivery_message_was_lost(http, session_queue):
    job, job_id = make_job(notify={"on_failure": ["webhook"]})
    other, _ = make_job(notify={"on_failure": ["webhook"]})
    with notifying({"webhook": {"url": f"{http.url}/hooks/cron"}}, RECONCILE=RECONCILE):
        lost = execute(job, 0, body=reporting())
        young = execute(other, 0, body=reporting())
        assert len(queued_deliveries(session_queue)) == 2
        session_queue.delete(settings.CELERY_TASK_DEFAULT_QUEUE)  # the broker lost both messages
        old = Alert.objects.get(execution_id=lost.execution_id)
        sql(f"UPDATE {Alert._meta.db_table} SET updated_at = now() - interval '10 minutes' WHERE id = %s", [old.id])
        report = reconciler.run_pass()
        assert report.alerts == 1  # only the alert untouched for PENDING_GRACE (60 s)
        assert [args[0] for args in queued_deliveries(session_queue)] == [old.id]
        with start_worker(app, pool="threads", concurrency=1, perform_ping_check=False, loglevel="WARNING",
                          shutdown_timeout=30):
            wait_for(lambda: Alert.objects.get(id=old.id).status == SENT, timeout=30, what="the alert to be sent")
    assert Alert.objects.get(execution_id=young.execution_id).status == PENDING  # its turn comes after the grace
    assert [request.path for request in http.requests] == ["/hooks/cron"]
    assert CronJob.objects.get(id=job_id).alerted_at is not None


# --- 4. the alert policy (rows only) ------------------------------------------------------

def test_alert_after_three_alerts_once_per_incident_and_a_success_recovers_it():
    job, job_id = make_job(alert_after=3, notify={"on_failure": ["slack", "webhook"], "on_recovery": ["slack"]})
    with notifying({}):
        failed = [execute(job, n, reporting()).execution_id for n in range(5)]
        assert alert_rows(job_id) == [(failed[2], "FAILED", "slack"), (failed[2], "FAILED", "webhook")]
        job_row = CronJob.objects.get(id=job_id)
        assert job_row.consecutive_failures == 5 and job_row.alerted_at is not None
        recovered = execute(job, 5, ok).execution_id
        assert alert_rows(job_id)[2:] == [(recovered, "RECOVERED", "slack")]
        assert CronJob.objects.filter(id=job_id, consecutive_failures=0, alerted_at=None).exists()
        again = [execute(job, n, reporting()).execution_id for n in range(6, 9)]  # a new incident
    assert alert_rows(job_id)[3:] == [(again[2], "FAILED", "slack"), (again[2], "FAILED", "webhook")]
    assert {(status, attempts, sent_at is None) for status, attempts, sent_at in
            Alert.objects.filter(job_id=job_id).values_list("status", "attempts", "sent_at")} == {(PENDING, 0, True)}


def test_a_success_after_failures_that_never_alerted_sends_no_recovery():
    job, job_id = make_job(alert_after=3, notify={"on_failure": ["slack"], "on_recovery": ["slack"]})
    with notifying({}):
        execute(job, 0, reporting())
        execute(job, 1, raising)
        execute(job, 2, ok)
    assert alert_rows(job_id) == []
    job_row = CronJob.objects.get(id=job_id)
    assert (job_row.consecutive_failures, job_row.alerted_at) == (0, None)


def test_alert_repeat_alerts_again_once_the_interval_passed():
    job, job_id = make_job(alert_repeat=60, notify={"on_failure": ["webhook"]})
    once, once_id = make_job(notify={"on_failure": ["webhook"]})  # alert_repeat None: once per incident
    with notifying({}):
        first = execute(job, 0, reporting()).execution_id
        execute(job, 1, reporting())  # within a minute of the alert: quiet
        execute(once, 0, reporting())
        assert alert_rows(job_id) == [(first, "FAILED", "webhook")]
        sql(f"UPDATE {executions.JOB} SET alerted_at = alerted_at - interval '2 minutes' WHERE id = ANY(%s)",
            [[job_id, once_id]])
        repeated = execute(job, 2, reporting()).execution_id
        execute(job, 3, reporting())  # just alerted again: quiet
        execute(once, 1, reporting())
    assert alert_rows(job_id) == [(first, "FAILED", "webhook"), (repeated, "FAILED", "webhook")]
    assert len(alert_rows(once_id)) == 1
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT alerted_at = now() FROM {executions.JOB} WHERE id = %s", [job_id])
        assert cursor.fetchone() == (True,)  # the repeat restarted the interval


def test_retries_never_alert_and_the_final_failure_does():
    job, job_id = make_job(max_retries=1, retry_jitter=False, notify={"on_failure": ["webhook"]})
    with notifying({}):
        first = execute(job, 0, raising, allow_retry=True)
        assert first.status == Status.RETRYING and first.execution_id is not None
        assert alert_rows(job_id) == [] and CronJob.objects.get(id=job_id).alerted_at is None
        final = execute(job, 0, raising, trigger=Trigger.ENQUEUE, execution_id=first.execution_id, allow_retry=True)
        assert final.status == Status.FAILED and final.execution_id == first.execution_id
    assert alert_rows(job_id) == [(first.execution_id, "FAILED", "webhook")]
    message = delivery.message_for(Alert.objects.get(job_id=job_id))
    assert (message.attempt, message.error, message.error_code) == (2, "ConnectionError: partner down",
                                                                    "ConnectionError")


def test_on_success_channels_hear_of_every_success():
    job, job_id = make_job(notify={"on_success": ["webhook"], "on_failure": ["slack"], "on_recovery": ["telegram"]})
    with notifying({}):
        ids = [execute(job, 0, ok), execute(job, 1, ok), execute(job, 2, reporting()), execute(job, 3, ok)]
    first, second, failed, recovered = (outcome.execution_id for outcome in ids)
    assert alert_rows(job_id) == [
        (first, "SUCCEEDED", "webhook"), (second, "SUCCEEDED", "webhook"), (failed, "FAILED", "slack"),
        (recovered, "RECOVERED", "telegram"), (recovered, "SUCCEEDED", "webhook")]


def test_a_jobs_notify_replaces_the_settings_list_of_that_kind():
    plain, plain_id = make_job()
    own, own_id = make_job(notify={"on_failure": ["webhook"]})
    silent, silent_id = make_job(notify={"on_failure": []})
    with notifying({"on_failure": ["email", "slack"], "on_recovery": ["email"]}):
        runs_ = {job_id: (execute(job, 0, reporting()).execution_id, execute(job, 1, ok).execution_id)
                 for job, job_id in ((plain, plain_id), (own, own_id), (silent, silent_id))}
    (plain_failed, plain_ok), (own_failed, own_ok) = runs_[plain_id], runs_[own_id]
    assert alert_rows(plain_id) == [(plain_failed, "FAILED", "email"), (plain_failed, "FAILED", "slack"),
                                    (plain_ok, "RECOVERED", "email")]
    # on_recovery is not in its notify: the settings' list still applies
    assert alert_rows(own_id) == [(own_failed, "FAILED", "webhook"), (own_ok, "RECOVERED", "email")]
    assert alert_rows(silent_id) == []


def test_a_worker_lost_by_the_parent_alerts_lost_once_per_execution_and_a_lost_retry_opens_no_incident():
    notify = {"on_failure": ["webhook"], "on_recovery": ["webhook"]}
    final, final_id = make_job(notify=notify)
    retried, retried_id = make_job(max_retries=2, notify=notify)
    timed, timed_id = make_job(max_retries=1, notify=notify)

    def lose(job, job_id, pid, status=Status.LOST, execution_id=None):
        # As the worker's parent does when its child died: by the execution it ran, worker and pid.
        claim = claims.begin(job=job, job_id=job_id, slot=SLOT, execution_date=SLOT.date(), trigger=Trigger.BEAT,
                             execution_id=execution_id, worker="w", pid=pid, lease_seconds=60)
        assert claim.claimed
        ended = outcomes.dead(job, job_id=job_id, status=status, error_code="WORKER_LOST",
                              message="the child died (signal 9)", worker="w", pid=pid, execution_id=claim.execution_id)
        assert ended is not None
        return ended

    with notifying({}):
        lost = lose(final, final_id, 101)  # no attempt left: final
        first = lose(retried, retried_id, 102)  # attempts left: retried
        second = lose(retried, retried_id, 103, execution_id=first.execution_id)  # lost again, still retried
        third = execute(retried, 0, ok, trigger=Trigger.ENQUEUE, execution_id=first.execution_id)
        timed_out = lose(timed, timed_id, 104, status=Status.TIMED_OUT)  # a dead attempt that is no lost worker
    assert [e.status for e in (lost, first, second, timed_out)] == ["LOST", "RETRYING", "RETRYING", "RETRYING"]
    assert third.status == Status.SUCCEEDED and third.execution_id == first.execution_id
    assert alert_rows(final_id) == [(lost.execution_id, "LOST", "webhook")]
    assert CronJob.objects.get(id=final_id).alerted_at is not None  # a final LOST opens an incident
    # at once, once per execution; no incident opened, so its success recovers nothing
    assert alert_rows(retried_id) == [(first.execution_id, "LOST", "webhook")]
    assert CronJob.objects.get(id=retried_id).alerted_at is None
    assert alert_rows(timed_id) == []  # retries never alert
    message = delivery.message_for(Alert.objects.get(job_id=final_id))
    assert (message.title, message.error_code) == (f"[cron] {final.name} ({final.code}) was lost", "WORKER_LOST")


RECONCILE = {"INTERVAL": 0, "PENDING_GRACE": 60, "MISSED_GRACE": 120, "REPUBLISH_LIMIT": 2, "BATCH": 100}
NOW = dt.datetime(2026, 11, 29, 12, 32, tzinfo=dt.UTC)


def test_the_reconciler_writes_one_missed_alert_per_stranded_slot_and_per_outage():
    with notifying({"on_failure": ["webhook"]}, RECONCILE=RECONCILE):
        stranded, stranded_id = make_job(catch_up="none")
        execution_id, _ = dispatch.enqueue(job=stranded, job_id=stranded_id, slot=SLOT, execution_date=SLOT.date(),
                                         trigger=Trigger.BEAT)
        sql(f"UPDATE {executions.EXE} SET created_at = now() - interval '1 hour' WHERE id = %s", [execution_id])
        _overdue, overdue_id = make_job(catch_up="none")
        CronJob.objects.filter(id=overdue_id).update(schedule="0 * * * *", schedule_timezone="UTC",
                                                     next_run_at=NOW.replace(hour=8, minute=0))
        report = reconciler.run_pass(NOW)
    assert report.missed == 1 + 5  # the stranded slot, and 08:00 ... 12:00
    assert CronExecution.objects.get(id=execution_id).status == Status.MISSED
    assert alert_rows(stranded_id) == [(execution_id, "MISSED", "webhook")]
    newest = CronExecution.objects.filter(job_id=overdue_id, status=Status.MISSED).order_by("-slot").first()
    assert newest is not None and newest.slot == NOW.replace(hour=12, minute=0)
    assert alert_rows(overdue_id) == [(newest.id, "MISSED", "webhook")]  # one alert for the outage
    assert set(CronJob.objects.filter(id__in=[stranded_id, overdue_id]).values_list(
        "consecutive_failures", "alerted_at")) == {(0, None)}  # MISSED is no failure, no incident


class _Died(BaseException):
    """The process killed where this is raised: nothing after it runs, nothing catches it."""


@pytest.mark.django_db(transaction=True)
def test_slots_written_missed_commit_with_their_outages_alert_whatever_stops_the_writer_between(monkeypatch):
    """The soak (seed 4242) found outages recorded MISSED and alerted to nobody: the beat wrote the
    MISSED slots (one statement), published the round's other slots to a broker that was down, and
    was killed before it recorded the outage's alert in a transaction of its own. The next round
    found the slots written and the job advanced: no alert, ever. The rows and the alert now commit
    together; the writer dying between them leaves neither, and the next pass writes both."""
    with notifying({"on_failure": ["webhook"]}, RECONCILE=RECONCILE):
        _overdue, overdue_id = make_job(catch_up="none")
        CronJob.objects.filter(id=overdue_id).update(schedule="0 * * * *", schedule_timezone="UTC",
                                                     next_run_at=NOW.replace(hour=8, minute=0))
        real = repairs.newest_missed

        def dies(job_ids: list[int]) -> Any:
            raise _Died

        monkeypatch.setattr(repairs, "newest_missed", dies)
        with pytest.raises(_Died):
            reconciler.run_pass(NOW)
        monkeypatch.setattr(repairs, "newest_missed", real)
        assert not CronExecution.objects.filter(job_id=overdue_id).exists()  # neither the slots nor the alert
        report = reconciler.run_pass(NOW)
    assert report.missed == 5  # 08:00 ... 12:00
    newest = CronExecution.objects.filter(job_id=overdue_id, status=Status.MISSED).order_by("-slot").first()
    assert newest is not None and newest.slot == NOW.replace(hour=12, minute=0)
    assert alert_rows(overdue_id) == [(newest.id, "MISSED", "webhook")]


# --- 5. signals ---------------------------------------------------------------------------

def test_signals_are_sent_after_each_outcome_and_a_raising_receiver_changes_nothing():
    received: list[tuple[str, dict[str, Any]]] = []
    chosen = {"failed": signals.execution_failed, "succeeded": signals.execution_succeeded,
              "recovered": signals.execution_recovered, "lost": signals.execution_lost,
              "skipped": signals.execution_skipped}
    receivers = {}
    for name, signal in chosen.items():
        def receiver(sender: str, _name: str = name, **kwargs: Any) -> None:
            received.append((_name, {"sender": sender, **{k: v for k, v in kwargs.items() if k != "signal"}}))
        receivers[name] = receiver
        signal.connect(receiver, weak=False)

    def broken(sender: str, **kwargs: Any) -> None:
        raise RuntimeError("a receiver with a bug")

    signals.execution_failed.connect(broken, weak=False)
    signals.execution_succeeded.connect(broken, weak=False)
    try:
        job, job_id = make_job()
        failed = execute(job, 0, reporting())
        recovered = execute(job, 1, ok)
        succeeded = execute(job, 2, ok)
        skipped = execute(job, 2, ok)  # the slot already ran
        claim = claims.begin(job=job, job_id=job_id, slot=slot(3), execution_date=SLOT.date(), trigger=Trigger.BEAT,
                             worker="w", pid=123)
        lost = outcomes.dead(job, job_id=job_id, status=Status.LOST, error_code="WORKER_LOST",
                             message="the child died", worker="w", pid=123, execution_id=claim.execution_id)
    finally:
        for name, signal in chosen.items():
            signal.disconnect(receivers[name])
        signals.execution_failed.disconnect(broken)
        signals.execution_succeeded.disconnect(broken)
    assert lost is not None and lost.execution_id == claim.execution_id
    base = {"sender": job.name, "job": job.name, "code": job.code}
    assert received == [
        ("failed", {**base, "execution_id": failed.execution_id, "slot": slot(0), "status": "FAILED",
                    "error_code": "PARTNER_DOWN", "message": ERROR}),
        ("succeeded", {**base, "execution_id": recovered.execution_id, "slot": slot(1), "status": "SUCCEEDED",
                       "error_code": "", "message": "all good"}),
        ("recovered", {**base, "execution_id": recovered.execution_id, "slot": slot(1), "status": "SUCCEEDED",
                       "error_code": "", "message": "all good"}),
        ("succeeded", {**base, "execution_id": succeeded.execution_id, "slot": slot(2), "status": "SUCCEEDED",
                       "error_code": "", "message": "all good"}),
        ("skipped", {**base, "execution_id": skipped.execution_id, "slot": slot(2), "status": "SKIPPED",
                     "error_code": "ALREADY_RAN", "message": skipped.message}),
        ("lost", {**base, "execution_id": lost.execution_id, "slot": slot(3), "status": "LOST",
                  "error_code": "WORKER_LOST", "message": "the child died"}),
    ]
    statuses = dict(CronExecution.objects.filter(job_id=job_id).values_list("id", "status"))
    assert statuses == {failed.execution_id: "FAILED", recovered.execution_id: "SUCCEEDED",
                        succeeded.execution_id: "SUCCEEDED", skipped.execution_id: "SKIPPED",
                        lost.execution_id: "LOST"}
    assert (failed.status, recovered.status, skipped.status) == (Status.FAILED, Status.SUCCEEDED, Status.SKIPPED)


# --- 6. Sentry ----------------------------------------------------------------------------

def test_a_final_failure_on_the_sentry_channel_is_one_tagged_and_fingerprinted_event(sentry_server):
    job, _job_id = make_job(notify={"on_failure": ["sentry"]})
    with notifying({}):
        outcome = execute(job, body=reporting())
        (alert,) = Alert.objects.filter(execution_id=outcome.execution_id)
        assert (alert.channel, alert.event) == ("sentry", "FAILED")
        assert delivery.deliver(alert.id) == SENT
    (event,) = sentry_items(sentry_server, "event")
    assert {key: event["tags"][key] for key in ("cron.job", "cron.code", "cron.slot", "cron.attempt", "cron.event")} \
        == {"cron.job": job.name, "cron.code": job.code, "cron.slot": "2026-11-29T01:00:00+00:00",
            "cron.attempt": "1", "cron.event": "FAILED"}
    assert event["fingerprint"] == ["cron_celery", job.code, "PARTNER_DOWN"]
    assert (event["level"], event["logger"]) == ("error", "cron_celery")
    assert event["message"] == f'{job.name} ({job.code}) FAILED: partner said <b>&"evil"</b> — Überweisung ' \
                               f"fehlgeschlagen 送金失敗 🚫"
    assert event["extra"]["execution_id"] == outcome.execution_id
    assert event["extra"]["admin_url"] == admin_url(outcome.execution_id)
    assert sentry_items(sentry_server, "check_in") == []  # no schedule: no monitor


def test_crons_check_ins_are_in_progress_once_and_error_once_after_the_retries(sentry_server):
    job, job_id = make_job(schedule=every(minutes=5), notify={"on_failure": ["sentry"]}, max_retries=2,
                           retry_backoff=1, retry_jitter=False, alert_after=2)
    with notifying({"sentry": {"checkin_margin": 2, "recovery_threshold": 3, "max_runtime_per_attempt": 120}}):
        first = execute(job, 0, raising, allow_retry=True)
        assert first.status == Status.RETRYING
        check_in_id = CronExecution.objects.get(id=first.execution_id).sentry_checkin_id
        assert re.fullmatch(r"[0-9a-f]{32}", check_in_id)
        for expected in (Status.RETRYING, Status.FAILED):
            outcome = execute(job, 0, raising, trigger=Trigger.ENQUEUE, execution_id=first.execution_id,
                              allow_retry=True)
            assert outcome.status == expected
    check_ins = sentry_items(sentry_server, "check_in")
    assert [(c["monitor_slug"], c["check_in_id"], c["status"]) for c in check_ins] == [
        (job.name, check_in_id, "in_progress"), (job.name, check_in_id, "error")]
    assert check_ins[0]["monitor_config"] == {
        "schedule": {"type": "interval", "value": 5, "unit": "minute"}, "timezone": "UTC", "checkin_margin": 2,
        # 3 attempts of 120 s and the waits between them (1 s, 2 s), in minutes, rounded up
        "max_runtime": 7, "failure_issue_threshold": 2, "recovery_threshold": 3}
    assert (check_ins[0]["environment"], check_ins[0]["release"]) == ("tests", "cron-celery-tests")
    assert alert_rows(job_id) == [] and sentry_items(sentry_server, "event") == []  # alert_after=2


def test_crons_check_ins_of_a_success_are_in_progress_then_ok(sentry_server):
    job, _job_id = make_job(schedule="*/5 * * * *", notify={"on_failure": ["sentry"]})
    with notifying({}):
        outcome = execute(job, 0, ok)
    assert outcome.status == Status.SUCCEEDED
    check_in_id = CronExecution.objects.get(id=outcome.execution_id).sentry_checkin_id
    check_ins = sentry_items(sentry_server, "check_in")
    assert [(c["check_in_id"], c["status"]) for c in check_ins] == [(check_in_id, "in_progress"), (check_in_id, "ok")]
    assert check_ins[0]["monitor_config"]["schedule"] == {"type": "crontab", "value": "*/5 * * * *"}
    assert check_ins[1]["monitor_config"] == check_ins[0]["monitor_config"]
    assert sentry_items(sentry_server, "event") == []


def test_without_sentry_initialised_nothing_is_sent_and_no_sentry_alert_is_written(http):
    assert not sentry.active()
    job, job_id = make_job(schedule=every(minutes=5), notify={"on_failure": ["sentry", "webhook"]})
    with notifying({"webhook": {"url": f"{http.url}/hooks/cron"}}):
        outcome = execute(job, 0, reporting())
        assert alerts.wanted_for(job, Status.FAILED) is True  # for the webhook
    assert alert_rows(job_id) == [(outcome.execution_id, "FAILED", "webhook")]
    assert CronExecution.objects.get(id=outcome.execution_id).sentry_checkin_id == ""
    sentryless, sentryless_id = make_job(notify={"on_failure": ["sentry"]})
    with notifying({}):
        assert alerts.wanted_for(sentryless, Status.FAILED) is False
        execute(sentryless, 0, reporting())
    assert alert_rows(sentryless_id) == []
    assert http.requests == []  # nothing was delivered


# --- 7. system checks and custom channels -------------------------------------------------

def test_check_notifications_reports_bad_channels_as_e011_and_a_bad_admin_url_as_e012():
    config = {
        "on_failure": ["nope", "slack", "telegram", "tests.test_alerts.NotAChannel", "tests.nowhere.Pager",
                       "tests.test_alerts.MyChannel", "pager"],
        "on_recovery": ["email"],
        "slack": {}, "telegram": {"bot_token": TOKEN}, "email": {"recipients": "ops@example.com"},
        "tests.test_alerts.MyChannel": {"routing_key": "rk"},
        "channels": {"pager": {"class": "tests.test_alerts.MyChannel", "routing_key": "rk2"}},
    }
    with notifying(config, admin="ops.example.com"):
        errors = checks.check_notifications()
    assert [error.id for error in errors] == ["cron_celery.E011"] * 6 + ["cron_celery.E012"]
    messages = [error.msg for error in errors]
    assert messages[0] == "Channel 'email': option 'recipients' must be a list of addresses."
    assert messages[1].startswith("Unknown notification channel 'nope': use email, slack, telegram, webhook, sentry")
    assert messages[2:4] == ["Channel 'slack': option 'webhook_url' is missing.",
                             "Channel 'telegram': option 'chat_id' is missing."]
    assert messages[4].startswith("Unknown notification channel 'tests.nowhere.Pager'")
    assert messages[4].endswith("(No module named 'tests.nowhere')")
    assert messages[5].endswith("(tests.test_alerts.NotAChannel is not a cron_celery.notifiers.base.Channel)")
    assert messages[6] == "CRON_CELERY['ADMIN_BASE_URL'] must start with http:// or https://, not 'ops.example.com'."
    assert not any("MyChannel'" in message or "'pager'" in message for message in messages)
    with notifying({"on_failure": ["tests.test_alerts.MyChannel"]}):
        (missing,) = checks.check_notifications()
    assert missing.msg == "Channel 'tests.test_alerts.MyChannel': option 'routing_key' is missing."
    good = {"on_failure": ["slack", "tests.test_alerts.MyChannel"], "slack": {"webhook_url": "https://h/x"},
            "tests.test_alerts.MyChannel": {"routing_key": "rk"}}
    with notifying(good):
        assert checks.check_notifications() == []


def test_check_notifications_refuses_bad_sentry_options_as_e011():
    bad = {"on_failure": ["sentry"], "sentry": {"crons": "yes", "checkin_margin": 0, "recovery_threshold": 2,
                                                 "max_runtime_per_attempt": "1h", "checkin_margins": 5}}
    with override_settings(CRON_CELERY={"NOTIFICATIONS": bad}):
        found = checks.check_notifications(None)
    assert {message.id for message in found} == {"cron_celery.E011"}
    text = " ".join(message.msg for message in found)
    assert "unknown option 'checkin_margins'" in text
    assert "'crons' must be True or False, not 'yes'" in text
    assert "'checkin_margin' must be a whole number of minutes, at least 1, not 0" in text
    assert "'max_runtime_per_attempt' must be a number of seconds above 0, not '1h'" in text
    assert "'recovery_threshold' must" not in text  # 2 is fine
    good = {"on_failure": ["sentry"], "sentry": {"crons": False, "checkin_margin": 5, "max_runtime_per_attempt": 90.5}}
    with override_settings(CRON_CELERY={"NOTIFICATIONS": good}):
        assert checks.check_notifications(None) == []


def test_without_sentry_sdk_installed_the_sentry_channel_is_e011_and_a_delivery_says_what_to_install(
        sentry_server, monkeypatch):
    """sentry-sdk is the [sentry] extra. Its absence is simulated here by the name the module
    imported it under; the wheel without the extra is followed for real in test_quickstart."""
    from cron_celery.notifiers import sentry as notifiers_sentry

    job, job_id = make_job()
    with notifying({"on_failure": ["sentry"]}):
        execute(job, 0, reporting())  # sentry-sdk is here and initialised: the alert is written
        (alert_id,) = Alert.objects.filter(job_id=job_id).values_list("id", flat=True)
        monkeypatch.setattr(notifiers_sentry, "sentry_sdk", None)
        assert not notifiers_sentry.installed() and not notifiers_sentry.active()
        assert not sentry.crons_enabled(job)  # no check-in is attempted
        found = checks.check_notifications(None)
        assert [(message.id, message.msg) for message in found] == [
            ("cron_celery.E011", "Channel 'sentry': sentry-sdk is not installed (pip install 'cron_celery[sentry]').")]
        with pytest.raises(exceptions.DeliveryFailed, match=r"not installed in this worker \(pip install"):
            delivery.deliver(alert_id)
    assert Alert.objects.get(id=alert_id).status == AlertStatus.PENDING  # kept, to be tried again


def test_a_custom_channel_by_dotted_path_or_short_name_is_used_by_deliver():
    MyChannel.sent.clear()
    job, job_id = make_job(notify={"on_failure": ["tests.test_alerts.MyChannel", "pager"]})
    config = {"tests.test_alerts.MyChannel": {"routing_key": "rk"}, "timeout": 3,
              "channels": {"pager": {"class": "tests.test_alerts.MyChannel", "routing_key": "rk2"}}}
    with notifying(config):
        outcome = execute(job, 0, reporting())
        for alert in Alert.objects.filter(job_id=job_id).order_by("channel"):
            assert delivery.deliver(alert.id) == SENT
    assert [(name, options, timeout) for name, options, _message, timeout in MyChannel.sent] == [
        ("pager", {"routing_key": "rk2"}, 3.0), ("tests.test_alerts.MyChannel", {"routing_key": "rk"}, 3.0)]
    message = MyChannel.sent[0][2]
    assert (message.event, message.job, message.code, message.execution_id) == (
        "FAILED", job.name, job.code, outcome.execution_id)
    assert (message.error, message.error_code, message.admin_url) == (ERROR, "PARTNER_DOWN",
                                                                      admin_url(outcome.execution_id))
    assert MyChannel("x", {"routing_key": "rk"}).redact("key rk leaked") == "key *** leaked"


# --- found while writing these tests, fixed since ---------------------------------------------

def test_a_success_ends_the_incident_even_without_recovery_channels():
    job, job_id = make_job(notify={"on_failure": ["webhook"]})
    with notifying({}):
        first = execute(job, 0, reporting()).execution_id
        execute(job, 1, ok)
        assert CronJob.objects.get(id=job_id).alerted_at is None  # the incident is over
        second = execute(job, 2, reporting()).execution_id
    assert alert_rows(job_id) == [(first, "FAILED", "webhook"), (second, "FAILED", "webhook")]


def test_slack_keeps_the_admin_link_and_closes_the_code_block_for_an_error_full_of_markup(http):
    job, _job_id = make_job(notify={"on_failure": ["slack"]})
    with notifying({"slack": {"webhook_url": f"{http.url}/services/T/B/X"}}):
        outcome = execute(job, body=reporting("<&>" * 7000))
        assert delivery.deliver(Alert.objects.get(execution_id=outcome.execution_id).id) == SENT
    text = http.requests[0].json()["text"]
    assert len(text) <= 3500
    assert admin_url(outcome.execution_id) in text and text.count("```") == 2


def test_telegram_never_cuts_an_html_entity_in_half():
    job, _job_id = make_job(notify={"on_failure": ["telegram"]})
    with notifying({"telegram": {"bot_token": TOKEN, "chat_id": "1"}}):
        outcome = execute(job, body=reporting())
        base = delivery.message_for(Alert.objects.get(execution_id=outcome.execution_id))
        channel = channels.channel("telegram")
    assert isinstance(channel, TelegramChannel)
    # 5 alignments of a run of '&' (5 characters each once escaped): at most one cut is clean
    texts = [channel.render(dataclasses.replace(base, error="x" * k + "&" * 3000))["text"] for k in range(5)]
    assert all(len(text) <= 4096 for text in texts)
    assert [BROKEN_ENTITY.findall(text) for text in texts] == [[]] * 5


def test_sentry_initialised_without_a_dsn_counts_as_not_initialised():
    job, job_id = make_job(notify={"on_failure": ["sentry"]})
    sentry_sdk.init(dsn=None, default_integrations=False, auto_enabling_integrations=False)
    try:
        with notifying({}):
            execute(job, 0, reporting())
            pending = list(Alert.objects.filter(job_id=job_id).values_list("id", flat=True))
            for alert_id in pending:  # what a worker would then do, max_attempts times
                with pytest.raises(exceptions.DeliveryFailed, match="dropped the event"):
                    delivery.deliver(alert_id)
    finally:
        _no_sentry()
    assert alert_rows(job_id) == []


def test_a_slack_webhook_path_echoed_by_the_endpoint_is_redacted(http):
    secret_path = "T000/B000/s3cr3tSlackPath"
    job, _job_id = make_job(notify={"on_failure": ["slack"]})
    http.answer(404, "Cannot POST {path}")
    with notifying({"slack": {"webhook_url": f"{http.url}/services/{secret_path}"}}):
        outcome = execute(job, body=reporting())
        alert = Alert.objects.get(execution_id=outcome.execution_id)
        with pytest.raises(exceptions.DeliveryFailed):
            delivery.deliver(alert.id)
    alert.refresh_from_db()
    assert "HTTP 404" in alert.last_error
    assert "s3cr3tSlackPath" not in alert.last_error


def test_a_second_outage_of_a_weekly_job_alerts_missed_again_whatever_order_the_rows_were_written_in():
    """Outage 1: a weekly catch-up ``latest`` job misses a slot and runs the next one late; that
    run ends before the beat records the MISSED slot (the alert is written after the job's last
    run). Outage 2, a week later: its MISSED slot alerts again (decided by slots, not by when
    rows were written; before: suppressed as the same outage)."""
    week = dt.timedelta(days=7)
    first = dt.datetime(2026, 1, 5, 9, 0, tzinfo=dt.UTC)
    with notifying({"on_failure": ["webhook"]}, RECONCILE=RECONCILE):
        job, job_id = make_job("standard", "skip", catch_up="latest")
        decision = dispatch.Decision(job_id=job_id, expected_next_run_at=None, next_run_at=first + 2 * week,
                                   run=[first + week], missed=[first], tz=dt.UTC)
        _, published, _ = dispatch.dispatch_many([decision])
        (late,) = published
        claim = claims.begin(job=job, job_id=job_id, slot=late.slot, execution_date=late.slot.date(),
                             trigger=Trigger.CATCH_UP, execution_id=late.execution_id, lease_seconds=60)
        assert claim.fence is not None
        assert finishes.finish(job_id=job_id, execution_id=late.execution_id, fence=claim.fence, status="SUCCEEDED")
        with connection.cursor() as cursor:  # the run ended a moment before the MISSED slot was recorded
            cursor.execute(f"UPDATE {executions.JOB} SET last_run_at = now() - interval '1 second' WHERE id = %s",
                           [job_id])
        assert outcomes.missed(repairs.newest_missed([job_id])) == 1
        decision = dispatch.Decision(job_id=job_id, expected_next_run_at=first + 2 * week,
                                   next_run_at=first + 3 * week, run=[], missed=[first + 2 * week], tz=dt.UTC)
        dispatch.dispatch_many([decision])
        assert outcomes.missed(repairs.newest_missed([job_id])) == 1
    assert list(Alert.objects.filter(job_id=job_id).order_by("id").values_list("event", flat=True)) == [
        "MISSED", "MISSED"]
