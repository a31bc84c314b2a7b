"""The beat's dispatch: which jobs are due, and recording their slots once, however many
schedulers decide; and the PENDING executions a person enqueues.

``dispatch_many`` is one statement for a whole batch of due jobs; its advance of each job's
``next_run_at`` is conditional on what the scheduler read, so a second beat changes nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import uuid
from collections.abc import Mapping
from typing import Any

from django.db import connection, transaction
from django_celery_beat.models import PeriodicTask

from cron_celery import enums
from cron_celery.decisions import executions, one_off_lasts, oneoffs
from cron_celery.declaring import registry

S = enums.Status
JOB = executions.JOB
EXE = executions.EXE
PERIODIC_TASK = PeriodicTask._meta.db_table
#: A row ``dispatch_many`` inserts: (job, slot, execution date, status, trigger, Celery task id, due at).
SlotRow = tuple[int, dt.datetime, dt.date, str, str, str, dt.datetime]


def enqueue(
    *,
    job: registry.Job,
    job_id: int,
    slot: dt.datetime,
    execution_date: dt.date,
    trigger: str,
    forced: bool = False,
    force: bool = False,
    cascade: bool = False,
    given: Mapping[str, Any] | None = None,
) -> tuple[int, int]:
    """Insert a PENDING execution for a message about to be published; (id, run_number).

    ``forced``: past the slot check (``--rerun``/``--force``); ``force``: also past a pause
    (``--force``). Both are kept on the row, so every later send of it keeps them. ``cascade``:
    its success runs the slot of the jobs declared ``after=`` it again (``dependencies``).
    ``given``: parameter values a person gave (a run with parameters); the row holds them over the
    job's scheduled ones, and every later send of it runs with them."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SELECT 1 FROM {JOB} WHERE id = %s FOR UPDATE", [job_id])
        inserted = executions.insert(cursor, job, job_id, slot, execution_date, trigger, status=S.PENDING,
                                     forced=forced or force, given=given, params_given=bool(given))
        if force or cascade:
            cursor.execute(f"UPDATE {EXE} SET force = %s, cascade = %s WHERE id = %s", [force, cascade, inserted[0]])
        return inserted


def enqueue_many(*, job: registry.Job, job_id: int, slots: list[dt.datetime], trigger: str,
                 forced: bool = False, cascade: bool = False, force: bool = False) -> list[ToPublish]:
    """Insert a PENDING execution for each slot (the slot's next run number), each with a Celery
    task id chosen here, in one statement under the job's lock; they are to be published by
    whoever asked (a backfill). Rows that are never published are the reconciler's: it sends a
    PENDING execution again once ``PENDING_GRACE`` has passed. ``force``: each also runs past a
    pause (as ``enqueue``'s)."""
    if not slots:
        return []
    task_ids = [str(uuid.uuid4()) for _ in slots]
    dates = [slot.astimezone(job.tzinfo).date() for slot in slots]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SELECT 1 FROM {JOB} WHERE id = %s FOR UPDATE", [job_id])
        cursor.execute(
            f"""
            INSERT INTO {EXE} ({executions.INSERT_COLUMNS}, cascade, params)
            SELECT %(job)s, %(code)s, %(name)s, s.slot, s.execution_date,
                   coalesce((SELECT max(run_number) FROM {EXE} WHERE job_id = %(job)s AND slot = s.slot), 0) + 1,
                   'PENDING', %(trigger)s, '', %(forced)s, now(), NULL, NULL, false, NULL, '', '', '', 0,
                   s.celery_task_id, '', NULL, NULL, NULL, '[]'::jsonb, %(cascade)s,
                   {executions.params_sql("%(job)s", "NULL")}
            FROM unnest(%(slots)s::timestamptz[], %(dates)s::date[], %(ids)s::text[])
                AS s(slot, execution_date, celery_task_id)
            ORDER BY s.slot
            RETURNING id, slot, celery_task_id
            """,
            {"job": job_id, "code": job.code, "name": job.name, "trigger": trigger, "forced": forced,
             "slots": slots, "dates": dates, "ids": task_ids, "cascade": cascade},
        )
        rows = cursor.fetchall()
        if force:
            cursor.execute(f"UPDATE {EXE} SET force = true WHERE id = ANY(%s)", [[row[0] for row in rows]])
    return sorted((ToPublish(execution_id=int(row[0]), job_id=job_id, slot=row[1], trigger=trigger,
                             celery_task_id=str(row[2])) for row in rows), key=lambda item: item.slot)


def pending(execution_ids: list[int]) -> list[ToPublish]:
    """Those of these executions that still wait to be published (PENDING, never started), oldest
    slot first."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT id, job_id, slot, trigger, celery_task_id FROM {EXE}
            WHERE id = ANY(%s) AND status = 'PENDING' AND started IS NULL ORDER BY slot, id
            """,
            [execution_ids],
        )
        return [ToPublish(execution_id=int(row[0]), job_id=int(row[1]), slot=row[2], trigger=str(row[3]),
                          celery_task_id=str(row[4])) for row in cursor.fetchall()]


def abandon(execution_id: int, message: str) -> None:
    """Close a PENDING execution whose message could not be published (status FAILED)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE {EXE} SET status = 'FAILED', completed = true, success = false,
                ended = now(), error_code = 'PUBLISH_FAILED', message = %s
            WHERE id = %s AND status = 'PENDING'
            """,
            [message[:1000], execution_id],
        )


def set_celery_task_id(execution_id: int, celery_task_id: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {EXE} SET celery_task_id = %s WHERE id = %s AND celery_task_id = ''",
            [celery_task_id, execution_id],
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Decision:
    """A scheduler's plan for one due job (see ``catch_up.plan_catch_up``)."""

    job_id: int
    expected_next_run_at: dt.datetime | None  # what the scheduler read; the advance is conditional on it
    next_run_at: dt.datetime
    run: list[dt.datetime]  # PENDING rows (CATCH_UP, every one, when there are several)
    missed: list[dt.datetime]  # MISSED rows
    tz: dt.tzinfo  # for each slot's execution date
    jitter_ms: int = 0  # the job's dispatch offset: each slot's row records slot + this as when it was due
    last: bool = False  # the periodic task's one_off: once this is recorded the task is disabled (the job paused)
    catching_up: bool = False  # ``run`` holds overdue slots (catch-up ``all``): every one of them is CATCH_UP


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToPublish:
    """A PENDING execution this scheduler inserted: send it, with this Celery task id."""

    execution_id: int
    job_id: int
    slot: dt.datetime
    trigger: str
    celery_task_id: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Dispatched:
    """What ``dispatch`` wrote for one job: the PENDING executions to publish now."""

    advanced: bool  # False: another scheduler advanced the job first; nothing was written
    to_publish: list[tuple[int, dt.datetime]]  # (execution id, slot) of rows this call inserted
    missed: int = 0  # MISSED rows this call inserted
    catch_up_ids: frozenset[int] = frozenset()  # those of ``to_publish`` that run late (CATCH_UP)


def dispatch_many(
    decisions: list[Decision], trigger: str = enums.Trigger.BEAT
) -> tuple[set[int], list[ToPublish], int]:
    """Record many jobs' decisions in one statement, once, however many schedulers decide.

    Each job's ``next_run_at`` advances only if it still is what the scheduler read (a
    second beat with the same view changes nothing, and a paused job nothing at all), and
    only the jobs that advanced get rows: run 1 of each slot, PENDING (with a Celery task id
    chosen here) or MISSED, with ``ON CONFLICT DO NOTHING``. Only the rows this call
    inserted come back for publishing: a slot is dispatched once.

    Returns (ids of the jobs advanced, the executions to publish, MISSED rows written).
    """
    if not decisions:
        return set(), [], 0
    slot_rows = _slot_rows(decisions, trigger)
    columns: list[list[Any]] = [list(column) for column in zip(*slot_rows, strict=True)] or [[] for _ in range(7)]
    lasts = [d.job_id for d in decisions if d.last]
    with transaction.atomic() if lasts else contextlib.nullcontext(), connection.cursor() as cursor:
        if lasts:
            lasts = one_off_lasts.hold(cursor, lasts, lock_wait=COUNT_LOCK_WAIT)
        cursor.execute(
            f"""
            WITH decided AS (
                SELECT * FROM unnest(%s::bigint[], %s::timestamptz[], %s::timestamptz[])
                    AS d(job_id, expected, next_run_at)
            ), advanced AS (
                UPDATE {JOB} AS job SET next_run_at = d.next_run_at
                FROM decided AS d
                WHERE job.id = d.job_id AND NOT job.paused
                  AND job.next_run_at IS NOT DISTINCT FROM d.expected
                RETURNING job.id, job.code, job.name, job.params
            ), slots AS (
                SELECT * FROM unnest(%s::bigint[], %s::timestamptz[], %s::date[], %s::text[], %s::text[],
                                     %s::text[], %s::timestamptz[])
                    AS s(job_id, slot, execution_date, status, trigger, celery_task_id, due_at)
            ), inserted AS (
                {_insert_slots("advanced AS a ON a.id = s.job_id", "a")}
            )
            SELECT 'job', id, NULL, NULL, NULL, NULL FROM advanced
            UNION ALL
            SELECT 'exe', id, job_id, slot, status || ':' || trigger, celery_task_id FROM inserted
            """,
            [[d.job_id for d in decisions], [d.expected_next_run_at for d in decisions],
             [d.next_run_at for d in decisions], *columns,
             S.MISSED, S.MISSED, S.MISSED, "Missed: the scheduler did not dispatch this slot in time."],
        )
        rows = cursor.fetchall()
        advanced = {int(row[1]) for row in rows if row[0] == "job"}
        rows += _insert_after_holders(cursor, slot_rows, advanced,
                                      {(row[2], row[3]) for row in rows if row[0] == "exe"})
        if lasts:
            one_off_lasts.end(cursor, [job_id for job_id in lasts if job_id in advanced], rows)
    publish, missed = _to_publish(rows)
    return advanced, publish, missed


def _slot_rows(decisions: list[Decision], trigger: str) -> list[SlotRow]:
    """The rows ``dispatch_many`` inserts for ``decisions``."""
    found: list[SlotRow] = []
    for decision in decisions:
        # Several slots at once are a catch-up, the newest included: each waits for the job's live
        # run (a buffered trigger) instead of meeting it and being skipped.
        catching_up = decision.catching_up or len(decision.run) > 1
        offset = dt.timedelta(milliseconds=decision.jitter_ms)
        for slot in decision.run:
            found.append((decision.job_id, slot, slot.astimezone(decision.tz).date(), S.PENDING,
                          enums.Trigger.CATCH_UP if catching_up else trigger, str(uuid.uuid4()), slot + offset))
        for slot in decision.missed:
            found.append((decision.job_id, slot, slot.astimezone(decision.tz).date(), S.MISSED, trigger, "",
                          slot + offset))
    return found


def _to_publish(rows: list[tuple[Any, ...]]) -> tuple[list[ToPublish], int]:
    """The executions inserted PENDING, to publish in slot order, and how many were inserted MISSED."""
    publish: list[ToPublish] = []
    missed = 0
    for kind, execution_id, job_id, slot, state, celery_task_id in rows:
        if kind != "exe":
            continue
        status, _, row_trigger = state.partition(":")
        if status == S.MISSED:
            missed += 1
            continue
        publish.append(ToPublish(execution_id=int(execution_id), job_id=int(job_id), slot=slot,
                                 trigger=row_trigger, celery_task_id=celery_task_id))
    publish.sort(key=lambda item: (item.slot, item.job_id))
    return publish, missed


def _insert_slots(source: str, alias: str) -> str:
    """The INSERT of ``dispatch_many``'s slot rows (``slots AS s``, joined to ``source`` for the job's
    code, name and params): run 1, unless a one-off run recorded ahead or a run with parameters a
    person gave holds the slot (then after it: neither is the slot's regular run). Its positional
    parameters: MISSED three times, then the MISSED rows' message."""
    return f"""
        INSERT INTO {EXE} ({executions.INSERT_COLUMNS}, due_at, params)
        SELECT s.job_id, {alias}.code, {alias}.name, s.slot, s.execution_date,
               coalesce((SELECT max(o.run_number) + 1 FROM {EXE} AS o WHERE o.job_id = s.job_id
                         AND o.slot = s.slot AND (o.trigger = 'ONE_OFF' OR o.params_given)), 1),
               s.status, s.trigger, '',
               false, now(), NULL, CASE WHEN s.status = %s THEN now() END, s.status = %s, NULL,
               CASE WHEN s.status = %s THEN %s ELSE '' END, '', '', 0, s.celery_task_id, '',
               NULL, NULL, NULL, '[]'::jsonb, s.due_at,
               -- the periodic task's kwargs in effect (checked when the edit was applied)
               {alias}.params
        FROM slots AS s JOIN {source}
        ORDER BY s.job_id, s.slot
        ON CONFLICT (job_id, slot, run_number) DO NOTHING
        RETURNING id, job_id, slot, status, trigger, celery_task_id"""


#: How often ``_insert_after_holders`` tries again a slot that a concurrent one-off or run with
#: parameters keeps taking the number of.
_HOLDER_TRIES = 3


def _insert_after_holders(cursor: Any, slot_rows: list[SlotRow],
                          advanced: set[int], inserted: set[tuple[int, dt.datetime]]) -> list[Any]:
    """The slots of jobs this round advanced that got no row: a one-off run or a run with parameters
    committed at that slot while the round's statement waited for the job's row, after its snapshot,
    so its run number met theirs. Inserted again after them, by a statement that sees them, unless the
    slot has a regular run already (somebody ran it: then it is not run twice). A slot that loses its
    number again is tried again, ``_HOLDER_TRIES`` times in all."""
    rows: list[Any] = []
    for _ in range(_HOLDER_TRIES):
        missing = [row for row in slot_rows if row[0] in advanced and (row[0], row[1]) not in inserted]
        if not missing:
            break
        cursor.execute(
            f"""
            WITH slots AS (
                SELECT * FROM unnest(%s::bigint[], %s::timestamptz[], %s::date[], %s::text[], %s::text[],
                                     %s::text[], %s::timestamptz[])
                    AS s(job_id, slot, execution_date, status, trigger, celery_task_id, due_at)
                WHERE NOT EXISTS (SELECT 1 FROM {EXE} AS r WHERE r.job_id = s.job_id AND r.slot = s.slot
                                  AND r.trigger <> 'ONE_OFF' AND NOT r.params_given)
            ), inserted AS ({_insert_slots(f"{JOB} AS job ON job.id = s.job_id", "job")})
            SELECT 'exe', id, job_id, slot, status || ':' || trigger, celery_task_id FROM inserted
            """,
            [*[list(column) for column in zip(*missing, strict=True)],
             S.MISSED, S.MISSED, S.MISSED, "Missed: the scheduler did not dispatch this slot in time."],
        )
        found = cursor.fetchall()  # none: a regular run holds each slot, or their numbers were taken again
        rows += found
        inserted |= {(row[2], row[3]) for row in found}
    return rows


#: How long ``count_sent`` waits for a periodic task's row lock before it gives up for this round.
COUNT_LOCK_WAIT = "200ms"


def count_sent(sent: dict[int, int]) -> None:
    """Keep django-celery-beat's own columns of the jobs' periodic tasks true, as its scheduler
    does for the tasks it sends: ``last_run_at`` (when one was last sent) and ``total_run_count``,
    for ``sent`` = {job id: messages sent}. One statement per dispatch round, after the round's
    commit and outside its job-row locks (an admin edit locks the periodic task, then the job);
    these columns are no schedule edit, so the beat's edit trigger ignores them.

    It waits at most ``COUNT_LOCK_WAIT`` for a periodic task's row that someone else holds (an
    admin's save in progress) and then raises ``OperationalError``: the beat keeps the counts
    for its next round instead of stalling its dispatch."""
    if not sent:
        return
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL lock_timeout = '{COUNT_LOCK_WAIT}'")
        cursor.execute(
            f"""
            UPDATE {PERIODIC_TASK} AS task SET last_run_at = now(), total_run_count = task.total_run_count + n.sent
            FROM (SELECT job.periodic_task_id, sum(c.sent) AS sent
                  FROM unnest(%s::bigint[], %s::int[]) AS c(job_id, sent) JOIN {JOB} AS job ON job.id = c.job_id
                  WHERE job.periodic_task_id IS NOT NULL GROUP BY 1 ORDER BY 1) AS n
            WHERE task.id = n.periodic_task_id
              -- a clocked or solar one is django-celery-beat's to count (a tracked one fires by it)
              AND (task.crontab_id IS NOT NULL OR task.interval_id IS NOT NULL)
            """,
            [list(sent), list(sent.values())],
        )


def dispatch(
    *,
    job: registry.Job,
    job_id: int,
    expected_next_run_at: dt.datetime | None,
    next_run_at: dt.datetime,
    run: list[dt.datetime],
    missed: list[dt.datetime],
    trigger: str = enums.Trigger.BEAT,
) -> Dispatched:
    """``dispatch_many`` for one job."""
    decision = Decision(job_id=job_id, expected_next_run_at=expected_next_run_at, next_run_at=next_run_at,
                        run=run, missed=missed, tz=job.tzinfo)
    advanced, publish, missed_count = dispatch_many([decision], trigger)
    return Dispatched(
        advanced=job_id in advanced,
        to_publish=[(item.execution_id, item.slot) for item in publish],
        missed=missed_count,
        catch_up_ids=frozenset(item.execution_id for item in publish if item.trigger == enums.Trigger.CATCH_UP),
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class DueJob:
    """A job whose next slot has come, with what the scheduler needs to plan it."""

    job_id: int
    next_run_at: dt.datetime
    task: str
    name: str
    schedule: str
    timezone: str  # the schedule's: what its cron is read in
    catch_up: str
    job_timezone: str  # the job's: what its slots' execution dates are read in
    jitter_ms: int = 0  # its slots are sent this long after them (``due_at`` = next_run_at + it)
    active_from: dt.datetime | None = None  # its window in effect: no slot before it, none at or after the end
    active_until: dt.datetime | None = None
    one_off: bool = False  # its periodic task's one_off: the next slot sent is the last
    catch_up_window: float | None = None  # seconds: a missed slot older than this is MISSED whatever catch_up says


def due_jobs(now: dt.datetime, limit: int = 1000, among: list[int] | None = None,
             skip_catch_up: str | None = None) -> list[DueJob]:
    """Unpaused jobs whose next slot is due to be sent (``due_at``: the slot plus the job's
    jitter), the earliest first, through the index on ``due_at``; ``among`` limits it to some
    job ids, ``skip_catch_up`` leaves out the jobs with that catch-up policy and no catch-up window."""
    only = "" if among is None else "AND id = ANY(%s)"
    if skip_catch_up is not None:
        only += f" AND (catch_up <> '{enums.CatchUp(skip_catch_up).value}' OR catch_up_window IS NOT NULL)"
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT id, next_run_at, task, name, schedule, coalesce(nullif(schedule_timezone, ''), timezone),
                   catch_up, timezone, jitter_ms, active_from, active_until, one_off, catch_up_window
            FROM {JOB}
            WHERE due_at <= %s AND NOT paused {only}
            ORDER BY due_at LIMIT %s
            """,
            [now, limit] if among is None else [now, among, limit],
        )
        return [DueJob(job_id=int(row[0]), next_run_at=row[1], task=row[2], name=row[3], schedule=row[4],
                       timezone=row[5], catch_up=row[6], job_timezone=row[7], jitter_ms=int(row[8]),
                       active_from=row[9], active_until=row[10], one_off=bool(row[11]), catch_up_window=row[12])
                for row in cursor.fetchall()]


#: The last moment Python's datetimes hold: a ``due_at`` past it (a window opening at the calendar's end,
#: plus the job's jitter) is read as it, never as a value no tick could read.
CALENDAR_END = "timestamptz '9999-12-31 23:59:59.999999+00'"


def next_due() -> tuple[dt.datetime | None, bool, dt.datetime]:
    """The idle tick's one query: the earliest ``due_at`` (next slot plus jitter) of an unpaused job,
    of a one-off run not sent yet (``oneoffs``) or of a pause's end (``pauses``), whether
    any schedule was edited, and the database's clock (what "is it due" is decided by, so a
    beat whose own clock is off dispatches nothing early or late). Both lookups use an index
    (``due_at``, and the partial index of edited jobs: written as a scalar subquery, not
    ``EXISTS``, because only this form lets the planner use it — ``EXISTS`` scans the whole table)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT (SELECT CASE WHEN d > {CALENDAR_END} THEN {CALENDAR_END} ELSE d END
                      FROM (SELECT least((SELECT due_at FROM {JOB} WHERE due_at IS NOT NULL AND NOT paused
                                          ORDER BY due_at LIMIT 1), {oneoffs.earliest()},
                                         (SELECT paused_until FROM {JOB} WHERE paused_until IS NOT NULL
                                          ORDER BY paused_until LIMIT 1)) AS d) AS earliest),
                   (SELECT id FROM {JOB} WHERE schedule_version <> schedule_seen ORDER BY id LIMIT 1) IS NOT NULL,
                   clock_timestamp()
            """
        )
        row = cursor.fetchone()
    assert row is not None
    return row[0], bool(row[1]), row[2]

