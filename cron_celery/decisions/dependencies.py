"""Dependencies: which jobs run after which (``after=``), and the downstream slots to send.

A job declared with ``after=["extract", "transform"]`` has no schedule of its own: each of its
slots is a slot of its upstream jobs. The decision is the database's: the trigger of migration
0017 (``cron_celery_after``) runs in the transaction of every final write of an upstream's
execution, under the downstream job's row lock, and

- when that was the last upstream of the slot to succeed, inserts the downstream's execution of
  the slot PENDING (trigger ``UPSTREAM``), to be sent after the commit (``tasks.send_downstream``) — or, if
  the writer dies first, by the reconciler, which sends every PENDING execution no worker
  started within ``PENDING_GRACE``;
- when an upstream failed (``FAILED``, ``TIMED_OUT``, ``LOST``, ``REVOKED``), was skipped or
  missed, inserts it SKIPPED (``UPSTREAM``, naming that execution), which decides the jobs after
  it in turn.

The skips a write decided are found again by ``skipped_below`` (by ``upstream_execution_id``, down
the chain), so that ``outcomes`` hands each to the listeners in that write's transaction (the
alert of a job declared with ``alert_on_upstream=True``) and announces it after the commit.

One decision per downstream slot: an execution of it that exists already is left alone, except
that the success of a re-run sent with ``--cascade`` runs the downstream slot again (and
cascades further). A duplicate's skip (``ALREADY_RAN``, ``ALREADY_RUNNING``) decides nothing:
the execution it met does. A run cancelled before it started (``CANCELLED``)
decides like a skip when it was the slot's run the schedule made (``SLOT_TRIGGERS``), the job's
only one of the slot; a cancelled one-off or run somebody asked for decides nothing.

The edges live in ``CronDependency`` rows written from the declarations (``sync``); the checks
(E016) name upstreams that are not declared and upstreams that do not share one schedule.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from typing import Any

from django.db import connection, transaction
from django.db.models import Q

from cron_celery import enums, models, spelling
from cron_celery.decisions import executions, jobs
from cron_celery.declaring import registry

logger = logging.getLogger(__name__)

EXE = executions.EXE
JOB = executions.JOB
DEP = models.CronDependency._meta.db_table
#: The triggers of the runs the schedule makes for a slot: the cancel of one decides the slots below.
SLOT_TRIGGERS = (enums.Trigger.BEAT, enums.Trigger.CATCH_UP, enums.Trigger.BACKFILL, enums.Trigger.UPSTREAM)


def declared_edges(declared: list[registry.Job]) -> list[tuple[registry.Job, registry.Job]]:
    """(downstream, upstream) for every ``after=`` name that is a declared job."""
    by_name = {job.name: job for job in declared}
    return [(job, by_name[name]) for job in declared for name in job.after if name in by_name]


#: How far back a deploy that drops an upstream looks for the slots that waited for it (``sync``).
DROPPED_LOOK_BACK_DAYS = 7


@dataclasses.dataclass(frozen=True)
class Synced:
    """What ``sync`` wrote: how many edges the declarations have, and the downstream jobs it dropped an
    upstream of (the slots they left waiting for it are for ``decide_waiting``)."""

    edges: int
    dropped: list[int]


def sync(declared: list[registry.Job]) -> Synced:
    """Write the edges of these declarations (their rows too) and drop the edges of any of them
    that no longer names that upstream (a deploy that removed it, or took it out of ``after=``).

    A slot of such a downstream that waited for the dropped upstream (another upstream succeeded in
    it; it has no execution yet) would wait forever: nothing that upstream does decides it any more.
    The deploy's schedule sync decides them (``decide_waiting``); a worker's start does not (a worker
    of the old code may start after the new beat, and drop the new code's edges)."""
    edges = declared_edges(declared)
    involved = list({job.code: job for pair in edges for job in pair}.values())
    ids = jobs.refresh_job_ids(involved) if involved else {}
    codes = [job.code for job in declared]
    downs = [ids[down.code] for down, _up in edges]
    ups = [ids[up.code] for _down, up in edges]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"""
            DELETE FROM {DEP} AS d USING {JOB} AS j
            WHERE j.id = d.downstream_id AND j.code = ANY(%s)
              AND (d.downstream_id, d.upstream_id) NOT IN (SELECT * FROM unnest(%s::bigint[], %s::bigint[]))
            RETURNING d.downstream_id
            """,
            [codes, downs, ups],
        )
        dropped = sorted({int(row[0]) for row in cursor.fetchall()})
        cursor.execute(
            f"""
            INSERT INTO {DEP} (downstream_id, upstream_id)
            SELECT * FROM unnest(%s::bigint[], %s::bigint[]) ORDER BY 1, 2
            ON CONFLICT (upstream_id, downstream_id) DO NOTHING
            """,
            [downs, ups],
        )
    return Synced(edges=len(edges), dropped=dropped)


def decide_waiting(downstream_ids: list[int]) -> list[int]:
    """The slots of these downstream jobs (each lost an upstream) that an upstream left succeeded in, with
    no execution of the downstream yet — slots within ``DROPPED_LOOK_BACK_DAYS`` whose success came after
    the downstream's row was made — each decided for that downstream alone as that success would decide
    it now (``cron_celery_after`` with the downstream named: sent, still waiting for another upstream,
    or skipped naming the one that will never run it; never a cascade). Returns the upstream executions
    that decided something."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT e.id, cron_celery_after(e.ended, e.downstream) FROM (
                SELECT DISTINCT ON (d.downstream_id, u.slot) u.id, u AS ended, d.downstream_id AS downstream
                FROM {DEP} AS d
                JOIN {JOB} AS down ON down.id = d.downstream_id
                JOIN {EXE} AS u ON u.job_id = d.upstream_id
                WHERE d.downstream_id = ANY(%(downs)s) AND down.removed_at IS NULL
                  AND u.slot >= now() - make_interval(days => %(days)s)  -- the (job, slot) index
                  AND u.status = 'SUCCEEDED' AND NOT u.params_given AND u.ended > down.created_at
                  AND NOT EXISTS (SELECT 1 FROM {EXE} AS x WHERE x.job_id = d.downstream_id AND x.slot = u.slot
                                  AND NOT x.params_given)
                ORDER BY d.downstream_id, u.slot, u.id) AS e
            ORDER BY e.id
            """,
            {"downs": downstream_ids, "days": DROPPED_LOOK_BACK_DAYS},
        )
        return [int(row[0]) for row in cursor.fetchall() if row[1]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToSend:
    """A downstream execution to send: its upstream's success created it."""

    execution_id: int
    slot: dt.datetime
    celery_task_id: str
    task_name: str


def created_by(upstream_ids: list[int]) -> list[ToSend]:
    """The downstream executions these upstream executions created that no worker started yet."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT e.id, e.slot, e.celery_task_id, j.task FROM {EXE} AS e JOIN {JOB} AS j ON j.id = e.job_id
            WHERE e.upstream_execution_id = ANY(%s) AND e.status = 'PENDING' AND e.started IS NULL
            ORDER BY e.slot, e.id
            """,
            [upstream_ids],
        )
        return [ToSend(execution_id=int(row[0]), slot=row[1], celery_task_id=str(row[2] or ""), task_name=str(row[3]))
                for row in cursor.fetchall()]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Skipped:
    """A downstream execution the database wrote SKIPPED (``UPSTREAM``) in the write that ended an
    upstream execution, or below it down the chain."""

    execution_id: int
    job_id: int
    code: str  # the downstream job's
    slot: dt.datetime
    message: str  # names the upstream execution it was skipped for
    upstream_status: str  # how the execution whose write decided it ended (the top of the chain)


def skipped_below(execution_ids: list[int], *, written_now: bool = False) -> list[Skipped]:
    """The downstream executions that these ended executions had skipped, down the chain, in the
    order they were written. ``written_now``: only those written in the current transaction (a late
    decision, ``undecided``: the upstream's other downstream slots were decided when it ended)."""
    roots = f"SELECT id, job_id, slot, status FROM {EXE} WHERE id = ANY(%(ids)s)"
    return _below(roots, execution_ids, written_now=written_now)


def skipped_below_missed(newest_ids: list[int]) -> list[Skipped]:
    """``skipped_below`` for slots recorded MISSED in bulk (``dispatch.dispatch_many``), named by the
    newest MISSED execution of each job (``repairs.newest_missed``): its job's MISSED executions
    written in the same statement, which share its ``created_at`` (their transaction's start)."""
    roots = (f"SELECT m.id, m.job_id, m.slot, m.status FROM {EXE} AS n JOIN {EXE} AS m ON m.job_id = n.job_id"
             f" AND m.status = 'MISSED' AND m.created_at = n.created_at WHERE n.id = ANY(%(ids)s)")
    return _below(roots, newest_ids, written_now=False)


def _step(above: str) -> str:
    """From the executions ``above`` to the skips they decided: edge by edge, through the (job, slot,
    run number) index, so it reads the slot's few rows, never the history."""
    return (f"JOIN {DEP} AS d ON d.upstream_id = {above}.job_id"
            f" JOIN {EXE} AS e ON e.job_id = d.downstream_id AND e.slot = {above}.slot"
            f" AND e.upstream_execution_id = {above}.id"
            " WHERE e.status = 'SKIPPED' AND e.skip_reason = 'UPSTREAM'")


def _below(roots: str, ids: list[int], *, written_now: bool) -> list[Skipped]:
    fresh = " AND e.created_at = now()" if written_now else ""  # now(): the transaction's start
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH RECURSIVE roots AS ({roots}),
            below(id, job_id, slot, upstream_status) AS (
                SELECT e.id, e.job_id, e.slot, r.status FROM roots AS r {_step("r")}{fresh}
                UNION ALL
                SELECT e.id, e.job_id, e.slot, b.upstream_status FROM below AS b {_step("b")}
            )
            SELECT b.id, b.job_id, j.code, b.slot, e.message, b.upstream_status
            FROM below AS b JOIN {EXE} AS e ON e.id = b.id JOIN {JOB} AS j ON j.id = b.job_id
            ORDER BY b.id
            """,
            {"ids": ids},
        )
        return [Skipped(execution_id=int(row[0]), job_id=int(row[1]), code=str(row[2]), slot=row[3],
                        message=str(row[4]), upstream_status=str(row[5])) for row in cursor.fetchall()]


def undecided(batch: int, grace: float, horizon_hours: float = 1) -> list[int]:
    """Step of a reconciler pass: upstream executions that ended within ``horizon_hours`` (at
    least ``grace`` seconds ago, so the writer's own transaction has had its say) whose downstream
    slot has no execution — a downstream declared or an edge written after they ended, while the
    downstream's row existed. Each is decided now, as its final write would have; returns the ids
    of the upstream executions that decided something."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT e.id, cron_celery_after(e) FROM (
                SELECT DISTINCT ON (u.id) u.* FROM {DEP} AS d
                JOIN {JOB} AS down ON down.id = d.downstream_id
                JOIN {EXE} AS u ON u.job_id = d.upstream_id
                WHERE u.completed AND u.ended > now() - make_interval(hours => %s) AND down.removed_at IS NULL
                  AND u.skip_reason NOT IN ('ALREADY_RAN', 'ALREADY_RUNNING', 'REMOVED')  -- they decide nothing
                  AND NOT (u.skip_reason = 'CANCELLED' AND u.trigger <> ALL(%s))  -- nor a one-off's cancel
                  AND NOT u.params_given  -- nor does a run with parameters a person gave (its own execution)
                  AND u.ended < now() - make_interval(secs => %s) AND u.ended > down.created_at
                  AND NOT EXISTS (SELECT 1 FROM {EXE} AS x WHERE x.job_id = d.downstream_id AND x.slot = u.slot
                                  AND NOT x.params_given)
                ORDER BY u.id LIMIT %s) AS e
            """,
            [horizon_hours, [trigger.value for trigger in SLOT_TRIGGERS], grace, batch],
        )
        return [int(row[0]) for row in cursor.fetchall() if row[1]]


def problems(declared: list[registry.Job]) -> list[str]:
    """What is wrong with the declared dependencies (system check E016): an upstream that is not
    declared, and upstreams whose schedules (in code, through chains) are not one schedule."""
    by_name = {job.name: job for job in declared}
    found = []
    for job in declared:
        missing = [name for name in job.after if name not in by_name]
        if missing:
            meant = "; ".join(f"{spelling.suggestion(name, by_name).strip()} (for {name!r})"
                              for name in missing if spelling.closest(name, by_name))
            found.append(f"Job {job.name!r} runs after {', '.join(map(repr, missing))}, which "
                         f"{'is' if len(missing) == 1 else 'are'} not declared" + (f": {meant}" if meant else "") + ".")
            continue
        roots = schedules_of(job, by_name)
        if len(roots) > 1:
            listed = "; ".join(f"{name}: {text}" for name, text in sorted(roots.items()))
            found.append(f"Job {job.name!r}: its upstream jobs must share one schedule, and they do not ({listed}).")
    return found


def schedules_of(job: registry.Job, by_name: dict[str, registry.Job]) -> dict[str, str]:
    """{upstream name: its schedule's text} of the jobs with a schedule that ``job`` runs after,
    through chains, keeping one entry per distinct schedule."""
    texts: dict[str, str] = {}
    seen: set[str] = set()
    stack = list(job.after)
    while stack:
        name = stack.pop()
        if name in seen or name not in by_name:
            continue
        seen.add(name)
        upstream = by_name[name]
        if upstream.after:
            stack.extend(upstream.after)
        elif upstream.schedule is not None:
            text = f"{upstream.schedule.expression} ({upstream.schedule.timezone or upstream.timezone})"
            if text not in texts.values():
                texts[name] = text
        elif "no schedule" not in texts.values():
            texts[name] = "no schedule"
    return texts


def note_in_effect_problems(edited: list[int] | None = None) -> list[tuple[str, str]]:
    """Write ``in_effect_problems`` to the downstream jobs' ``schedule_problem`` where it changed;
    returns (job name, problem) of the rows written ('' for a problem that cleared)."""
    found = in_effect_problems(edited)
    if not found:
        return []
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE {JOB} AS job SET schedule_problem = d.problem
            FROM unnest(%s::bigint[], %s::text[]) AS d(job_id, problem)
            WHERE job.id = d.job_id AND job.schedule_problem IS DISTINCT FROM d.problem
            RETURNING job.name, job.schedule_problem
            """,
            [list(found), list(found.values())],
        )
        return [(str(name), str(problem)) for name, problem in cursor.fetchall()]


def in_effect_problems(edited: list[int] | None = None) -> dict[int, str]:
    """{downstream job id: why} for downstream jobs whose upstreams' schedules in effect (after
    admin edits) are not one schedule, through chains; the others get ''. Read by the schedule
    sync, which records it as the downstream's ``schedule_problem``. ``edited``: only the jobs
    below these (an admin edit reads its own chain, not every dependency); None: all of them."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH RECURSIVE below(id) AS (
                SELECT downstream_id FROM {DEP} WHERE %(all)s OR upstream_id = ANY(%(edited)s)
                UNION SELECT d.downstream_id FROM below AS b JOIN {DEP} AS d ON d.upstream_id = b.id
            ), reach(downstream_id, upstream_id) AS (
                SELECT downstream_id, upstream_id FROM {DEP} WHERE downstream_id IN (SELECT id FROM below)
                UNION
                SELECT r.downstream_id, d.upstream_id FROM reach AS r JOIN {DEP} AS d ON d.downstream_id = r.upstream_id
            )
            SELECT r.downstream_id,
                   array_agg(DISTINCT j.name || ': ' || CASE WHEN j.schedule = '' THEN 'no schedule' ELSE
                             j.schedule || ' (' || coalesce(nullif(j.schedule_timezone, ''), j.timezone) || ')' END)
            FROM reach AS r JOIN {JOB} AS j ON j.id = r.upstream_id
            WHERE NOT EXISTS (SELECT 1 FROM {DEP} AS up WHERE up.downstream_id = j.id)
            GROUP BY r.downstream_id
            """,
            {"all": edited is None, "edited": edited or []},
        )
        rows: list[tuple[Any, ...]] = cursor.fetchall()
    found: dict[int, str] = {}
    for downstream_id, listed in rows:
        distinct = {item.split(": ", 1)[1] for item in listed}
        found[int(downstream_id)] = "" if len(distinct) == 1 else (
            "its upstream jobs no longer share one schedule (" + "; ".join(sorted(listed)) + "): each slot runs only "
            "when every upstream succeeded in it, so edit them back to one schedule")
    return found


@dataclasses.dataclass(frozen=True, kw_only=True)
class Step:
    """One job of a slot's chain: how far up (< 0) or down (> 0) it is, and its latest execution
    of the slot (None: none yet)."""

    depth: int
    job: str
    execution_id: int | None
    status: str


def chain(job_id: int, slot: dt.datetime) -> list[Step]:
    """The slot across the jobs this job runs after and before (through chains), upstream first:
    what the admin's execution page shows, and where the chain stopped."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH RECURSIVE up(id, depth) AS (
                SELECT %(job)s::bigint, 0
                UNION SELECT d.upstream_id, u.depth - 1 FROM up AS u JOIN {DEP} AS d ON d.downstream_id = u.id
                WHERE u.depth > -20
            ), down(id, depth) AS (
                SELECT %(job)s::bigint, 0
                UNION SELECT d.downstream_id, w.depth + 1 FROM down AS w JOIN {DEP} AS d ON d.upstream_id = w.id
                WHERE w.depth < 20
            ), linked AS (
                SELECT id, min(depth) AS depth FROM up GROUP BY id
                UNION ALL SELECT id, max(depth) FROM down WHERE depth > 0 GROUP BY id
            )
            SELECT l.depth, j.name, e.id, coalesce(e.status, '')
            FROM linked AS l JOIN {JOB} AS j ON j.id = l.id
            LEFT JOIN LATERAL (SELECT id, status FROM {EXE} WHERE job_id = l.id AND slot = %(slot)s
                               ORDER BY run_number DESC LIMIT 1) AS e ON true
            ORDER BY l.depth, j.name
            """,
            {"job": job_id, "slot": slot},
        )
        return [Step(depth=int(depth), job=str(name), execution_id=None if found is None else int(found),
                     status=str(status)) for depth, name, found, status in cursor.fetchall()]


def neighbours(job_id: int) -> tuple[list[str], list[str]]:
    """(the jobs this one runs after, the jobs that run after it), by name."""
    edges = models.CronDependency.objects.filter(Q(downstream_id=job_id) | Q(upstream_id=job_id))
    after = sorted(edge.upstream.name for edge in edges.select_related("upstream") if edge.downstream_id == job_id)
    before = sorted(edge.downstream.name for edge in edges.select_related("downstream") if edge.upstream_id == job_id)
    return after, before
