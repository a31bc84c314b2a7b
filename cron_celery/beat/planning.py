"""How the beat plans a due job's slots: which run now, which are recorded MISSED, by its catch-up
policy, window, jitter and one_off flag; and the line it logs for each round."""

from __future__ import annotations

import datetime as dt
import logging
import zoneinfo

from cron_celery import catch_up, conf, schedules, slots
from cron_celery.decisions import dispatch

logger = logging.getLogger("cron_celery.beat")


PlanKey = tuple[str, str, dt.datetime, str, int, dt.datetime | None, dt.datetime | None, float | None]


def log_round(jobs: dict[int, dispatch.DueJob], decisions: list[dispatch.Decision], sent: int, missed: int,
              seconds: float) -> None:
    """One INFO line per dispatch round that found something due, one per job whose slots were
    recorded MISSED (with why), and each slot at DEBUG."""
    if not decisions:
        return
    logger.info("cron_celery beat: dispatched %d slot(s) of %d job(s) in %.0f ms (%d sent, %d recorded MISSED)",
                sum(len(d.run) for d in decisions), len(decisions), seconds * 1000, sent, missed)
    for decision in decisions:
        job = jobs[decision.job_id]
        for slot in decision.run:
            logger.debug("cron_celery beat: %s %s dispatched", job.name, slots.iso(slot))
        if decision.missed:
            window = "" if job.catch_up_window is None else \
                f" (or they are older than its catch_up_window, {job.catch_up_window:g} s)"
            logger.info("cron job %s: %d slot(s) recorded MISSED, %s to %s: not dispatched in time (the beat "
                        "was not running or was behind), and catch_up=%s does not run them late%s", job.name,
                        len(decision.missed), slots.iso(min(decision.missed)), slots.iso(max(decision.missed)),
                        job.catch_up, window)
            for slot in decision.missed:
                logger.debug("cron_celery beat: %s %s recorded MISSED", job.name, slots.iso(slot))


def plan(row: dispatch.DueJob, now: dt.datetime, plans: dict[PlanKey, catch_up.CatchUpPlan | None],
         parsed: dict[tuple[str, str], schedules.Schedule],
         problems: dict[int, str] | None = None) -> dispatch.Decision | None:
    """The decision for one due job. ``plans`` shares the work between jobs with the same
    schedule that fell due together (a thousand every-minute jobs plan once); ``parsed``
    caches schedules by (expression, timezone).

    A job whose stored schedule cannot be planned gets no decision (and never raises, so
    the other jobs of the batch are dispatched); with ``problems`` its reason is put there
    by job id, for the caller to set the job aside. Execution dates are read in the job's
    timezone, like every other writer's (``slots.execution_date``).

    A job with jitter is planned as of ``now`` minus its offset: a slot is due once its offset
    has passed, and it is late (catch-up) only if it is late by more than its grace after that.

    A job with an active window plans only the slots inside it: none before ``active_from`` (the
    first is the window's first slot) and none at or after ``active_until``; those outside are
    neither run nor recorded MISSED. A job whose periodic task is ``one_off`` runs one slot (the
    newest due) and its decision is its last (``Decision.last``). A job with a catch-up window records
    the missed slots older than it MISSED, whatever its policy."""
    key = (row.schedule, row.timezone, row.next_run_at, row.catch_up, row.jitter_ms, row.active_from,
           row.active_until, row.catch_up_window)
    if key not in plans:
        try:
            if (row.schedule, row.timezone) not in parsed:
                parsed[(row.schedule, row.timezone)] = schedules.parse_expression(row.schedule, row.timezone)
            schedule = parsed[(row.schedule, row.timezone)]
            as_of = now - dt.timedelta(milliseconds=row.jitter_ms)
            first = row.next_run_at
            if row.active_from is not None and first < row.active_from:  # slots before the window: never
                first = schedule.next_after(row.active_from - dt.timedelta(microseconds=1))
            window = None if row.catch_up_window is None else dt.timedelta(seconds=row.catch_up_window)
            plans[key] = catch_up.plan_catch_up(schedule, first, as_of, row.catch_up,
                                                 limit=conf.settings.CATCH_UP_LIMIT, end=row.active_until,
                                                 window=window)
        except Exception as error:  # one job's bad row must not stop the batch
            logger.error("cron job %s: its schedule %r (%s) cannot be planned: %s", row.name, row.schedule,
                         row.timezone, error)
            plans[key] = None
    planned = plans[key]
    try:
        tz = zoneinfo.ZoneInfo(row.job_timezone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        logger.error("cron job %s: its timezone %r does not exist", row.name, row.job_timezone)
        planned = None
    if planned is None:
        if problems is not None:
            problems[row.job_id] = unplannable(row)
        return None
    if planned.unrecorded_before is not None:
        logger.warning("cron job %s: down since %s; slots before %s are not recorded as MISSED",
                       row.name, slots.iso(row.next_run_at), slots.iso(planned.unrecorded_before))
    run, missed, last = planned.run, planned.missed, False
    if row.one_off and run:  # django-celery-beat's one_off: this slot, and no other, then disabled
        run, missed, last = run[-1:], [], True
    return dispatch.Decision(job_id=row.job_id, expected_next_run_at=row.next_run_at, next_run_at=planned.next_run_at,
                             run=run, missed=missed, tz=tz, jitter_ms=row.jitter_ms, last=last,
                             catching_up=planned.late)


def unplannable(row: dispatch.DueJob) -> str:
    """Why a due job cannot be planned, in words (for the few that cannot)."""
    try:
        zoneinfo.ZoneInfo(row.job_timezone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return f"the job's timezone {row.job_timezone!r} does not exist"
    try:
        schedule = schedules.parse_expression(row.schedule, row.timezone)
        schedule.next_after(row.next_run_at)
    except Exception as error:
        return f"the schedule in effect, {row.schedule!r} ({row.timezone}), cannot be planned: {error}"
    return f"the schedule in effect, {row.schedule!r} ({row.timezone}), cannot be planned"
