"""Claims decided in one round trip: a run that nothing stands in the way of.

``claims.begin`` tries these first. Two statements go as one query, so they are one implicit
transaction with one commit:

1. the job's row is locked, and its next fence taken, as the full claim does;
2. the run is claimed, with a snapshot taken once the lock is held (every claim of the job holds
   it until it commits, so this one sees them all), only when that snapshot leaves no doubt:

   - the job is not paused;
   - with the slot check (patterns ``standard`` and ``rerun_on_failure``), the slot has no other
     execution of its regular run but skipped or missed ones;
   - for an exclusive job (overlap ``skip``), the job has no ``RUNNING`` execution at all, live or
     stale, and none that waits for its room (an older one goes first: the full claim decides);
   - for a message's own execution (``pending``), its row is ``PENDING``, not forced, not a re-run
     and not a run with a person's parameters.

A new run with no check at all (pattern ``always`` with overlap ``allow``, or a forced, re-run or
parameterised run of an overlap-``allow`` job) is one statement instead: its lock and its insert,
as nothing a snapshot taken before the lock could miss matters to it — but the history its run is
told (``previous``), read with that snapshot, leaves out a run of the job that ended while this
claim waited for the lock (such runs overlap anyway: the job allows it).

Anything else claims nothing (the fence taken is simply not used) and returns None: the caller
takes the full path, which reads the same state under the lock and decides (a skip, a wait, a
takeover, a superseded run). A connection with ``"server_side_binding": True`` cannot send two
statements as one query; there the full path decides every run that has a check.

A claim this query declines costs its round trip and its commit (the fence bump) on top of the full
claim's: retries, takeovers, forced and parameterised rows, a paused job, and every skip or wait.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import connection

from cron_celery.decisions import executions, previous, statements

JOB = executions.JOB
EXE = executions.EXE

#: The first statement: the job's row locked and its next fence taken.
_LOCK = statements.statement("claim_lock", f"UPDATE {JOB} SET fence = fence + 1 WHERE id = %(job)s",
                             {"job": "bigint"})

#: Nothing stands in the way: the job (``j``) is not paused; no other execution of the slot's regular
#: run but skipped or missed ones (with the slot check); no RUNNING one of the job, nor one waiting (exclusive).
#: ``%(me)s`` is the execution claimed (0 for a new one).
_CLEAR = f"""j.id = %(job)s AND NOT j.paused AND NOT EXISTS (
        SELECT 1 FROM {EXE} AS other WHERE other.job_id = %(job)s AND other.id <> %(me)s AND (
            (%(slot_checked)s AND other.slot = %(slot)s AND NOT other.params_given
             AND other.status NOT IN ('SKIPPED', 'MISSED'))
            OR (%(exclusive)s AND (other.status = 'RUNNING' OR (
                other.waiting_since IS NOT NULL AND other.status IN ('PENDING', 'RETRYING'))))))"""

_CHECK_TYPES = {"slot_checked": "boolean", "exclusive": "boolean", "me": "bigint"}

_NEW_TYPES = {"job": "bigint", "code": "text", "name": "text", "slot": "timestamptz", "date": "date",
              "trigger": "text", "forced": "boolean", "task_id": "text", "worker": "text", "pid": "integer",
              "lease": "float8", "given": "text", "params_given": "boolean", **_CHECK_TYPES}

#: A new execution inserted RUNNING (the next run number of its slot), from the job's row ``j``.
_INSERT = f"""
    INSERT INTO {EXE} AS claimed ({executions.INSERT_COLUMNS}, params, params_given)
    SELECT %(job)s, %(code)s, %(name)s, %(slot)s, %(date)s,
        coalesce((SELECT max(run_number) FROM {EXE}
                  WHERE job_id = %(job)s AND slot = %(slot)s), 0) + 1,
        'RUNNING', %(trigger)s, '', %(forced)s, now(), clock_timestamp(), NULL, false, NULL,
        '', '', '', 0, %(task_id)s, %(worker)s, %(pid)s, j.fence,
        now() + make_interval(secs => %(lease)s), '[]'::jsonb,
        nullif(coalesce(j.params, '{{}}'::jsonb) || coalesce(%(given)s::jsonb, '{{}}'::jsonb), '{{}}'::jsonb),
        %(params_given)s"""
#: What a claim returns: the row, and what its run is told of the job's history (``previous``).
_INSERTED = (f"ON CONFLICT (job_id, slot, run_number) DO NOTHING RETURNING claimed.id, claimed.run_number, "
             f"claimed.fence, claimed.params, {previous.of_row('claimed')}")

#: A new execution, after ``_LOCK``, when nothing stands in the way.
_NEW = statements.statement("claim", f"{_INSERT} FROM {JOB} AS j WHERE {_CLEAR} {_INSERTED}", _NEW_TYPES)

#: A new execution with no check (see the module's docstring): the lock and the insert in one
#: statement, as nothing its snapshot could miss matters to it.
_NEW_UNCHECKED = statements.statement("claim", f"""
    WITH j AS (UPDATE {JOB} SET fence = fence + 1 WHERE id = %(job)s AND NOT paused RETURNING fence, params)
    {_INSERT} FROM j {_INSERTED}""", {key: kind for key, kind in _NEW_TYPES.items() if key not in _CHECK_TYPES})

#: The message's own PENDING execution (the beat's, an enqueued run's), claimed RUNNING.
_PENDING = statements.statement("claim_pending", f"""
    UPDATE {EXE} AS e SET status = 'RUNNING', fence = j.fence,
        lease_until = now() + make_interval(secs => %(lease)s),
        started = coalesce(e.started, clock_timestamp()), ended = NULL, waiting_since = NULL,
        worker = %(worker)s, pid = %(pid)s,
        celery_task_id = coalesce(nullif(%(task_id)s, ''), e.celery_task_id)
    FROM {JOB} AS j
    WHERE e.id = %(me)s AND e.job_id = %(job)s AND e.slot = %(slot)s AND e.status = 'PENDING'
      AND NOT e.force AND NOT e.forced AND NOT e.params_given AND {_CLEAR}
    RETURNING e.id, e.run_number, j.fence, e.params, {previous.of_row('e')}
    """, {"job": "bigint", "slot": "timestamptz", "lease": "float8", "worker": "text", "pid": "integer",
          "task_id": "text", **_CHECK_TYPES})

#: (execution id, run number, fence, parameter values, the previous run, the last success).
Claimed = tuple[int, int, int, dict[str, Any] | None, previous.PreviousRun | None, previous.PreviousRun | None]


def new(*, job_id: int, code: str, name: str, slot: dt.datetime, execution_date: dt.date, trigger: str,
        forced: bool, celery_task_id: str, worker: str, pid: int | None, lease_seconds: int,
        given: dict[str, Any] | None, params_given: bool, slot_checked: bool, exclusive: bool) -> Claimed | None:
    """A new RUNNING execution (``Claimed``), or None (the full path
    decides: the job is paused or gone, something stands in the way, or another claim took the run
    number first)."""
    values: dict[str, Any] = {
        "job": job_id, "code": code, "name": name, "slot": slot, "date": execution_date, "trigger": trigger,
        "forced": forced, "task_id": celery_task_id, "worker": worker, "pid": pid, "lease": lease_seconds,
        "given": executions.as_jsonb(given), "params_given": params_given}
    if not (slot_checked or exclusive):
        return _claim(None, _NEW_UNCHECKED, values)
    return _claim(_LOCK, _NEW, {**values, "slot_checked": slot_checked, "exclusive": exclusive, "me": 0})


def pending(*, job_id: int, execution_id: int, slot: dt.datetime, celery_task_id: str, worker: str,
            pid: int | None, lease_seconds: int, slot_checked: bool, exclusive: bool) -> Claimed | None:
    """The message's PENDING execution claimed RUNNING (``Claimed``), or None (the full path decides)."""
    return _claim(_LOCK, _PENDING, {
        "job": job_id, "slot": slot, "lease": lease_seconds, "worker": worker, "pid": pid,
        "task_id": celery_task_id, "slot_checked": slot_checked, "exclusive": exclusive, "me": execution_id})


def _claim(lock: statements.Statement | None, claim: statements.Statement, values: dict[str, Any]) -> Claimed | None:
    if lock is not None and not statements.together_possible():
        return None
    with connection.cursor() as cursor:
        statements.execute_together(cursor, (claim,) if lock is None else (lock, claim), values)
        row = cursor.fetchone()
    if row is None:
        return None
    return (int(row[0]), int(row[1]), int(row[2]), executions.loaded(row[3]), previous.loaded(row[4]),
            previous.loaded(row[5]))
