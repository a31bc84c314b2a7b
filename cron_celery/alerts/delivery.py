"""An alert's delivery: the message it says (its execution read when it is sent), a claim of the row
so one deliverer sends it, the channel's answer settled on the row, the task with its retries, and the
reconciler's re-queue of rows left PENDING."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
from typing import Any

from celery import shared_task
from django.db import connection

from cron_celery import conf, enums, exceptions, models
from cron_celery.alerts import timing_texts
from cron_celery.alerts.channels import ALERT, E, S, channel
from cron_celery.declaring import params, registry
from cron_celery.notifiers.base import Channel, Message, delivery_id

logger = logging.getLogger(__name__)


def send_soon(alert_ids: tuple[int, ...] | list[int]) -> None:
    """Queue a delivery task per alert; if the broker is down, the reconciler sends them later."""
    for alert_id in alert_ids:
        try:
            deliver_alert.apply_async((alert_id,), ignore_result=True)
        except Exception as error:
            logger.warning("could not queue the delivery of alert %s (%s); the reconciler will", alert_id, error)


def message_for(alert: models.Alert) -> Message:
    execution = alert.execution
    duration = execution.duration
    base = str(conf.settings.ADMIN_BASE_URL or "").rstrip("/")
    status, attempt = str(execution.status), execution.retry_count + 1
    error_code, error = execution.error_code, execution.message
    if alert.event == enums.Event.LOST and execution.status != S.LOST:
        # The alert of a lost attempt, delivered while the execution goes on (retried, perhaps
        # running again) or after it ended otherwise: it describes the attempt that was lost.
        lost = [entry for entry in execution.attempts or []
                if isinstance(entry, dict) and entry.get("status") == S.LOST]
        if not execution.completed:
            status = S.RETRYING
        if lost:
            attempt = int(lost[-1].get("attempt") or attempt)
            error_code, error = str(lost[-1].get("error_code") or ""), str(lost[-1].get("message") or "")
    if alert.event == E.UPSTREAM:
        error_code, error = enums.SkipReason.UPSTREAM.value, _upstream_story(execution)
    elif alert.event == E.PAUSED:  # the note the pause wrote, naming the failures
        error_code, error = alert.event, str((alert.facts or {}).get("note") or "The job paused itself.")
        error += "\nResume it (the admin's Resume, or enable its periodic task) once it is fixed."
    elif alert.event in TIMING_EVENTS:
        error_code, error = alert.event, timing_texts.story(alert.event, execution, alert.facts)
    return Message(
        event=alert.event, job=execution.task_name, code=execution.task_code, slot=execution.slot,
        execution_date=execution.execution_date, execution_id=execution.id, run_number=execution.run_number,
        attempt=attempt, status=status, trigger=execution.trigger,
        duration=duration.total_seconds() if duration is not None else None, error_code=error_code,
        error=error, traceback=execution.traceback,
        admin_url=f"{base}/admin/cron_celery/cronexecution/{execution.id}/change/" if base else "",
        params=_params_said(execution),
        # One id per alert row; a final LOST re-arms its lost attempt's row and says something new.
        delivery_id=delivery_id(alert.id, alert.created_at.isoformat(), alert.event, alert.channel,
                                "final" if alert.event == E.LOST and execution.status == S.LOST else ""),
    )


def _params_said(execution: models.CronExecution) -> str:
    """The run's parameter values in a line, marked when a person gave them (its own execution)."""
    stored = execution.params if isinstance(execution.params, dict) else None
    with contextlib.suppress(exceptions.UnknownJob):  # as the job declares them, when it is declared here
        stored = params.ordered(registry.get(execution.task_code).parameters, stored)
    said = params.shown(stored)
    if len(said) > PARAMS_CHARS:  # a long value must not push a message past a channel's limit
        said = said[:PARAMS_CHARS] + " …"
    return f"{said} (given by hand)" if said and execution.params_given else said


#: At most this many characters of a run's parameters go into an alert.
PARAMS_CHARS = 500


#: The events of a run's timing (not of its outcome): their message says what was late or long.
TIMING_EVENTS = frozenset({E.LATE, E.LONG_RUNNING, E.TOO_FAST, E.TOO_FAST_RECOVERED})


def upstream_failure(execution: models.CronExecution, hops: int = 50) -> models.CronExecution | None:
    """The upstream execution whose end skipped this one, up through the skips of a chain; None if
    it was deleted meanwhile (retention)."""
    found = execution
    for _hop in range(hops):
        if found.upstream_execution_id is None:
            return None
        above = models.CronExecution.objects.filter(id=found.upstream_execution_id).first()
        if above is None or not (above.status == S.SKIPPED and above.skip_reason == enums.SkipReason.UPSTREAM):
            return above
        found = above
    return None


def _upstream_story(execution: models.CronExecution) -> str:
    """The skip's own message (naming the upstream execution it was skipped for), then the upstream
    failure that stopped the chain, with its error."""
    failure = upstream_failure(execution)
    if failure is None:
        return execution.message
    first_line = (failure.message.strip().splitlines() or [""])[0]
    return (f"{execution.message}\nUpstream failure: {failure.task_name} ({failure.task_code}), execution "
            f"{failure.id}, ended {failure.status}" + (f": {first_line}" if first_line else "."))


def claim_seconds(timeout: float) -> float:
    """How long a deliverer holds its claim on an alert: the channel's timeout twice, and half
    a minute more. Only a send that outlives it can be sent a second time by another worker."""
    return 2 * timeout + 30


def _claim(alert_id: int, seconds: float) -> tuple[dt.datetime, int] | None:
    """Claim a PENDING alert that nobody is sending (one statement; the database's clock, not the
    transaction's start, in case the caller holds one open): its
    ``updated_at`` moves to the end of the claim, which is the claim's token, and the attempt
    is counted. None: sent, given up, or being sent by another deliverer now."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {ALERT} SET updated_at = clock_timestamp() + make_interval(secs => %s),"
            f" attempts = attempts + 1 WHERE id = %s AND status = 'PENDING' AND updated_at <= clock_timestamp()"
            f" RETURNING updated_at, attempts",
            [seconds, alert_id],
        )
        row = cursor.fetchone()
    return (row[0], int(row[1])) if row is not None else None


def _settle(alert_id: int, token: dt.datetime, status: str, error: str) -> bool:
    """Record the result of a claimed attempt, only if the claim still stands (the row was not
    re-armed or resent meanwhile, and no other deliverer took it after the claim ran out)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {ALERT} SET status = %s, last_error = %s, updated_at = now(),"
            f" sent_at = CASE WHEN %s = 'SENT' THEN now() END"
            f" WHERE id = %s AND status = 'PENDING' AND updated_at = %s",
            [status, error, status, alert_id, token],
        )
        return bool(cursor.rowcount == 1)


def deliver(alert_id: int) -> str:
    """Send one PENDING alert; returns its new status. Raises ``DeliveryFailed`` when this
    attempt failed and another may follow (the task retries it).

    Three steps, none holding a transaction or a lock across the channel's call: claim the
    row (``_claim``), send, record the result (``_settle``). Two deliverers of one alert:
    the second finds it claimed and returns ``"GONE"``."""
    settings = conf.settings.NOTIFICATIONS
    timeout = float(settings.get("timeout", 10))
    limit = int(settings.get("max_attempts", 5))
    claimed = _claim(alert_id, claim_seconds(timeout))
    if claimed is None:
        return "GONE"  # sent already, given up, or being sent by another worker now
    token, attempts = claimed
    alert = models.Alert.objects.select_related("execution__job").filter(id=alert_id).first()
    if alert is None:
        return "GONE"  # purged with its execution meanwhile
    error = ""
    target: Channel | None = None
    try:
        target = channel(alert.channel)
        target.send(message_for(alert), timeout)
    except Exception as problem:  # a channel must never break the worker
        text = f"{type(problem).__name__}: {problem}"
        error = (target.redact(text) if target is not None else text)[:2000]
    status = enums.AlertStatus.SENT if not error else (
        enums.AlertStatus.FAILED if attempts >= limit else enums.AlertStatus.PENDING)
    if not _settle(alert_id, token, status, error):
        logger.warning("alert %s (%s on %s) was re-armed or resent while attempt %d ran; that attempt is not"
                       " recorded", alert_id, alert.event, alert.channel, attempts)
        return "GONE"
    if error:
        log = logger.error if status == enums.AlertStatus.FAILED else logger.warning
        log("alert %s (%s on %s), attempt %d: %s", alert_id, alert.event, alert.channel, attempts, error)
        if status == enums.AlertStatus.PENDING:
            raise exceptions.DeliveryAttemptFailed(error, alert=alert_id, attempt=attempts)
    return str(status)


@shared_task(name="cron_celery.deliver_alert", bind=True, max_retries=None, ignore_result=True)
def deliver_alert(self: Any, alert_id: int) -> str:
    """Deliver one alert; a failed attempt is retried with exponential backoff (2, 4, 8... s,
    at most 5 minutes) until ``NOTIFICATIONS["max_attempts"]``."""
    try:
        return deliver(alert_id)
    except exceptions.DeliveryFailed as error:
        countdown = min(300, 2 ** max(1, self.request.retries + 1))
        raise self.retry(countdown=countdown, exc=error) from None


def redeliver(grace: float, batch: int) -> int:
    """Queue again the PENDING alerts untouched for ``grace`` seconds (the reconciler)."""
    # One statement: a row a deliverer claims meanwhile (its updated_at moves ahead) is left alone.
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {ALERT} SET updated_at = now() WHERE id IN ("
            f" SELECT id FROM {ALERT} WHERE status = 'PENDING' AND updated_at < now() - make_interval(secs => %s)"
            f" ORDER BY updated_at LIMIT %s FOR UPDATE SKIP LOCKED)"
            f" AND status = 'PENDING' AND updated_at < now() - make_interval(secs => %s) RETURNING id",
            [grace, batch, grace],
        )
        ids = sorted(int(row[0]) for row in cursor.fetchall())
    send_soon(ids)
    return len(ids)
