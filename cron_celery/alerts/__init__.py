"""Alerts that fire once per incident, and always: the outbox and its delivery.

``record`` runs in the transaction that writes an execution's final status: it decides
the event (FAILED, TIMED_OUT, LOST, MISSED, RECOVERED, SUCCEEDED) by the job's alert policy
and writes one ``Alert`` row per channel (``UNIQUE(execution, event, channel)``; the final
LOST of an execution whose lost attempt already alerted re-arms that row). Once that
transaction commits, the ``cron_celery.deliver_alert`` task sends each row, with retries
and exponential backoff; the reconciler sends again what is still PENDING. Retries never
alert; a delivery never raises into the job, and holds no transaction or lock while it
sends (``deliver``: claim, send, settle).

Policy per job: the first alert of an incident goes out at the ``alert_after``-th failure
in a row; later failures of the same incident are quiet unless ``alert_repeat`` seconds
passed since the last alert; the first success after an alerted incident sends RECOVERED. Successes
faster than ``min_runtime`` make incidents of their own, alerted TOO_FAST by the same two numbers and
ended by TOO_FAST_RECOVERED (``too_fast_incidents``).

A job declared with ``after=`` and ``alert_on_upstream=True`` also hears, on its failure channels
(event UPSTREAM), of each of its slots skipped because an upstream failed (FAILED, TIMED_OUT,
LOST, through a chain too): once per skipped execution, in the transaction of the upstream's
final write, which wrote the skip. Its own incident is left alone: it did not fail. A revoked
upstream (stopped on purpose), a skipped one and a MISSED slot (the scheduler was down: the
upstream alerts once per outage) do not alert it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
import json
import logging
from typing import Any

from celery import shared_task
from django.db import connection, transaction
from django.utils.module_loading import import_string

from cron_celery import conf, enums, exceptions, models
from cron_celery.alerts import timing_texts, too_fast_incidents
from cron_celery.decisions import timing
from cron_celery.declaring import params, registry
from cron_celery.notifiers import sentry as notifiers_sentry
from cron_celery.notifiers.base import Channel, Message, delivery_id
from cron_celery.run import events

logger = logging.getLogger(__name__)
S = enums.Status
E = enums.Event
JOB = models.CronJob._meta.db_table
EXE = models.CronExecution._meta.db_table
ALERT = models.Alert._meta.db_table

BUILT_IN = {
    "email": "cron_celery.notifiers.email.EmailChannel",
    "slack": "cron_celery.notifiers.http.SlackChannel",
    "telegram": "cron_celery.notifiers.http.TelegramChannel",
    "webhook": "cron_celery.notifiers.http.WebhookChannel",
    "sentry": "cron_celery.notifiers.sentry.SentryChannel",
}
#: Which ``NOTIFICATIONS`` list names the channels of each event.
KIND = {E.FAILED: "on_failure", E.TIMED_OUT: "on_failure", E.LOST: "on_failure", E.MISSED: "on_failure",
        E.RECOVERED: "on_recovery", E.SUCCEEDED: "on_success", E.UPSTREAM: "on_failure", E.LATE: "on_failure",
        E.LONG_RUNNING: "on_failure", E.TOO_FAST: "on_failure", E.TOO_FAST_RECOVERED: "on_recovery"}
#: The upstream outcomes whose skip of a downstream slot alerts a job declared with
#: ``alert_on_upstream=True`` (event UPSTREAM): the failures.
UPSTREAM_FAILURES = frozenset({S.FAILED, S.TIMED_OUT, S.LOST})


def channel_names(job: registry.Job | None, event: str) -> tuple[str, ...]:
    """The channels that hear of ``event`` for this job (its ``notify=``, else the settings)."""
    kind = KIND[enums.Event(event)]
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
    if "sentry" in names and not notifiers_sentry.active():
        names = tuple(name for name in names if name != "sentry")
    return names


#: The final LOST of an execution whose lost attempt already alerted LOST on a channel: the
#: same row goes back to PENDING and is sent again (delivery reads the execution, so it says
#: the execution is now finally LOST). Resetting ``updated_at`` voids a delivery in flight,
#: whose result then records nothing. Other events never meet an earlier row of their own.
_REARM_LOST = (
    "DO UPDATE SET status = 'PENDING', attempts = 0, last_error = '', sent_at = NULL, updated_at = now()"
    f" WHERE {ALERT}.event = 'LOST'"
)


def record(*, job: registry.Job | None, job_id: int, execution_id: int, status: str, counted: bool,
           lost_attempt: bool = False) -> Recorded:
    """Write the alert rows for this final outcome; call it inside the transaction that
    writes it. ``counted``: whether that write already updated the job's failure count
    (``repairs.end_dead_attempts``, ``close_unstarted``) or is still to come (``finish``).

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
            events = [enums.Event(status)] if (first or repeat_due) else []
        elif status == S.MISSED:
            # One alert per job and outage: an outage is the run of MISSED slots after the job's newest
            # slot that started, however many passes record them. Decided by slots, not by when rows
            # were written (a catch-up run may end before the MISSED slots it follows are recorded).
            cursor.execute(
                f"""
                SELECT NOT EXISTS (
                    SELECT 1 FROM {ALERT} AS a JOIN {EXE} AS e ON e.id = a.execution_id
                    WHERE a.job_id = %(job)s AND a.event = 'MISSED' AND e.id <> %(me)s
                      AND e.slot > coalesce((SELECT max(slot) FROM {EXE}
                                             WHERE job_id = %(job)s AND started IS NOT NULL), '-infinity'))
                """,
                {"job": job_id, "me": execution_id},
            )
            found = cursor.fetchone()
            recovered, events = False, [E.MISSED] if found is not None and found[0] else []
        else:
            recovered, events = False, []
        rows = [(event, name) for event in events for name in wanted.get(event, ())]
        if not rows:
            return Recorded(events=(), alert_ids=(), recovered=recovered)
        # A lost attempt alerts LOST once per execution (a second lost attempt writes nothing);
        # the final LOST of that execution finds that row and sends it again, re-armed.
        on_conflict = "DO NOTHING" if lost_attempt else _REARM_LOST
        cursor.execute(
            f"""
            INSERT INTO {ALERT} (execution_id, job_id, event, channel, status, attempts, last_error)
            SELECT %s, %s, r.event, r.channel, 'PENDING', 0, ''
            FROM unnest(%s::text[], %s::text[]) AS r(event, channel)
            ON CONFLICT (execution_id, event, channel) {on_conflict}
            RETURNING id
            """,
            [execution_id, job_id, [event for event, _ in rows], [name for _, name in rows]],
        )
        ids = tuple(int(found[0]) for found in cursor.fetchall())
        if failing and not lost_attempt and ids:  # the incident is alerted only if an alert was written
            cursor.execute(f"UPDATE {JOB} SET alerted_at = now() WHERE id = %s", [job_id])
    alerted = tuple(dict.fromkeys(event for event, _ in rows)) if ids else ()
    if ids:
        transaction.on_commit(lambda: send_soon(ids))
    return Recorded(events=alerted, alert_ids=ids, recovered=recovered)


def timed(ended: events.Ended) -> bool:
    """A success of a job with ``min_runtime``, written by the worker that timed its body."""
    return (ended.status == S.SUCCEEDED and ended.job is not None and ended.job.min_runtime is not None
            and ended.runtime is not None)


def too_fast(ended: events.Ended) -> bool:
    """A success whose body took less than its job's ``min_runtime`` (a job that silently did nothing)."""
    return (ended.status == S.SUCCEEDED and ended.job is not None and ended.job.min_runtime is not None
            and ended.runtime is not None and ended.runtime < ended.job.min_runtime)


def _record_too_fast(ended: events.Ended) -> None:
    """TOO_FAST once per incident (``alert_after``, ``alert_repeat``), and its recovery: ``too_fast_incidents``."""
    decided = too_fast_incidents.decide(ended.job_id, fast=too_fast(ended),
                                        alerting=bool(_deliverable(ended.job, E.TOO_FAST)))
    names = list(_deliverable(ended.job, decided)) if decided is not None else []
    _write([ended.execution_id] * len(names), [ended.job_id] * len(names), str(decided), names,
           [{"runtime": ended.runtime}] * len(names))


def _write(execution_ids: list[int], job_ids: list[int], event: str, channels: list[str],
           facts: list[dict[str, Any]] | None = None) -> tuple[int, ...]:
    """Alert rows of one event, (execution, job, channel) each, with what each was decided on
    (``facts``); those written before are left alone."""
    if not channels:
        return ()
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {ALERT} (execution_id, job_id, event, channel, status, attempts, last_error, facts)
            SELECT r.execution_id, r.job_id, %s, r.channel, 'PENDING', 0, '', r.facts::jsonb
            FROM unnest(%s::bigint[], %s::bigint[], %s::text[], %s::text[]) AS r(execution_id, job_id, channel, facts)
            ON CONFLICT (execution_id, event, channel) DO NOTHING
            RETURNING id
            """,
            [event, execution_ids, job_ids, channels,
             [json.dumps(item) for item in facts] if facts is not None else ["{}"] * len(channels)],
        )
        ids = tuple(int(found[0]) for found in cursor.fetchall())
    if ids:
        transaction.on_commit(lambda: send_soon(ids))
    return ids


def record_timing(flagged: list[timing.Flagged], event: str) -> tuple[int, ...]:
    """The LATE or LONG_RUNNING alert rows of executions the reconciler just marked: one per failure
    channel of each job, with when it was due (or its attempt started) and when it was found so. Call
    it in the transaction of the mark (``timing``), so a pass killed between the two writes leaves
    neither."""
    key = "due" if event == E.LATE else "started"
    rows = [(found.execution_id, found.job_id, name, {key: found.since.isoformat(), "found": found.found.isoformat()})
            for found in flagged for name in _deliverable(registry.by_task_name(found.task_name), event)]
    return _write([row[0] for row in rows], [row[1] for row in rows], event, [row[2] for row in rows],
                  [row[3] for row in rows])


def upstream_failed(ended: events.Ended) -> bool:
    """A downstream slot skipped because an upstream failed, of a job that wants to hear of it."""
    return (ended.status == S.SKIPPED and ended.error_code == enums.SkipReason.UPSTREAM
            and ended.upstream_status in UPSTREAM_FAILURES and ended.job is not None
            and ended.job.alert_on_upstream)


def record_upstream(*, job: registry.Job | None, job_id: int, execution_id: int) -> Recorded:
    """Write the UPSTREAM alert rows of a downstream execution skipped because an upstream failed:
    one per failure channel of the job, once per execution; call it inside the transaction that
    wrote the skip (the upstream's final write)."""
    names = list(_deliverable(job, E.UPSTREAM))
    ids = _write([execution_id] * len(names), [job_id] * len(names), E.UPSTREAM, names)
    return Recorded(events=(E.UPSTREAM,) if ids else (), alert_ids=ids, recovered=False)


def wanted_for(job: registry.Job | None, status: str) -> bool:
    """Whether ``record`` can have anything to write for this outcome (saves a transaction)."""
    if status == S.SUCCEEDED:
        return bool(_deliverable(job, E.RECOVERED) or _deliverable(job, E.SUCCEEDED))
    if status in (S.FAILED, S.TIMED_OUT, S.LOST, S.MISSED):
        return bool(_deliverable(job, status))
    return False


class Outbox(events.Listener):
    """The alert outbox as a listener: its rows commit with the outcome they are about."""

    name = "alerts"

    def records(self, ended: events.Ended) -> bool:
        if upstream_failed(ended):
            return bool(_deliverable(ended.job, E.UPSTREAM))
        return wanted_for(ended.job, ended.status) or timed(ended)

    def record(self, ended: events.Ended) -> None:
        if upstream_failed(ended):
            record_upstream(job=ended.job, job_id=ended.job_id, execution_id=ended.execution_id)
            return
        if timed(ended):
            _record_too_fast(ended)
        record(job=ended.job, job_id=ended.job_id, execution_id=ended.execution_id, status=ended.status,
               counted=ended.counted, lost_attempt=ended.lost_attempt)


OUTBOX = Outbox()


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


# --- schedule problems: an admin edit that cannot drive a job ---------------------------------
#
# Nothing ran and no slot was missed — the job stays on its previous schedule, or paused — so
# no execution stands behind this alert and it has no outbox row. The problem itself is
# stored on the job (``CronJob.schedule_problem``, shown in the dashboard, cleared by a usable
# edit); this tells the job's failure channels once per new reason, through a task with
# retries like ``deliver_alert``. If the broker is down at that moment the alert is logged
# as not sent; the dashboard and the beat's log still say it.

#: The ``event`` of these alerts, and their ``error_code``.
SCHEDULE_EVENT, SCHEDULE_NOT_APPLIED = "SCHEDULE", "SCHEDULE_NOT_APPLIED"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScheduleMessage(Message):
    """A job's schedule edit that was not applied: no slot, no execution; ``slot`` is when
    it was found, ``status`` what the job does meanwhile, ``error`` the reason."""

    @property
    def title(self) -> str:
        return f"[cron] {self.job} ({self.code}): schedule edit not applied"

    @property
    def failing(self) -> bool:
        return True

    def facts(self) -> list[tuple[str, str]]:
        return [("Job", f"{self.job} ({self.code})"), ("Meanwhile", self.status),
                ("Found", self.slot.strftime("%Y-%m-%d %H:%M:%S UTC")), ("Error code", self.error_code)]

    def as_dict(self) -> dict[str, Any]:
        return {**super().as_dict(), "slot": None, "execution_date": None, "execution_id": None,
                "run_number": None, "attempt": None, "trigger": None, "found_at": self.slot.isoformat()}


def schedule_problem(job: registry.Job | None, *, code: str, name: str, problem: str, state: str) -> int:
    """Queue the alert that a job's schedule edit cannot drive it, one task per failure
    channel of the job; returns how many were queued."""
    found = dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()
    queued = 0
    for channel_name in _deliverable(job, E.FAILED):
        try:
            deliver_schedule_problem.apply_async((code, name, channel_name, problem, state, found),
                                                 ignore_result=True)
            queued += 1
        except Exception as error:
            logger.warning("could not queue the schedule alert of cron job %s on %s (%s)", name, channel_name, error)
    return queued


def schedule_message(*, code: str, name: str, problem: str, state: str, found: dt.datetime) -> ScheduleMessage:
    base = str(conf.settings.ADMIN_BASE_URL or "").rstrip("/")
    return ScheduleMessage(
        event=SCHEDULE_EVENT, job=name, code=code, slot=found, execution_date=found.date(), execution_id=0,
        run_number=0, attempt=0, status=state, trigger="", duration=None, error_code=SCHEDULE_NOT_APPLIED,
        error=problem, traceback="", admin_url=f"{base}/admin/cron_celery/cronjob/?q={code}" if base else "",
    )


@shared_task(name="cron_celery.deliver_schedule_problem", bind=True, max_retries=None, ignore_result=True)
def deliver_schedule_problem(self: Any, code: str, name: str, channel_name: str, problem: str, state: str,
                             found: str) -> str:
    """Send one schedule alert; a failed attempt is retried with the backoff of
    ``deliver_alert`` until ``NOTIFICATIONS["max_attempts"]``."""
    settings = conf.settings.NOTIFICATIONS
    message = schedule_message(code=code, name=name, problem=problem, state=state,
                               found=dt.datetime.fromisoformat(found))
    target: Channel | None = None
    try:
        target = channel(channel_name)
        target.send(message, float(settings.get("timeout", 10)))
    except Exception as failure:  # a channel must never break the worker
        text = f"{type(failure).__name__}: {failure}"
        text = target.redact(text) if target is not None else text
        attempt = self.request.retries + 1
        if attempt >= int(settings.get("max_attempts", 5)):
            logger.error("schedule alert of cron job %s on %s, attempt %d, given up: %s", name, channel_name,
                         attempt, text)
            return "FAILED"
        logger.warning("schedule alert of cron job %s on %s, attempt %d: %s", name, channel_name, attempt, text)
        raise self.retry(countdown=min(300, 2 ** attempt), exc=exceptions.DeliveryFailed(text)) from None
    return "SENT"
