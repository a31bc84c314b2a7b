"""Alerts that fire once per incident, and always: the outbox and its delivery.

``record`` runs in the transaction that writes an execution's final status: it decides
the event (FAILED, TIMED_OUT, LOST, MISSED, RECOVERED, SUCCEEDED) by the job's alert policy
and writes one ``Alert`` row per channel (``UNIQUE(execution, event, channel)``). Once that
transaction commits, the ``cron_celery.deliver_alert`` task sends each row, with retries
and exponential backoff; the reconciler sends again what is still PENDING. Retries never
alert; a delivery never raises into the job.

Policy per job: the first alert of an incident goes out at the ``alert_after``-th failure
in a row; later failures of the same incident are quiet unless ``alert_repeat`` seconds
passed since the last alert; the first success after an alerted incident sends RECOVERED.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any

from celery import shared_task
from django.db import connection, transaction
from django.utils.module_loading import import_string

from cron_celery import conf, exceptions, models, registry
from cron_celery.notifiers.base import Channel, Message

logger = logging.getLogger(__name__)
S = models.Status
E = models.Event
JOB = models.CronJob._meta.db_table
EXE = models.CronExecution._meta.db_table
ALERT = models.Alert._meta.db_table

BUILT_IN = {
    "email": "cron_celery.notifiers.email.EmailChannel",
    "slack": "cron_celery.notifiers.http.SlackChannel",
    "telegram": "cron_celery.notifiers.http.TelegramChannel",
    "webhook": "cron_celery.notifiers.http.WebhookChannel",
    "sentry": "cron_celery.sentry.SentryChannel",
}
#: Which ``NOTIFICATIONS`` list names the channels of each event.
KIND = {E.FAILED: "on_failure", E.TIMED_OUT: "on_failure", E.LOST: "on_failure", E.MISSED: "on_failure",
        E.RECOVERED: "on_recovery", E.SUCCEEDED: "on_success"}


def channel_names(job: registry.Job | None, event: str) -> tuple[str, ...]:
    """The channels that hear of ``event`` for this job (its ``notify=``, else the settings)."""
    kind = KIND[models.Event(event)]
    own = job.notify_for(kind) if job is not None else None
    names = own if own is not None else conf.settings.NOTIFICATIONS.get(kind) or ()
    return tuple(dict.fromkeys(str(name) for name in names))


def channel(name: str) -> Channel:
    """The channel called ``name``: built in, defined under ``NOTIFICATIONS["channels"]``
    (``{"pager": {"class": "myproj.alerts.Pager", ...options}}``) or a dotted path."""
    return _channel(name, repr(conf.settings.NOTIFICATIONS))


@functools.lru_cache(maxsize=64)
def _channel(name: str, _settings_key: str) -> Channel:
    settings = conf.settings.NOTIFICATIONS
    defined = (settings.get("channels") or {}).get(name)
    if isinstance(defined, dict):
        path, options = str(defined.get("class", "")), {k: v for k, v in defined.items() if k != "class"}
    elif name in BUILT_IN:
        path, options = BUILT_IN[name], settings.get(name) or {}
    elif "." in name:
        path, options = name, settings.get(name) or {}
    else:
        raise exceptions.UnknownChannel(name=name)
    try:
        cls = import_string(path)
    except ImportError as error:
        raise exceptions.UnknownChannel(f"({error})", name=name) from None
    if not (isinstance(cls, type) and issubclass(cls, Channel)):
        raise exceptions.UnknownChannel(f"({path} is not a cron_celery.notifiers.base.Channel)", name=name)
    return cls(name, dict(options) if isinstance(options, dict) else {})


@dataclasses.dataclass(frozen=True, kw_only=True)
class Recorded:
    """What ``record`` decided for one final outcome."""

    events: tuple[str, ...]  # events alerted (may be empty)
    alert_ids: tuple[int, ...]
    recovered: bool  # the first success after failures (alerted or not)


NOTHING = Recorded(events=(), alert_ids=(), recovered=False)


def _deliverable(job: registry.Job | None, event: str) -> tuple[str, ...]:
    names = channel_names(job, event)
    if "sentry" in names:
        from cron_celery import sentry

        if not sentry.active():
            names = tuple(name for name in names if name != "sentry")
    return names


def record(*, job: registry.Job | None, job_id: int, execution_id: int, status: str, counted: bool,
           lost_attempt: bool = False) -> Recorded:
    """Write the alert rows for this final outcome; call it inside the transaction that
    writes it. ``counted``: whether that write already updated the job's failure count
    (``claims.end_dead_attempts``, ``close_unstarted``) or is still to come (``finish``).

    ``lost_attempt``: an attempt whose worker died, retried (not final). A dead worker is
    an incident of its own (out of memory, a killed node): it alerts LOST at once, once per
    execution, without opening the job's failure incident.
    """
    failing = status in (S.FAILED, S.TIMED_OUT, S.LOST)
    wanted: dict[str, tuple[str, ...]] = {}
    if status == S.SUCCEEDED:
        wanted = {E.RECOVERED: _deliverable(job, E.RECOVERED), E.SUCCEEDED: _deliverable(job, E.SUCCEEDED)}
    elif failing or status == S.MISSED:
        wanted = {status: _deliverable(job, status)}
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT consecutive_failures, alert_after, alert_repeat, alerted_at, alerted_at IS NOT NULL"
            f" AND alert_repeat IS NOT NULL AND alerted_at <= now() - make_interval(secs => alert_repeat)"
            f" FROM {JOB} WHERE id = %s FOR UPDATE",
            [job_id],
        )
        row = cursor.fetchone()
        if row is None:
            return NOTHING
        failures, after, _repeat, alerted_at, repeat_due = row
        if status == S.SUCCEEDED:
            recovered = failures > 0 and not counted
            events = [E.SUCCEEDED]
            if alerted_at is not None:
                events.insert(0, E.RECOVERED)
                cursor.execute(f"UPDATE {JOB} SET alerted_at = NULL WHERE id = %s", [job_id])
        elif lost_attempt:
            recovered, events = False, [E.LOST]
        elif failing:
            recovered = False
            in_a_row = failures if counted else failures + 1
            first = alerted_at is None and in_a_row >= after
            events = [models.Event(status)] if (first or repeat_due) else []
        else:
            recovered, events = False, [E.MISSED] if status == S.MISSED else []
        rows = [(event, name) for event in events for name in wanted.get(event, ())]
        if not rows:
            return Recorded(events=(), alert_ids=(), recovered=recovered)
        cursor.execute(
            f"""
            INSERT INTO {ALERT} (execution_id, job_id, event, channel, status, attempts, last_error)
            SELECT %s, %s, r.event, r.channel, 'PENDING', 0, ''
            FROM unnest(%s::text[], %s::text[]) AS r(event, channel)
            ON CONFLICT (execution_id, event, channel) DO NOTHING
            RETURNING id
            """,
            [execution_id, job_id, [event for event, _ in rows], [name for _, name in rows]],
        )
        ids = tuple(int(found[0]) for found in cursor.fetchall())
        if failing and not lost_attempt:
            cursor.execute(f"UPDATE {JOB} SET alerted_at = now() WHERE id = %s", [job_id])
    alerted = tuple(dict.fromkeys(event for event, _ in rows))
    if ids:
        transaction.on_commit(lambda: send_soon(ids))
    return Recorded(events=alerted, alert_ids=ids, recovered=recovered)


def wanted_for(job: registry.Job | None, status: str) -> bool:
    """Whether ``record`` can have anything to write for this outcome (saves a transaction)."""
    if status == S.SUCCEEDED:
        return bool(_deliverable(job, E.RECOVERED) or _deliverable(job, E.SUCCEEDED))
    if status in (S.FAILED, S.TIMED_OUT, S.LOST, S.MISSED):
        return bool(_deliverable(job, status))
    return False


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
    return Message(
        event=alert.event, job=execution.task_name, code=execution.task_code, slot=execution.slot,
        execution_date=execution.execution_date, execution_id=execution.id, run_number=execution.run_number,
        attempt=execution.retry_count + 1, status=execution.status, trigger=execution.trigger,
        duration=duration.total_seconds() if duration is not None else None, error_code=execution.error_code,
        error=execution.message, traceback=execution.traceback,
        admin_url=f"{base}/admin/cron_celery/cronexecution/{execution.id}/change/" if base else "",
    )


def deliver(alert_id: int) -> str:
    """Send one PENDING alert; returns its new status. Raises ``DeliveryFailed`` when this
    attempt failed and another may follow (the task retries it)."""
    settings = conf.settings.NOTIFICATIONS
    timeout = float(settings.get("timeout", 10))
    limit = int(settings.get("max_attempts", 5))
    with transaction.atomic():
        alert = (models.Alert.objects.select_for_update(skip_locked=True, of=("self",))
                 .select_related("execution").filter(id=alert_id, status=models.AlertStatus.PENDING).first())
        if alert is None:
            return "GONE"  # sent already, given up, or being sent by another worker now
        error = ""
        target: Channel | None = None
        try:
            target = channel(alert.channel)
            target.send(message_for(alert), timeout)
        except Exception as problem:  # a channel must never break the worker
            text = f"{type(problem).__name__}: {problem}"
            error = target.redact(text) if target is not None else text
        alert.attempts += 1
        if not error:
            alert.status, alert.last_error = models.AlertStatus.SENT, ""
        else:
            alert.last_error = error[:2000]
            if alert.attempts >= limit:
                alert.status = models.AlertStatus.FAILED
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {ALERT} SET status = %s, attempts = %s, last_error = %s, updated_at = now(),"
                f" sent_at = CASE WHEN %s = 'SENT' THEN now() END WHERE id = %s",
                [alert.status, alert.attempts, alert.last_error, alert.status, alert.id],
            )
    if error:
        log = logger.error if alert.status == models.AlertStatus.FAILED else logger.warning
        log("alert %s (%s on %s), attempt %d: %s", alert.id, alert.event, alert.channel, alert.attempts, error)
        if alert.status == models.AlertStatus.PENDING:
            raise exceptions.DeliveryAttemptFailed(error, alert=alert.id, attempt=alert.attempts)
    return str(alert.status)


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
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id FROM {ALERT} WHERE status = 'PENDING' AND updated_at < now() - make_interval(secs => %s)"
            f" ORDER BY updated_at LIMIT %s",
            [grace, batch],
        )
        ids = [int(row[0]) for row in cursor.fetchall()]
        if ids:
            cursor.execute(f"UPDATE {ALERT} SET updated_at = now() WHERE id = ANY(%s)", [ids])
    send_soon(ids)
    return len(ids)


def problems() -> list[str]:
    """Configuration problems, one sentence each (for the system checks)."""
    settings = conf.settings.NOTIFICATIONS
    found: list[str] = []
    names: set[str] = set()
    for kind in ("on_failure", "on_recovery", "on_success"):
        value = settings.get(kind) or []
        if isinstance(value, str) or not isinstance(value, list | tuple):
            found.append(f"NOTIFICATIONS[{kind!r}] must be a list of channel names, not {value!r}.")
            continue
        names.update(str(name) for name in value)
    for job in registry.all_jobs():
        for _kind, listed in job.notify or ():
            names.update(listed)
    for name in sorted(names):
        try:
            target = channel(name)
        except exceptions.UnknownChannel as error:
            found.append(str(error))
            continue
        found += [f"Channel {name!r}: {problem}." for problem in target.problems()]
    return found
