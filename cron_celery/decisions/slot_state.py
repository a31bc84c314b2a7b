"""What a claim reads of a slot and its job, under the job's row lock, in one statement: whether the
slot's other executions succeeded, failed, are live or stale; the job's live runs (overlap, limits)
and stale ones; and the delivered execution's own row."""

from __future__ import annotations

import datetime as dt
from typing import Any

from cron_celery.decisions import executions

EXE = executions.EXE


def nothing_seen() -> dict[str, Any]:
    """The state of a claim that needs no reading (a new run no check applies to)."""
    return {"succeeded": False, "failed": False, "live": False, "stale": False, "job_live": False,
            "own_status": None, "own_live": False, "own_forced": False, "own_retries": None, "own_trigger": None,
            "own_force": False, "blocker": None, "job_stale": False, "live_count": 0, "ahead": 0, "buffered": 0,
            "stale_ids": None, "slot_stale_ids": None}


def read(cursor: Any, job_id: int, slot: dt.datetime, me: int, *, paused: bool = False) -> dict[str, Any]:
    """What the other executions of this slot and job are doing (under the job lock).

    The slot's own state (the first four) leaves out runs with parameters a person gave
    (``params_given``): such a run is its own execution, never the slot's regular run, so it
    neither uses the slot up nor keeps it busy. The job's live runs (overlap, limits) count it.
    A failed execution counts only if it started: one whose message could not be sent
    (``PUBLISH_FAILED``), never arrived (``LOST`` ``NOT_DELIVERED``) or that was revoked before it
    started never ran, and leaves the slot to be run. ``ahead``: the job's executions that wait for room
    (``waiting``) and would go before this one, by slot then id (``paused``: the job is, so only those
    sent with ``--force`` may go)."""
    cursor.execute(
        f"""
        SELECT
          bool_or(id <> %(me)s AND slot = %(slot)s AND NOT params_given AND status = 'SUCCEEDED'),
          bool_or(id <> %(me)s AND slot = %(slot)s AND NOT params_given AND started IS NOT NULL
                  AND status IN ('FAILED', 'TIMED_OUT', 'LOST', 'REVOKED')),
          bool_or(id <> %(me)s AND slot = %(slot)s AND NOT params_given AND (status IN ('PENDING', 'RETRYING')
                  OR (status = 'RUNNING' AND lease_until > now()))),
          bool_or(id <> %(me)s AND slot = %(slot)s AND NOT params_given AND status = 'RUNNING'
                  AND lease_until <= now()),
          bool_or(id <> %(me)s AND status = 'RUNNING' AND lease_until > now()),
          max(status) FILTER (WHERE id = %(me)s),
          bool_or(id = %(me)s AND lease_until > now()),
          bool_or(id = %(me)s AND forced),
          max(retry_count) FILTER (WHERE id = %(me)s),
          max(trigger) FILTER (WHERE id = %(me)s),
          bool_or(id = %(me)s AND force),
          max(id) FILTER (WHERE id <> %(me)s AND status = 'RUNNING' AND lease_until > now()),
          bool_or(id <> %(me)s AND status = 'RUNNING' AND lease_until <= now()),
          count(*) FILTER (WHERE id <> %(me)s AND status = 'RUNNING' AND lease_until > now()),
          array_agg(id) FILTER (WHERE id <> %(me)s AND status = 'RUNNING' AND lease_until <= now()),
          bool_or(id = %(me)s AND params_given),
          array_agg(id) FILTER (WHERE id <> %(me)s AND slot = %(slot)s AND NOT params_given AND status = 'RUNNING'
                                AND lease_until <= now()),
          count(*) FILTER (WHERE id <> %(me)s AND waiting_since IS NOT NULL AND status IN ('PENDING', 'RETRYING')
                           AND (NOT %(paused)s OR force)
                           AND (slot < %(slot)s OR (slot = %(slot)s AND %(me)s <> 0 AND id < %(me)s))),
          count(*) FILTER (WHERE id <> %(me)s AND waiting_since IS NOT NULL AND status = 'PENDING' AND trigger = 'BEAT'
                           AND NOT force)
        FROM {EXE}
        WHERE job_id = %(job)s AND (slot = %(slot)s OR status = 'RUNNING' OR id = %(me)s
                                    OR (status IN ('PENDING', 'RETRYING') AND waiting_since IS NOT NULL
                                        AND (slot <= %(slot)s OR trigger = 'BEAT')))
        """,
        {"me": me, "slot": slot, "job": job_id, "paused": paused},
    )
    row = cursor.fetchone()
    keys = ("succeeded", "failed", "live", "stale", "job_live", "own_status", "own_live", "own_forced",
            "own_retries", "own_trigger", "own_force", "blocker", "job_stale", "live_count", "stale_ids",
            "own_params_given", "slot_stale_ids", "ahead", "buffered")
    kept = ("own_status", "own_retries", "own_trigger", "blocker", "live_count", "stale_ids", "slot_stale_ids",
            "ahead", "buffered")
    return {key: row[i] if key in kept else (row[i] or False) for i, key in enumerate(keys)}
