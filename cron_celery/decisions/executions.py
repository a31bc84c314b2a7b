"""What every deciding module shares about execution rows: the tables, inserting a slot's
next execution, and the SQL that writes an execution's attempt history (``attempts``).

The deciding statements themselves live with their callers: the run's claim in ``claims``,
its end in ``finishes``, the beat's dispatch in ``dispatch`` and the reconciler's repairs in
``repairs``. Each statement that changes an execution's status or fence locks its job's row
first (see ``claims``), so decisions about one job are serialised and cannot deadlock.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from typing import Any

from django.db import connection

from cron_celery import enums
from cron_celery.declaring import registry
from cron_celery.models import CronExecution, CronJob

S = enums.Status
JOB = CronJob._meta.db_table
EXE = CronExecution._meta.db_table


INSERT_COLUMNS = """job_id, task_code, task_name, slot, execution_date, run_number,
    status, trigger, skip_reason, forced, created_at, started, ended, completed,
    success, message, error_code, traceback, retry_count, celery_task_id, worker,
    pid, fence, lease_until, attempts"""


def params_sql(job: str, given: str) -> str:
    """SQL for the parameter values a new execution of job ``job`` stores: ``given`` (a jsonb
    expression: a person's or a direct call's values) over the job's scheduled ones (its row's
    ``params``, the periodic task's kwargs in effect); NULL when there are none."""
    return (f"nullif(coalesce((SELECT pj.params FROM {JOB} AS pj WHERE pj.id = {job}), '{{}}'::jsonb)"
            f" || coalesce({given}, '{{}}'::jsonb), '{{}}'::jsonb)")


def as_jsonb(values: Mapping[str, Any] | None) -> str | None:
    """Values for a ``%s::jsonb`` parameter (None stays NULL)."""
    return None if values is None else json.dumps(dict(values))


def loaded(raw: object) -> dict[str, Any] | None:
    """A ``params`` column read with a raw cursor (Django hands jsonb over as its text) as a dict;
    None for NULL."""
    value = json.loads(raw) if isinstance(raw, str | bytes) else raw
    return dict(value) if isinstance(value, dict) else None


def new_attempt(number: str, fence: str) -> str:
    """SQL for a one-element JSON array: the attempt that starts now (``worker``/``pid``
    parameters by name)."""
    return (f"jsonb_build_array(jsonb_build_object('attempt', {number}, 'started', clock_timestamp(),"
            f" 'worker', %(worker)s::text, 'pid', %(pid)s::int, 'fence', {fence}))")


def closed_attempts(status: str, code: str, message: str, when: str = "true") -> str:
    """SQL for ``attempts`` with its last entry ended (when ``when`` holds): its status,
    end time, error code and the first 500 characters of its message.

    The first attempt has no entry until it ends (the hot path writes no JSON at the
    claim): its entry is then made from the row's own columns, which describe it.
    """
    end = f"'status', {status}, 'ended', clock_timestamp(), 'error_code', {code}, 'message', left({message}, 500)"
    return f"""(CASE WHEN NOT ({when}) THEN attempts
        WHEN jsonb_array_length(attempts) = 0
        THEN jsonb_build_array(jsonb_build_object('attempt', 1, 'started', started, 'worker', worker, 'pid', pid,
                                                  'fence', fence, {end}))
        ELSE jsonb_set(attempts, ARRAY[(jsonb_array_length(attempts) - 1)::text],
                       (attempts -> -1) || jsonb_build_object({end}))
        END)"""


ENDED = closed_attempts("%(status)s", "%(code)s", "%(message)s")


#: ``finish`` keeps the history only once there is one (a retry or a takeover made it): an
#: execution that ended in its first attempt is described by its own columns, and the hot
#: path does not touch ``attempts`` at all (``history=False``; measured: about 5 % of a
#: tracked run).
FINISHED = closed_attempts("%(status)s", "%(code)s", "%(message)s", "jsonb_array_length(attempts) > 0")


RECLAIMED = new_attempt("retry_count + (CASE WHEN status = 'RUNNING' THEN 1 ELSE 0 END) + 1", "%(fence)s")


def attempt_started(table: str) -> str:
    """SQL: when the row's current (or last) attempt started: its history entry's start, else the row's
    (a first attempt has no entry until it ends)."""
    return f"coalesce(({table}.attempts -> -1 ->> 'started')::timestamptz, {table}.started)"


def superseded(table: str) -> str:
    """SQL: this RUNNING row's run was superseded by a claim of its job's next run (``claims._supersede``
    gave the row that claim's fence and kept the fence it ran under as its last history entry). What
    its own process reports from then on is fenced; the reconciler ends it."""
    last = f"({table}.attempts -> -1 ->> 'fence')"
    return f"({last} IS NOT NULL AND {last}::bigint <> {table}.fence)"


#: A running attempt a person marks LOST ends in the history too, once there is one.
ABANDONED = closed_attempts("%(status)s", "%(code)s", "%(message)s",
                              "status = 'RUNNING' AND jsonb_array_length(attempts) > 0")


TAKEN_OVER = closed_attempts("'LOST'", "'LEASE_EXPIRED'", "'taken over after its lease expired'",
                               "status = 'RUNNING'")


#: An expired RUNNING attempt that ``give_up`` ends LOST ends in the history too, once there is one.
GIVEN_UP = closed_attempts("'LOST'", "'LEASE_EXPIRED'", "'its worker stopped renewing the lease'",
                             "status = 'RUNNING' AND jsonb_array_length(attempts) > 0")


def insert(
    cursor: Any,
    job: registry.Job,
    job_id: int,
    slot: dt.datetime,
    execution_date: dt.date,
    trigger: str,
    *,
    status: str,
    forced: bool = False,
    fence: int | None = None,
    lease_seconds: int = 0,
    skip_reason: str = "",
    message: str = "",
    celery_task_id: str = "",
    worker: str = "",
    pid: int | None = None,
    given: Mapping[str, Any] | None = None,
    params_given: bool = False,
) -> tuple[int, int]:
    """Insert the slot's next execution. The job lock makes ``max + 1`` safe against other
    claims; a beat insert of run 1 that races us is absorbed by ON CONFLICT and a retry.

    Its parameters are ``given`` over the job's scheduled ones (``params_sql``); ``params_given``
    marks a run with parameters a person gave (its own execution: the slot checks pass it by)."""
    running = status == S.RUNNING
    finished = status in S.terminal()
    for _ in range(5):
        cursor.execute(
            f"""
            INSERT INTO {EXE} ({INSERT_COLUMNS}, params, params_given)
            SELECT %(job)s, %(code)s, %(name)s, %(slot)s, %(date)s,
                coalesce((SELECT max(run_number) FROM {EXE}
                          WHERE job_id = %(job)s AND slot = %(slot)s), 0) + 1,
                %(status)s, %(trigger)s, %(reason)s, %(forced)s, now(),
                CASE WHEN %(running)s THEN clock_timestamp() END, CASE WHEN %(finished)s THEN now() END,
                %(finished)s, NULL, %(message)s, '', '', 0, %(task_id)s, %(worker)s, %(pid)s,
                %(fence)s,
                CASE WHEN %(running)s THEN now() + make_interval(secs => %(lease)s) END,
                '[]'::jsonb, {params_sql("%(job)s", "%(given)s::jsonb")}, %(params_given)s
            ON CONFLICT (job_id, slot, run_number) DO NOTHING
            RETURNING id, run_number
            """,
            {"job": job_id, "code": job.code, "name": job.name, "slot": slot,
             "date": execution_date, "status": status, "trigger": trigger,
             "reason": skip_reason, "forced": forced, "running": running,
             "finished": finished, "message": message, "task_id": celery_task_id,
             "worker": worker, "pid": pid, "fence": fence, "lease": lease_seconds,
             "given": as_jsonb(given), "params_given": params_given},
        )
        row = cursor.fetchone()
        if row is not None:
            return int(row[0]), int(row[1])
    raise RuntimeError(f"could not insert an execution of {job.name} at {slot} after 5 tries")


def status_of(execution_id: int) -> str | None:
    """The execution's status now (None: no such row)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT status FROM {EXE} WHERE id = %s", [execution_id])
        row = cursor.fetchone()
    return str(row[0]) if row else None

