"""Concurrency groups: a limit on live runs shared by several jobs.

Jobs that use one external resource (a warehouse, a partner's API) declare
``concurrency_group="warehouse"``, and ``CRON_CELERY["CONCURRENCY_GROUPS"] = {"warehouse": 2}``
says how many of their runs may be live at once, all jobs of the group together.

The claim decides it (``claims.begin``): under the job's row lock it takes the group's
transaction-scoped advisory lock — always in that order, job row first, so two claims cannot
wait for each other — and counts the group's RUNNING executions. A beat slot that finds the
group full is SKIPPED (``CONCURRENCY``); a requested run or a retry waits (``waiting.mark``)
and is sent when a run of the group ends (``next_to_run``).

A run of another job of the group whose lease expired (its worker froze or died) still holds
its place until the reconciler ends it: this claim cannot fence a run of another job (fences
belong to each job), so counting it is what keeps a frozen worker that wakes up from making
the group one run too many. A stale run of the claiming job itself is superseded by the claim
(``claims._supersede``, the job's own fence) and does not count.
"""

from __future__ import annotations

from typing import Any

from django.db import connection, transaction

from cron_celery import conf, models
from cron_celery.decisions import waiting
from cron_celery.declaring import registry

EXE = models.CronExecution._meta.db_table
JOB = models.CronJob._meta.db_table

#: The group's advisory lock key: one 64-bit key per group name, apart from other users' keys.
LOCK_SQL = "SELECT pg_advisory_xact_lock(hashtextextended('cron_celery.group:' || %s, 0))"


def holding(group: str, job: str, me: str) -> str:
    """SQL counting the RUNNING executions of ``group`` that hold a place against execution ``me``
    of job ``job`` (all three SQL expressions): every one of another job, and the job's own only
    while their lease is live (its stale ones its claim supersedes)."""
    return f"""
        SELECT count(*) FROM {EXE} AS r JOIN {JOB} AS rj ON rj.id = r.job_id
        WHERE rj.concurrency_group = {group} AND r.status = 'RUNNING' AND r.id <> {me}
          AND (r.lease_until > now() OR r.job_id <> {job})
    """


def limits() -> dict[str, int]:
    """The configured groups and their limits (only the valid entries; ``problems`` names the rest)."""
    configured = conf.settings.CONCURRENCY_GROUPS
    if not isinstance(configured, dict):
        return {}
    return {name: value for name, value in configured.items()
            if isinstance(name, str) and registry.NAME_RE.match(name)
            and isinstance(value, int) and not isinstance(value, bool) and value > 0}


def limit(group: str | None) -> int | None:
    """How many live runs the group allows; None for no group (or one not configured: a check
    error, E015, that stops workers from starting)."""
    return limits().get(group) if group else None


def problems(jobs: list[registry.Job]) -> list[str]:
    """What is wrong with ``CONCURRENCY_GROUPS`` and the jobs' groups (system check E015)."""
    configured = conf.settings.CONCURRENCY_GROUPS
    if not isinstance(configured, dict):
        return [f"CRON_CELERY['CONCURRENCY_GROUPS'] must be a dict of group names to limits, not "
                f"{type(configured).__name__}."]
    found = []
    for name, value in configured.items():
        if not (isinstance(name, str) and registry.NAME_RE.match(name)):
            found.append(f"CRON_CELERY['CONCURRENCY_GROUPS']: {name!r} is not a group name (a lower-case slug).")
        elif not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
            found.append(f"CRON_CELERY['CONCURRENCY_GROUPS'][{name!r}] must be a whole number of runs (1 or more), "
                         f"not {value!r}.")
    valid = limits()
    for job in jobs:
        if job.concurrency_group and job.concurrency_group not in configured:
            known = ", ".join(sorted(valid)) or "none is configured"
            found.append(f"Job {job.name!r}: its concurrency_group {job.concurrency_group!r} is not in "
                         f"CRON_CELERY['CONCURRENCY_GROUPS'] ({known}).")
    return found


def full(cursor: Any, group: str, job_id: int, me: int) -> int | None:
    """Under the claiming job's row lock: take the group's lock (held to the end of the claim's
    transaction) and return the group's limit if it has no room for this execution (``me``;
    0 for a new one), else None."""
    allowed = limit(group)
    if allowed is None:
        return None
    cursor.execute(LOCK_SQL, [group])
    cursor.execute(holding('%(group)s', '%(job)s', '%(me)s'), {"group": group, "me": me, "job": job_id})
    return allowed if int(cursor.fetchone()[0]) >= allowed else None


def next_to_run(group: str) -> waiting.Next | None:
    """The group's oldest waiting execution (by slot) that has room now, in its job (fewer live
    runs than the job's own limit) and in the group, and whose job is not paused (unless it was
    sent with ``--force``); its ``lease_until`` is set to now (sent at).

    The group's lock is taken by a statement of its own, so that the choosing statement sees
    every claim of the group committed before it (see ``waiting.next_to_run``); no job row is
    locked here, so a claim holding its job's row while it waits for the group lock cannot wait
    for this too. The claim decides again: a choice that turns out one too many waits again."""
    allowed = limit(group)
    if allowed is None:
        return None
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(LOCK_SQL, [group])
        cursor.execute(
            f"""
            UPDATE {EXE} AS e SET lease_until = now()
            FROM {JOB} AS j
            WHERE j.id = e.job_id AND e.status IN ('PENDING', 'RETRYING') AND e.waiting_since IS NOT NULL
              AND e.id = (
                SELECT w.id FROM {EXE} AS w JOIN {JOB} AS wj ON wj.id = w.job_id
                WHERE wj.concurrency_group = %(group)s
                  AND w.status IN ('PENDING', 'RETRYING') AND w.waiting_since IS NOT NULL
                  AND {waiting.may_go("w", "wj")}
                  AND (wj.max_concurrency IS NULL
                       OR (SELECT count(*) FROM {EXE} AS own WHERE own.job_id = wj.id AND own.status = 'RUNNING'
                           AND own.lease_until > now()) < wj.max_concurrency)
                  AND ({holding('%(group)s', 'w.job_id', 'w.id')}) < %(limit)s
                ORDER BY w.slot, w.id LIMIT 1)
            RETURNING e.id, e.slot, e.trigger, e.celery_task_id, j.task
            """,
            {"group": group, "limit": allowed},
        )
        row = cursor.fetchone()
    if row is None:
        return None
    return waiting.Next(execution_id=int(row[0]), slot=row[1], trigger=str(row[2]),
                        celery_task_id=str(row[3] or ""), task_name=str(row[4]))
