"""The reconciler: nothing stays stuck, nothing goes silently missing.

A pass has four steps, each bounded by ``RECONCILE["BATCH"]`` rows:

1. **Expired leases.** An execution still RUNNING after its lease ran out lost its worker
   (the whole worker died, so no parent recorded it). The attempt ends LOST; if the job's
   row allows another attempt the execution becomes RETRYING and its message is sent again.
2. **Stranded messages.** A PENDING execution that no worker started within
   ``PENDING_GRACE`` seconds (beat's publish failed, the broker lost the message), or a
   RETRYING one whose retry message never came. Slots dispatched by beat follow the job's
   catch-up policy: ``all`` sends them again, ``latest`` only if no newer slot of the job
   was dispatched since, ``none`` records them MISSED. Anything else (enqueued, admin,
   retries) is sent again. Each is sent at most ``REPUBLISH_LIMIT`` times, then LOST.
3. **Undispatched slots.** A job whose next slot is more than ``MISSED_GRACE`` seconds
   overdue has no running beat. Slots its catch-up policy will not run later are recorded
   MISSED now (the newest one is left for beat under ``latest``; ``all`` waits for beat).

4. **Undelivered alerts.** Alert rows still PENDING ``PENDING_GRACE`` seconds after their
   last delivery attempt (the delivery task was lost) are queued again.

Each step finds its rows job by job through the ``(job, status)`` index, so a pass reads
the few open executions, not the history, and adds no index to the hot path.

Every change is a conditional statement that locks the job's row first, like the
worker's claim, so passes on many workers at once (and a live beat) cannot double
anything; a PostgreSQL advisory lock makes the other workers skip a pass that is running.
The workers run a pass every ``RECONCILE["INTERVAL"]`` seconds (a timer thread started
when the worker is ready); ``cron_celery.reconcile`` is also a Celery task, and
``manage.py reconcile_cron`` runs one pass by hand.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import threading
from typing import Any

from celery import current_app, shared_task, signals
from django.db import DatabaseError, close_old_connections, connection
from django.utils import timezone

from cron_celery import alerts, beat, claims, conf, models, outcomes, registry, schedules, tasks

logger = logging.getLogger(__name__)
S = models.Status
EXE = models.CronExecution._meta.db_table
JOB = models.CronJob._meta.db_table
#: ``pg_try_advisory_lock`` key: one pass at a time across all workers.
ADVISORY_KEY = 0x43524F4E  # "CRON"


@dataclasses.dataclass(kw_only=True)
class Report:
    """What one pass did."""

    ran: bool = True  # False: another worker's pass was running
    lost: int = 0  # attempts whose lease expired (retried or final)
    retried: int = 0  # of those, executions sent again for another attempt
    resent: int = 0  # stranded PENDING or RETRYING executions sent again
    missed: int = 0  # MISSED rows written (stranded or undispatched slots)
    abandoned: int = 0  # executions LOST after REPUBLISH_LIMIT sends
    alerts: int = 0  # undelivered alerts queued again

    def __str__(self) -> str:
        if not self.ran:
            return "skipped (another pass is running)"
        fields = dataclasses.asdict(self)
        fields.pop("ran")
        return ", ".join(f"{key} {value}" for key, value in fields.items())


def run_pass(now: dt.datetime | None = None) -> Report:
    """One bounded pass of the four steps (see the module's docstring)."""
    options = conf.settings.RECONCILE
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [ADVISORY_KEY])
        row = cursor.fetchone()
    if not (row and row[0]):
        return Report(ran=False)
    try:
        report = Report()
        _expired_leases(report, int(options["BATCH"]))
        _stranded(report, options)
        _undispatched(report, now or timezone.now(), options)
        report.alerts = alerts.redeliver(float(options["PENDING_GRACE"]), int(options["BATCH"]))
        if report.lost or report.resent or report.missed or report.abandoned or report.alerts:
            logger.warning("cron_celery reconciler: %s", report)
        return report
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [ADVISORY_KEY])


def _expired_leases(report: Report, batch: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT e.id, e.job_id, j.task FROM {JOB} AS j CROSS JOIN LATERAL (
                SELECT id, job_id, lease_until FROM {EXE}
                WHERE job_id = j.id AND status = 'RUNNING' AND lease_until < now()) AS e
            ORDER BY e.lease_until LIMIT %s
            """,
            [batch],
        )
        rows = cursor.fetchall()
    for execution_id, job_id, task_name in rows:
        ended = outcomes.dead(
            registry.by_task_name(task_name), job_id=job_id, execution_id=execution_id, status=S.LOST,
            error_code="LEASE_EXPIRED",
            message="The worker stopped renewing the lease (it died or lost the database); "
                    "recorded by the reconciler.",
        )
        if ended is None:
            continue
        report.lost += 1
        if ended.status == S.RETRYING and _send(task_name, ended.execution_id, ended.slot, ended.trigger):
            report.retried += 1


def _stranded(report: Report, options: dict[str, Any]) -> None:
    grace = float(options["PENDING_GRACE"])
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT e.id, e.job_id, e.slot, e.status, e.trigger, e.republished, e.celery_task_id,
                   j.task, j.catch_up,
                   EXISTS (SELECT 1 FROM {EXE} AS newer WHERE newer.job_id = e.job_id AND newer.slot > e.slot
                           AND newer.trigger IN ('BEAT', 'CATCH_UP'))
            FROM {JOB} AS j CROSS JOIN LATERAL (
                SELECT * FROM {EXE} WHERE job_id = j.id AND status IN ('PENDING', 'RETRYING')
                  AND coalesce(lease_until, created_at) < now() - make_interval(secs => %s)) AS e
            ORDER BY e.job_id, e.slot LIMIT %s
            """,
            [grace, int(options["BATCH"])],
        )
        rows = cursor.fetchall()
    limit = int(options["REPUBLISH_LIMIT"])
    for execution_id, job_id, slot, status, trigger, republished, task_id, task_name, catch_up, newer in rows:
        by_beat = status == S.PENDING and trigger in (models.Trigger.BEAT, models.Trigger.CATCH_UP)
        if by_beat and (catch_up == models.CatchUp.NONE or (catch_up == models.CatchUp.LATEST and newer)):
            policy = "its catch-up policy is 'none'" if catch_up == models.CatchUp.NONE else \
                "a newer slot was dispatched since (catch-up 'latest')"
            if outcomes.unstarted(
                registry.by_task_name(task_name), job_id=job_id, execution_id=execution_id, slot=slot,
                status=S.MISSED, error_code="NOT_DELIVERED",
                message=f"Missed: no worker received this slot within {grace:g} s (was the broker down?), "
                        f"and it is not run late: {policy}.",
            ):
                report.missed += 1
            continue
        if republished >= limit:
            if outcomes.unstarted(
                registry.by_task_name(task_name), job_id=job_id, execution_id=execution_id, slot=slot,
                status=S.LOST, error_code="NOT_DELIVERED",
                message=f"Lost: no worker started it although its message was sent {republished + 1} times.",
            ):
                report.abandoned += 1
            continue
        if _send(task_name, execution_id, slot, trigger, task_id or None):  # counted only once sent
            _mark_resent(execution_id)
            report.resent += 1


def _mark_resent(execution_id: int) -> bool:
    """Count a send and restart the grace period, if the execution still waits."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE {EXE} SET republished = republished + 1, lease_until = now()
            WHERE id = %s AND status IN ('PENDING', 'RETRYING')
            """,
            [execution_id],
        )
        return bool(cursor.rowcount == 1)


def _send(task_name: str, execution_id: int, slot: dt.datetime, trigger: str, task_id: str | None = None) -> bool:
    try:
        tasks.send(current_app, task_name, execution_id=execution_id, slot=slot, trigger=trigger,
                   celery_task_id=task_id)
    except Exception as error:  # the broker is down: the next pass tries again
        logger.warning("reconciler could not send execution %s: %s", execution_id, error)
        return False
    return True


def _undispatched(report: Report, now: dt.datetime, options: dict[str, Any]) -> None:
    cutoff = now - dt.timedelta(seconds=float(options["MISSED_GRACE"]))
    due = claims.due_jobs(cutoff, limit=int(options["BATCH"]), skip_catch_up=models.CatchUp.ALL)
    plans: dict[beat.PlanKey, schedules.CatchUpPlan | None] = {}
    parsed: dict[tuple[str, str], schedules.Schedule] = {}
    decisions = []
    for row in due:
        decision = beat.plan(row, cutoff, plans, parsed)
        if decision is None or not decision.missed:
            continue
        # Record only what the policy will never run; beat dispatches the rest when it is back.
        keep = decision.run[0] if decision.run else decision.next_run_at
        decisions.append(dataclasses.replace(decision, run=[], next_run_at=keep))
    if decisions:
        _advanced, _publish, missed = claims.dispatch_many(decisions)
        report.missed += missed
        if missed:
            outcomes.missed(claims.newest_missed([decision.job_id for decision in decisions]))


@shared_task(name="cron_celery.reconcile", ignore_result=True)
def reconcile() -> str:
    """One reconciler pass, as a Celery task."""
    return str(run_pass())


class Timer:
    """Runs a pass every ``RECONCILE["INTERVAL"]`` seconds in a daemon thread of the worker."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="cron-celery-reconciler", daemon=True)

    def _loop(self) -> None:
        while not self.stop.wait(self.interval):
            try:
                close_old_connections()
                run_pass()
            except DatabaseError as error:
                logger.warning("reconciler pass failed: %s", error)
                connection.close()
            except Exception:
                logger.exception("reconciler pass failed")
        connection.close()


_timer: Timer | None = None


def _worker_ready(**kwargs: Any) -> None:
    global _timer
    interval = float(conf.settings.RECONCILE["INTERVAL"])
    if interval > 0 and _timer is None:
        _timer = Timer(interval)
        _timer.thread.start()


def _worker_stopping(**kwargs: Any) -> None:
    if _timer is not None:
        _timer.stop.set()


def connect() -> None:
    signals.worker_ready.connect(_worker_ready, weak=False, dispatch_uid="cron_celery.reconciler.ready")
    signals.worker_shutdown.connect(_worker_stopping, weak=False, dispatch_uid="cron_celery.reconciler.stop")
