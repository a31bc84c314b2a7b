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

import dataclasses
import json
import logging
from typing import Any

from django.db import connection, transaction

from cron_celery import enums
from cron_celery.alerts import too_fast_incidents
from cron_celery.alerts.channels import ALERT, EXE, JOB, UPSTREAM_FAILURES, E, S, deliverable
from cron_celery.alerts.delivery import send_soon
from cron_celery.decisions import pauses, timing
from cron_celery.declaring import registry
from cron_celery.run import events

logger = logging.getLogger(__name__)

@dataclasses.dataclass(frozen=True, kw_only=True)
class Recorded:
    """What ``record`` decided for one final outcome."""

    events: tuple[str, ...]  # events alerted (may be empty)
    alert_ids: tuple[int, ...]
    recovered: bool  # the first success after failures (alerted or not)


NOTHING = Recorded(events=(), alert_ids=(), recovered=False)


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
        wanted = {E.RECOVERED: deliverable(job, E.RECOVERED), E.SUCCEEDED: deliverable(job, E.SUCCEEDED)}
    elif failing or status == S.MISSED:
        wanted = {status: deliverable(job, status)}
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
                                        alerting=bool(deliverable(ended.job, E.TOO_FAST)))
    names = list(deliverable(ended.job, decided)) if decided is not None else []
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
            for found in flagged for name in deliverable(registry.by_task_name(found.task_name), event)]
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
    names = list(deliverable(job, E.UPSTREAM))
    ids = _write([execution_id] * len(names), [job_id] * len(names), E.UPSTREAM, names)
    return Recorded(events=(E.UPSTREAM,) if ids else (), alert_ids=ids, recovered=False)


def wanted_for(job: registry.Job | None, status: str) -> bool:
    """Whether ``record`` can have anything to write for this outcome (saves a transaction)."""
    if status == S.SUCCEEDED:
        return bool(deliverable(job, E.RECOVERED) or deliverable(job, E.SUCCEEDED))
    if status in (S.FAILED, S.TIMED_OUT, S.LOST, S.MISSED):
        return bool(deliverable(job, status))
    return False


def pausing(ended: events.Ended) -> bool:
    """A final failure of a job declared with ``pause_after_failures``: it may pause the job."""
    return (ended.final and not ended.lost_attempt and ended.status in (S.FAILED, S.TIMED_OUT, S.LOST)
            and ended.job is not None and ended.job.pause_after_failures is not None)


def _record_pause(ended: events.Ended) -> None:
    """Pause the job if this failure makes it ``pause_after_failures`` in a row (``pauses``), and say
    so: a PAUSED alert on its failure channels, naming the failures, in the same transaction."""
    paused = pauses.after_failures(job_id=ended.job_id, execution_id=ended.execution_id, counted=ended.counted,
                                   status=ended.status, slot=ended.slot, error_code=ended.error_code)
    if paused is None:
        return
    logger.warning("cron job %s paused itself: %s", ended.job.name if ended.job else ended.job_id, paused.note)
    names = list(deliverable(ended.job, E.PAUSED))
    _write([ended.execution_id] * len(names), [ended.job_id] * len(names), E.PAUSED, names,
           [{"note": paused.note, "failures": paused.failures}] * len(names))


class Outbox(events.Listener):
    """The alert outbox as a listener: its rows commit with the outcome they are about."""

    name = "alerts"

    def records(self, ended: events.Ended) -> bool:
        if upstream_failed(ended):
            return bool(deliverable(ended.job, E.UPSTREAM))
        return wanted_for(ended.job, ended.status) or timed(ended) or pausing(ended)

    def record(self, ended: events.Ended) -> None:
        if upstream_failed(ended):
            record_upstream(job=ended.job, job_id=ended.job_id, execution_id=ended.execution_id)
            return
        if timed(ended):
            _record_too_fast(ended)
        if pausing(ended):
            _record_pause(ended)
        record(job=ended.job, job_id=ended.job_id, execution_id=ended.execution_id, status=ended.status,
               counted=ended.counted, lost_attempt=ended.lost_attempt)


OUTBOX = Outbox()


