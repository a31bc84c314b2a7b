"""Schedules declared in code, editable in the admin through django-celery-beat.

Every scheduled job gets a ``PeriodicTask`` (with its ``CrontabSchedule`` or
``IntervalSchedule``) linked from its ``CronJob`` row. ``sync()`` (run when a beat starts
and by ``manage.py sync_cron_schedules``) writes the code's schedule there only when the
declaration changed since the last sync (``declaration_hash``), so an edit made in the
admin survives restarts until the code itself changes. Jobs gone from the code are
unlinked and their periodic task disabled, never deleted; what they left is retired (``removals``).

Database triggers (``migrations/_initial/beat_sync.py``) bump ``CronJob.schedule_version`` on any edit of a
linked periodic task or of its schedule row; ``apply_edits()`` re-reads just those jobs,
stores the schedule in effect on the job row and moves ``next_run_at`` when it changed.
An edit that cannot drive its job is refused for that job alone (``schedule_problems``).
The beat calls it every tick: an idle call is one indexed query that finds nothing.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import logging
from typing import Any

from celery import current_app
from django.db import IntegrityError, connection, transaction
from django.utils import timezone
from django_celery_beat.models import CrontabSchedule, IntervalSchedule, PeriodicTask, PeriodicTasks

from cron_celery import exceptions, models, schedules, slots
from cron_celery.beat import schedule_problems
from cron_celery.decisions import audit, dependencies, edit_writes, executions, jobs, removals, tracked
from cron_celery.declaring import registry
from cron_celery.run import outcomes, tasks
from cron_celery.tracking import rows, selection

logger = logging.getLogger(__name__)

JOB = models.CronJob._meta.db_table
TASK = PeriodicTask._meta.db_table
CRONTAB = CrontabSchedule._meta.db_table
INTERVAL = IntervalSchedule._meta.db_table

@dataclasses.dataclass
class SyncReport:
    created: list[str] = dataclasses.field(default_factory=list)  # new periodic tasks
    updated: list[str] = dataclasses.field(default_factory=list)  # code changed: schedule rewritten
    kept: list[str] = dataclasses.field(default_factory=list)  # unchanged (admin edits kept)
    disabled: list[str] = dataclasses.field(default_factory=list)  # gone from the code

    def __str__(self) -> str:
        return (f"{len(self.created)} created, {len(self.updated)} updated from code, "
                f"{len(self.kept)} unchanged, {len(self.disabled)} disabled")


def declaration_hash(job: registry.Job) -> str:
    """What the code says about when the job runs; a change makes the code win again."""
    assert job.schedule is not None
    text = f"{job.task_name}|{job.schedule.expression}|{job.schedule.timezone or job.timezone}"
    if job.active_from is not None or job.active_until is not None:  # no window: the hash of before windows
        text += f"|{_iso_or_none(job.active_from)}|{_iso_or_none(job.active_until)}"
    return hashlib.sha256(text.encode()).hexdigest()


def _iso_or_none(moment: dt.datetime | None) -> str:
    return moment.isoformat() if moment is not None else "-"


def _window_fields(job: registry.Job) -> dict[str, object]:
    """The code's active window, in the periodic task's own columns (where the admin edits it).
    django-celery-beat refuses ``expires`` beside ``expire_seconds`` (a message expiry, not a window):
    a declared end clears it."""
    fields: dict[str, object] = {"start_time": job.active_from, "expires": job.active_until}
    if job.active_until is not None:
        fields["expire_seconds"] = None
    return fields


def task_name_for(job: registry.Job) -> str:
    """The periodic task's name in the admin."""
    return f"{job.name} ({job.code})"


def _schedule_row(schedule: schedules.Schedule, tz: str) -> dict[str, object]:
    if isinstance(schedule, schedules.Interval):
        row, _ = IntervalSchedule.objects.get_or_create(every=schedule.seconds, period=IntervalSchedule.SECONDS)
        return {"interval": row, "crontab": None}
    row = CrontabSchedule.objects.filter(
        minute=schedule.minute, hour=schedule.hour, day_of_month=schedule.day_of_month,
        month_of_year=schedule.month_of_year, day_of_week=schedule.day_of_week, timezone=tz,
    ).order_by("id").first() or CrontabSchedule.objects.create(
        minute=schedule.minute, hour=schedule.hour, day_of_month=schedule.day_of_month,
        month_of_year=schedule.month_of_year, day_of_week=schedule.day_of_week, timezone=tz,
    )
    return {"crontab": row, "interval": None}


def sync(now: dt.datetime | None = None, *, source: str = audit.DEPLOY_SYNC) -> SyncReport:
    """Bring django-celery-beat in line with the jobs declared in code (see module doc). What it
    changes is recorded in the audit log with ``source`` (the beat's start, the command)."""
    report = SyncReport()
    rows.sync(source=source)  # periodic tasks tracked as jobs (TRACK_PERIODIC_TASKS): their rows linked
    declared = {job.code: job for job in registry.all_jobs() if job.schedule is not None}
    # A tracked periodic task's row that a job declared in code takes over (its code): its periodic task's
    # arguments were its task's; the job's own parameters start from none.
    taking_over = set(models.CronJob.objects.filter(code__in=list(declared), task__startswith=tracked.ALIAS)
                      .values_list("code", flat=True))
    job_ids = jobs.refresh_job_ids(list(declared.values()))
    edges = dependencies.sync(registry.all_jobs())  # the edges of after=, and the downstream jobs' rows
    report.disabled += removals.sync(registry.all_jobs(), source=source).disabled  # gone from the code: retired
    known = {
        row["code"]: row
        for row in models.CronJob.objects.values("id", "code", "periodic_task_id", "declaration_hash", "task")
    }
    to_write: list[registry.Job] = []
    for code, job in declared.items():
        row = known.get(code)
        if row is not None and row["periodic_task_id"] is not None and row["declaration_hash"] == declaration_hash(job):
            report.kept.append(job.name)
        else:
            to_write.append(job)
    taken = set(PeriodicTask.objects.filter(name__in=[task_name_for(job) for job in to_write])
                .values_list("name", flat=True))
    fresh = [job for job in to_write if known[job.code]["periodic_task_id"] is None
             and task_name_for(job) not in taken]
    if fresh and _create_in_bulk(fresh, job_ids, source):
        report.created += [job.name for job in fresh]
        done = {job.code for job in fresh}
        to_write = [job for job in to_write if job.code not in done]
    for job in to_write:
        _write_from_code(job, job_ids[job.code], declaration_hash(job), report, source,
                         taking_over=job.code in taking_over)
    stale = [row for code, row in known.items() if code not in declared and row["periodic_task_id"] is not None
             and not row["task"].startswith(tracked.ALIAS)]
    for row in stale:
        with transaction.atomic():
            audit.set_author(source=source)
            models.CronJob.objects.filter(id=row["id"]).update(periodic_task=None, next_run_at=None)
            PeriodicTask.objects.filter(id=row["periodic_task_id"]).update(enabled=False)
        report.disabled.append(row["code"])
    if stale or fresh or report.disabled:
        PeriodicTasks.update_changed()  # bulk writes send no signals: tell django-celery-beat
    recheck_params()
    tracked.read_again_with_problems()  # a task registered since (a deploy) clears its problem
    # Jobs no longer scheduled by anyone never fall due.
    models.CronJob.objects.filter(periodic_task__isnull=True).exclude(code__in=list(declared)).exclude(
        next_run_at=None).update(next_run_at=None)
    while apply_edits(now):
        pass
    note_downstream()
    # Last, with every job's row as this code has it: the slots left waiting for an upstream it dropped.
    for execution_id in outcomes.decided_waiting(edges.dropped):
        tasks.send_downstream(current_app, execution_id)
    return report


def _create_in_bulk(jobs: list[registry.Job], job_ids: dict[str, int], source: str) -> bool:
    """Periodic tasks for jobs that never had one, in a few statements (thousands of new
    jobs on a first start). False if another process created some meanwhile."""
    rows: dict[tuple[str, str], dict[str, object]] = {}
    sentences: dict[schedules.Schedule, str] = {}  # describing a cron takes a while: once each
    tasks = []
    for job in jobs:
        assert job.schedule is not None
        tz = job.schedule.timezone or job.timezone
        key = (job.schedule.expression, tz if isinstance(job.schedule, schedules.Cron) else "")
        if key not in rows:
            rows[key] = _schedule_row(job.schedule, tz)
        if job.schedule not in sentences:
            sentences[job.schedule] = str(job.schedule)
        tasks.append(PeriodicTask(name=task_name_for(job), task=job.task_name, enabled=True,
                                  description=sentences[job.schedule], **rows[key], **_window_fields(job)))
    try:
        with transaction.atomic():
            audit.set_author(source=source)
            created = PeriodicTask.objects.bulk_create(tasks)
            with connection.cursor() as cursor:
                cursor.execute(
                    f"""
                    UPDATE {JOB} AS job
                       SET periodic_task_id = d.task_id, declaration_hash = d.digest,
                           schedule_version = job.schedule_version + 1
                      FROM unnest(%s::bigint[], %s::bigint[], %s::text[]) AS d(job_id, task_id, digest)
                     WHERE job.id = d.job_id AND job.periodic_task_id IS NULL
                    """,
                    [[job_ids[job.code] for job in jobs], [task.id for task in created],
                     [declaration_hash(job) for job in jobs]],
                )
                if cursor.rowcount != len(jobs):
                    raise IntegrityError("another process linked some of these jobs meanwhile")
    except IntegrityError:
        return False
    return True


def _write_from_code(job: registry.Job, job_id: int, digest: str, report: SyncReport, source: str, *,
                     taking_over: bool = False) -> None:
    assert job.schedule is not None
    tz = job.schedule.timezone or job.timezone
    with transaction.atomic():
        audit.set_author(source=source)
        row = models.CronJob.objects.select_for_update().get(id=job_id)
        if row.periodic_task_id is not None and row.declaration_hash == digest:
            report.kept.append(job.name)  # another process synced it meanwhile
            return
        task = row.periodic_task
        if task is None:  # adopt a task left by an earlier link, else create one
            task = PeriodicTask.objects.filter(name=task_name_for(job), task=job.task_name).first()
        fields = {"task": job.task_name, "description": str(job.schedule), **_schedule_row(job.schedule, tz),
                  **_window_fields(job)}
        if taking_over:  # the arguments of the task it tracked, not values of this job's parameters
            fields.update(args="[]", kwargs="{}")
        if task is None:
            task = PeriodicTask.objects.create(name=task_name_for(job), enabled=True, **fields)
            report.created.append(job.name)
        else:
            linked = row.periodic_task_id == task.id
            for key, value in fields.items():
                setattr(task, key, value)
            if not linked:
                task.enabled = True  # declared again in code: it is wanted
            task.save()
            (report.updated if linked else report.created).append(job.name)
        models.CronJob.objects.filter(id=job_id).update(
            periodic_task=task, declaration_hash=digest, schedule_version=row.schedule_version + 1)


def apply_edits(now: dt.datetime | None = None, limit: int = 1000) -> int:
    """Take in the admin edits made since the last call; returns how many jobs were read.

    A job whose schedule changed gets the first slot of the new schedule after ``now`` as
    its ``next_run_at``; a job re-enabled after a pause starts at its next slot (paused
    slots are not caught up).

    An edit that cannot drive the job (it never fires, a solar or clocked schedule, a field
    or timezone that does not parse, an interval under a second, a window that opens past the
    calendar's last slot...) is refused for that job alone: the job keeps its previous schedule
    and next slot — or, with none, is paused — and the reason is stored in ``schedule_problem``
    (the dashboard shows it), logged, and alerted on the job's failure channels once per new
    reason. A usable edit clears it. Each edit is applied on its own: whatever one job's edit
    holds, reading it or writing its row (``edit_writes``) fails for that job only.

    The periodic task's ``kwargs`` are the values of the job's scheduled runs: checked against
    the job's parameters and copied to its row (``params``), which the beat's dispatch writes on
    every execution it inserts. Refused kwargs (not JSON, a name the job does not declare, a value
    that does not fit or that PostgreSQL cannot store, a required parameter left out) go the same
    way: the job keeps its previous values — or, with none that can run, is paused — and the
    reason is stored and alerted.
    """
    now = now or timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT job.id, job.schedule_version, job.schedule, job.schedule_timezone, job.next_run_at,
                   task.enabled, c.minute, c.hour, c.day_of_month, c.month_of_year, c.day_of_week,
                   c.timezone, i.every, i.period, job.name, job.timezone, job.code, job.schedule_problem,
                   task.start_time, task.expires, coalesce(task.one_off, false), job.active_from, job.active_until,
                   task.kwargs, job.params, job.jitter_ms, job.task, task.args,
                   (task.id IS NOT NULL AND task.crontab_id IS NULL AND task.interval_id IS NULL), task.task
            FROM {JOB} AS job
            LEFT JOIN {TASK} AS task ON task.id = job.periodic_task_id
            LEFT JOIN {CRONTAB} AS c ON c.id = task.crontab_id
            LEFT JOIN {INTERVAL} AS i ON i.id = task.interval_id
            WHERE job.schedule_version <> job.schedule_seen
            ORDER BY job.id LIMIT %s
            """,
            [limit],
        )
        rows = cursor.fetchall()
    updates: list[edit_writes.Update] = []
    readings: dict[tuple[object, object], schedule_problems.Reading] = {}  # thousands of jobs share a few schedules
    raised: dict[int, schedule_problems.Problem] = {}
    names = {int(row[0]): (row[16], row[14], row[17]) for row in rows}  # id: code, name, known problem
    for row in rows:
        try:
            update, found = _taken_in(row, readings, now)
        except Exception as error:  # whatever the edit holds, it must stop this job only: it keeps what it had
            kept = executions.loaded(row[24])
            update, found = schedule_problems.unreadable(edit_writes.Update(
                job_id=row[0], version=row[1], schedule=row[2], tz=row[3] or "", move=False, next_run_at=row[4],
                problem="", paused=None, opens=row[21], closes=row[22], one_off=None,
                params=None if kept is None else json.dumps(kept)), code=row[16], name=row[14], known=row[17],
                error=error)
        updates.append(update)
        if found is not None:
            raised[update.job_id] = found
    written = edit_writes.write(updates)
    for job_id, problem in written.refused.items():
        code, name, known = names[job_id]
        logger.error("cron job %s: its edit could not be stored (%s); keeping its previous schedule until it is "
                     "fixed", name, problem)
        if problem != known:
            raised[job_id] = schedule_problems.Problem(code=code, name=name, problem=problem,
                                                       kept="keeping its previous schedule")
    schedule_problems.alert([found for job_id, found in raised.items()
                             if job_id in written.ids or job_id in written.refused])
    if written.ids:
        note_downstream(sorted(written.ids))
    return len(rows)


def _taken_in(row: tuple[Any, ...], readings: dict[tuple[object, object], schedule_problems.Reading],
              now: dt.datetime) -> tuple[edit_writes.Update, schedule_problems.Problem | None]:
    """One edited job's row as its edit leaves it, and its problem if that is new."""
    (job_id, version, stored, stored_tz, next_run_at, enabled, minute, hour, dom, moy, dow, tz,
     every, period, name, job_tz, code, known_problem, opens, closes, one_off, opened, closed,
     kwargs, stored_params, jitter_ms, job_task, args, fired, periodic_name) = row
    schedule_text, schedule_tz, problem = stored, stored_tz, ""
    move, next_at, paused = False, next_run_at, None  # paused None: leave the flag as it is
    found = None
    # The kwargs are the values of the job's scheduled runs: checked here, or refused for this job
    # alone (it keeps the values it had; with none that can run it, it is paused until fixed).
    new_params, refused, runnable, unknown = executions.loaded(stored_params), "", True, ""
    if enabled is not None and tracked.code_of(job_task) is not None:  # a tracked periodic task: its arguments
        new_params, refused, runnable = tracked.read_message(args, kwargs, executions.loaded(stored_params))
        unknown = selection.unregistered(str(periodic_name))
    elif enabled is not None:
        new_params, refused, runnable = schedule_problems.read_kwargs(code, kwargs, executions.loaded(stored_params))
    if fired and tracked.code_of(job_task) is not None:  # recorded as it fires (tracking.fires): no slot ahead
        said = "; ".join(filter(None, [refused, unknown]))
        kept = "keeping its previous arguments" if refused else "sent as it fires"
        return _fired(row, new_params, said), (schedule_problems.Problem(code=code, name=name, problem=said, kept=kept)
                                               if said and said != known_problem else None)
    window_edited = enabled is not None and (opens, closes) != (opened, closed)
    if window_edited:
        logger.info("cron job %s: active window %s to %s", name, _iso_or_none(opens), _iso_or_none(closes))
    if enabled is not None:
        crontab = (minute, hour, dom, moy, dow, str(tz or "")) if minute is not None else None
        interval = (every, period) if every is not None else None
        if (crontab, interval) not in readings:
            readings[crontab, interval] = schedule_problems.read_schedule(crontab, interval, now)
        reading = readings[crontab, interval]
        if reading.schedule is not None:
            effective = reading.schedule
            schedule_text = effective.expression
            schedule_tz = effective.timezone if isinstance(effective, schedules.Cron) else job_tz
            changed = (schedule_text, schedule_tz) != (stored, stored_tz)
            if enabled and (changed or next_run_at is None or window_edited):
                # A new window starts the job afresh, like a resume: slots outside the old window
                # are not caught up when the new one takes them in.
                move, next_at = True, opening(effective, reading.first, opens)
                if stored and changed:  # an edit, not a job's first schedule
                    logger.info("cron job %s: schedule %s; next slot %s", name, effective,
                                slots.iso(next_at) if next_at else "-")
            if known_problem and not refused and not unknown:
                logger.warning("cron job %s: its schedule can drive it again (%s)", name, effective)
        else:
            problem = reading.problem
            if enabled and next_run_at is None:  # resumed, or never scheduled: the previous schedule
                move, next_at = True, schedule_problems.previous_next(stored, stored_tz, now)
        schedule_refused = bool(problem)
        if refused:
            problem = f"{problem}; {refused}" if problem else refused
            if not runnable:
                move, next_at = True, None
        if unknown:  # said, not held: a task registered later (a deploy) runs the next slot
            problem = f"{problem}; {unknown}" if problem else unknown
        if not enabled:
            move, next_at = True, None
        paused = not enabled or (bool(problem) and next_at is None)
        if problem:
            keeping = [f"keeping {stored!r}"] if schedule_refused else []
            keeping += ["keeping its previous parameters"] if refused else []
            keeping += ["sent as scheduled"] if unknown else []
            kept = "disabled" if not enabled else "paused" if next_at is None else ", ".join(keeping)
            logger.error("cron job %s: its periodic task's schedule cannot drive it (%s); %s until it is fixed",
                         name, problem, kept)
            if problem != known_problem:
                found = schedule_problems.Problem(code=code, name=name, problem=problem, kept=kept)
    linked = enabled is not None  # without a periodic task (after=, or gone from the code) the window stays
    schedule_problems.refuse_past_the_end(next_at, opens if linked else None, jitter_ms)
    return edit_writes.Update(
        job_id=job_id, version=version, schedule=schedule_text, tz=schedule_tz or "", move=move, next_run_at=next_at,
        problem=problem, paused=paused, opens=opens if linked else opened, closes=closes if linked else closed,
        one_off=bool(one_off) and linked, params=None if new_params is None else json.dumps(new_params)), found


def _fired(row: tuple[Any, ...], new_params: dict[str, Any] | None, refused: str) -> edit_writes.Update:
    """A tracked clocked or solar periodic task's job row as its edit leaves it: no schedule and no next
    slot (``DatabaseScheduler`` says when it fires), never paused here (a one-off is disabled once it
    fired, while its run may not have started), its arguments read."""
    return edit_writes.Update(
        job_id=row[0], version=row[1], schedule="", tz="", move=True, next_run_at=None, problem=refused, paused=None,
        opens=None, closes=None, one_off=False, params=None if new_params is None else json.dumps(new_params))


#: At a sync, the jobs whose periodic task's kwargs no longer read as their values (``schedule_problems``).
recheck_params = schedule_problems.recheck_params


def opening(schedule: schedules.Schedule, first: dt.datetime | None, opens: dt.datetime | None) -> dt.datetime | None:
    """The job's next slot: ``first``, or the first slot of its window when that opens later.
    ``InvalidSchedule`` when the window opens after the calendar's last slot (9999-12-31)."""
    if first is None or opens is None or first >= opens:
        return first
    try:
        return schedule.next_after(opens - dt.timedelta(microseconds=1))
    except exceptions.InvalidSchedule:
        raise exceptions.InvalidSchedule(f"its window opens at {slots.iso(opens)}, and the schedule has no slot "
                                         "after that before the calendar ends", value=schedule.expression) from None


def note_downstream(edited: list[int] | None = None) -> None:
    """Record (and log) on each job declared with ``after=`` below the ``edited`` jobs (None: every
    one) whether its upstreams' schedules in effect are still one schedule: an admin edit of one
    upstream can break that for it."""
    for name, problem in dependencies.note_in_effect_problems(edited):
        if problem:
            logger.warning("cron job %s: %s", name, problem)
        else:
            logger.info("cron job %s: its upstream jobs share one schedule again", name)


