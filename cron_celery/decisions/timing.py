"""Runs that are late to start, or running too long: found by the reconciler, each marked once.

A job may declare ``start_deadline`` (seconds) and ``max_runtime`` (seconds); both are on its row.

- **Late**: a PENDING execution the schedule asked for, not started ``start_deadline`` seconds after
  it was due (not while a pause holds it: ``waiting``). A slot the beat sends is due at its
  ``due_at`` (the slot plus the job's jitter), a one-off run at its time; a slot the beat sends
  late (after an outage: the newest slot under catch-up ``latest``) and a downstream slot (``after=``) when
  they were recorded (``created_at``) — the later of the two, in SQL ``greatest(due_at,
  created_at)``. Catch-up slots, and runs a person, a backfill or the code sent, are not watched: a
  catch-up's lateness is the beat's outage (told by the health check and Sentry's missed
  check-ins), somebody asked for the others, and both queue behind each other on purpose.
- **Running too long**: a RUNNING execution ``max_runtime`` seconds after its current attempt
  started (a retry or a takeover starts the count again), while its lease holds: a row whose lease
  ran out is a dead worker's, ended by the reconciler, not alerted. It is not stopped.

Each is marked in the statement that finds it (``late_alerted``, ``long_alerted``), so it is alerted
once however many passes see it; the caller writes the alert rows in that transaction. Like every
writer, a mark locks the job rows first (``FOR NO KEY UPDATE``, skipping a job whose row is held
this instant: the next pass takes it), then the executions: the alert rows' foreign keys lock the
job row at commit, and a job row taken after an execution would deadlock with a final write. Both
read a partial index of the executions not started (or running) and not marked yet, so a pass costs
what is in flight, not what the history holds. Every "how late" compares with the database's clock
(``now()``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from django.db import connection

from cron_celery.decisions import executions, waiting

EXE, JOB = executions.EXE, executions.JOB

#: The triggers of the executions a start deadline watches: what the schedule asked for, on time.
WATCHED = ("BEAT", "ONE_OFF", "UPSTREAM")
#: When an execution was due, in SQL over an execution aliased ``e`` (see the module's docstring).
DUE = "greatest(e.due_at, e.created_at)"
#: When a running execution's current attempt started (a retry or a takeover opens an entry in
#: ``attempts``; a first attempt has none and started at ``started``).
ATTEMPT_STARTED = executions.attempt_started("e")
#: A running execution whose lease still holds (its worker renews it): only those are running long.
LIVE = "e.lease_until >= now()"
_WATCHED = "e.trigger IN (" + ", ".join(f"'{trigger}'" for trigger in WATCHED) + ")"
#: Not held by its job's pause (an execution ``e`` of job row ``job``).
_NOT_HELD = waiting.may_go("e", "job")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Flagged:
    """An execution found late (or running too long), marked, to be alerted."""

    execution_id: int
    job_id: int
    task_name: str
    since: dt.datetime  # when it was due (late) or started (running too long)
    found: dt.datetime  # when it was found so (the database's clock): the time it had waited or run then


def _mark(column: str, status: str, since: str, bound: str, batch: int, only: str = "true") -> list[Flagged]:
    found = (f"FROM {EXE} AS e JOIN {JOB} AS job ON job.id = e.job_id"
             f" WHERE e.status = %(status)s AND NOT e.{column} AND job.{bound} IS NOT NULL AND {only}"
             " AND job.removed_at IS NULL"  # a job removed from the code alerts nobody (``removals``)
             f" AND {since} + make_interval(secs => job.{bound}) <= now()")
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT job.id FROM {JOB} AS job
            WHERE job.id IN (SELECT e.job_id {found} ORDER BY e.id LIMIT %(batch)s)
            ORDER BY job.id FOR NO KEY UPDATE SKIP LOCKED
            """,
            {"status": status, "batch": batch},
        )
        held = [int(row[0]) for row in cursor.fetchall()]
        if not held:
            return []
        cursor.execute(
            f"""
            WITH found AS (
                SELECT e.id, {since} AS since {found} AND e.job_id = ANY(%(held)s)
                ORDER BY e.id LIMIT %(batch)s FOR UPDATE OF e SKIP LOCKED
            )
            UPDATE {EXE} AS e SET {column} = true FROM found, {JOB} AS job
            WHERE e.id = found.id AND job.id = e.job_id AND e.status = %(status)s AND NOT e.{column}
            RETURNING e.id, e.job_id, job.task, found.since, now()
            """,
            {"status": status, "batch": batch, "held": held},
        )
        rows = cursor.fetchall()
    return [Flagged(execution_id=int(row[0]), job_id=int(row[1]), task_name=str(row[2]), since=row[3], found=row[4])
            for row in rows]


def mark_late(batch: int) -> list[Flagged]:
    """PENDING executions the schedule asked for past their job's ``start_deadline``, not marked yet:
    marked, returned. Not while their job is paused (unless sent with ``--force``): the pause holds
    them on purpose (``waiting``); still waiting past the deadline once it is resumed, they are late.
    Call it in the transaction that writes their alerts."""
    return _mark("late_alerted", "PENDING", DUE, "start_deadline", batch, f"{_WATCHED} AND {_NOT_HELD}")


def mark_long_running(batch: int) -> list[Flagged]:
    """RUNNING executions past their job's ``max_runtime``, not marked yet, whose lease still holds:
    marked, returned. A lease that ran out is a dead worker's row, the reconciler's to end (LOST, or
    retried), not a long run to alert: it is left unmarked. Call it in the transaction that writes
    their alerts."""
    return _mark("long_alerted", "RUNNING", ATTEMPT_STARTED, "max_runtime", batch, LIVE)


def badges_sql(job: str) -> str:
    """SQL of a JSON pair for the dashboard: [seconds the oldest run of job ``job`` (an SQL
    expression of its row) waits past its due time, seconds the oldest live attempt has run], each
    only when past the job's bound (else null; a dead worker's run, its lease run out, is not
    running). Two probes of the ``(job, status)`` index."""
    return (
        f"json_build_array("
        f"(SELECT extract(epoch FROM now() - min({DUE})) FROM {EXE} AS e WHERE e.job_id = {job}.id"
        f" AND e.status = 'PENDING' AND {_WATCHED} AND {job}.start_deadline IS NOT NULL"
        f" HAVING min({DUE}) + make_interval(secs => {job}.start_deadline) <= now()),"
        f"(SELECT extract(epoch FROM now() - min({ATTEMPT_STARTED})) FROM {EXE} AS e WHERE e.job_id = {job}.id"
        f" AND e.status = 'RUNNING' AND {LIVE} AND {job}.max_runtime IS NOT NULL"
        f" HAVING min({ATTEMPT_STARTED}) + make_interval(secs => {job}.max_runtime) <= now()))"
    )
