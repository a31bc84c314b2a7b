"""The reconciler: nothing stays stuck, nothing goes silently missing.

A pass has four steps, each bounded by ``RECONCILE["BATCH"]`` rows:

1. **Expired leases.** An execution still RUNNING after its lease ran out lost its worker
   (the whole worker died, so no parent recorded it). The attempt ends LOST; if the job's
   row allows another attempt the execution becomes RETRYING and its message is sent again.
2. **Stranded messages.** A PENDING execution that no worker started within
   ``PENDING_GRACE`` seconds (beat's publish failed, the broker lost the message), or a
   RETRYING one whose retry message never came. Slots dispatched by beat follow the job's
   catch-up policy as it is now (the job's row): ``all`` sends them again, as catch-ups (a
   ``BEAT`` slot becomes ``CATCH_UP`` before it is sent, so it waits for a live run of its job
   instead of being skipped), ``latest`` sends the slot again as it was (``BEAT``: skipped if
   it meets a live run, like the newest slot beat sends after an outage) only if no newer slot
   of the job was dispatched since, ``none`` records them MISSED. Anything else (enqueued,
   admin, backfill, one-off, downstream, retries) is sent again with its own trigger. Each is
   sent at most ``REPUBLISH_LIMIT`` times, then LOST.
   First the broker is asked where their messages are (``inflight``): a message still queued or
   held by a worker is late, not lost, and left alone. When the broker cannot tell (a RabbitMQ
   backlog) the execution is sent again, spaced and at most ``REPUBLISH_LIMIT`` times, then left
   waiting (``resends``). When the broker cannot be asked at all (it is down), the pass decides
   nothing about stranded executions: it logs that, and marks when (``leadership.BROKER_UNANSWERED``,
   served by ``metrics``).
3. **Undispatched slots.** A job whose next slot is more than ``MISSED_GRACE`` seconds
   overdue has no running beat. Slots its catch-up policy will not run later are recorded
   MISSED now (the newest one is left for beat under ``latest``; ``all`` waits for beat, but for
   the slots older than its ``catch_up_window``, which never run).

   **Undecided downstream slots.** An upstream execution (``after=``) that ended in the last
   hour, at least ``PENDING_GRACE`` ago, while its downstream job's row existed, whose
   downstream slot has no execution (the edge was written after it ended: a deploy that
   declared the dependency) is decided now, as its final write would have (``dependencies``), the
   skips it writes recorded and announced like any (``outcomes.decided_late``).

   **Late and long runs.** A PENDING execution not started its job's ``start_deadline`` after it
   was due, and a RUNNING one its job's ``max_runtime`` after it started, are marked and alerted
   (LATE, LONG_RUNNING) once each, the mark and the alert rows in one transaction (``timing``).

   **Jobs removed from the code.** First of all (before step 1), what runs of a job removed from the code
   left since the deploy (``removals.leftovers``): a waiting execution is closed SKIPPED (``REMOVED``),
   a running one whose lease ran out LOST (``JOB_REMOVED``), neither retried, re-sent nor alerted.

4. **Undelivered alerts.** Alert rows still PENDING ``PENDING_GRACE`` seconds after their
   last delivery attempt (the delivery task was lost) are queued again.

Once an hour (a lease row, ``reconciler-tidy``, taken and left to run out), a pass also deletes
the heartbeat rows of beats gone for a week, alert rows settled more than
``ALERT_RETENTION_DAYS`` ago and schedule changes older than ``AUDIT_RETENTION_DAYS``
(``retention.tidy``).

Each step finds its rows job by job through the ``(job, status)`` index, so a pass reads
the few open executions, not the history, and adds no index to the hot path.

Every change is a conditional statement that locks the job's row first, like the
worker's claim, so passes on many workers at once (and a live beat) cannot double
anything; a lease row on the database clock (``leadership``, name ``reconciler``) makes the
other workers skip a pass that is running. It is a row, not a session advisory lock, so it
works behind a connection pooler in transaction mode; a worker that dies mid-pass leaves it
until it runs out (``pass_lease_seconds``), and a pass that outlives it only overlaps another,
which is safe. Every "is it late" decision compares with the database's clock: steps 1, 2 and 4
in SQL (``now()``), step 3 with ``leadership.database_now()``, so a worker whose clock is off
neither records slots early nor misses them.
The workers run a pass every ``RECONCILE["INTERVAL"]`` seconds (a timer thread started
when the worker is ready); ``cron_celery.reconcile`` is also a Celery task, and
``manage.py reconcile_cron`` runs one pass by hand.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

from celery import current_app, shared_task, signals
from django.db import DatabaseError, close_old_connections, connection, transaction

from cron_celery import alerts, catch_up, conf, enums, schedules, slots
from cron_celery.alerts import delivery
from cron_celery.beat import planning
from cron_celery.decisions import dependencies, dispatch, leadership, pauses, removals, repairs, resends, timing
from cron_celery.declaring import registry
from cron_celery.reconciler import inflight, retention
from cron_celery.run import outcomes, resumes, tasks

logger = logging.getLogger(__name__)
S = enums.Status
#: The name of the lease row that lets one pass run at a time across all workers.
PASS_LEASE = "reconciler"
#: The lease row that lets one pass an hour tidy old heartbeat and alert rows.
TIDY_LEASE, TIDY_SECONDS = "reconciler-tidy", 3600.0


@dataclasses.dataclass(kw_only=True)
class Report:
    """What one pass did."""

    ran: bool = True  # False: another worker's pass was running
    lost: int = 0  # attempts whose lease expired (retried or final)
    retried: int = 0  # of those, executions sent again for another attempt
    resent: int = 0  # stranded PENDING or RETRYING executions sent again
    unanswered: int = 0  # stranded executions left alone: the broker could not be asked where their messages are
    capped: int = 0  # stranded executions the broker cannot tell about, sent REPUBLISH_LIMIT times: left waiting
    missed: int = 0  # MISSED rows written (stranded or undispatched slots)
    abandoned: int = 0  # executions LOST after REPUBLISH_LIMIT sends
    waiting: int = 0  # late executions whose message is still queued or held by a worker: left alone
    alerts: int = 0  # undelivered alerts queued again
    downstream: int = 0  # downstream slots decided late (their upstream ended before the edge existed)
    late: int = 0  # executions found not started by their job's start_deadline (alerted LATE)
    long_running: int = 0  # executions found running past their job's max_runtime (alerted LONG_RUNNING)
    tidied: int = 0  # old heartbeat, settled alert and dashboard rollup rows deleted (once an hour)
    removed: int = 0  # executions of jobs removed from the code closed (``removals.leftovers``): none alerted
    resumed: int = 0  # jobs whose pause ended (``pauses.end_due``), resumed by this pass

    def __str__(self) -> str:
        if not self.ran:
            return "skipped (another pass is running)"
        fields = dataclasses.asdict(self)
        fields.pop("ran")
        return ", ".join(f"{key} {value}" for key, value in fields.items())


def pass_lease_seconds(options: dict[str, Any]) -> float:
    """How long a pass's lease lasts: far longer than a pass takes (a pass that outlives it only
    overlaps the next, which is safe), and short enough that a worker killed mid-pass holds up
    the others' passes for no more than a minute or two intervals."""
    return max(60.0, 2 * float(options["INTERVAL"]))


def run_pass(now: dt.datetime | None = None) -> Report:
    """One bounded pass of the four steps (see the module's docstring). ``now`` (tests only)
    replaces the database's clock in step 3."""
    options = conf.settings.RECONCILE
    token = uuid.uuid4().hex
    me = f"{socket.gethostname()}:{os.getpid()}"
    if not leadership.hold(PASS_LEASE, token, me, pass_lease_seconds(options)):
        return Report(ran=False)
    try:
        report = Report()
        report.removed = removals.leftovers()  # before the steps below could retry, re-send or alert them
        report.resumed = _end_pauses()  # a pause ends with no beat running too
        _expired_leases(report, int(options["BATCH"]))
        _stranded(report, options, me)
        _undispatched(report, now or leadership.database_now(), options)
        _downstream(report, options)
        report.alerts = delivery.redeliver(float(options["PENDING_GRACE"]), int(options["BATCH"]))
        _tidy(report, int(options["BATCH"]))
        _timing(report, int(options["BATCH"]))
        if (report.lost or report.resent or report.missed or report.abandoned or report.alerts or report.tidied
                or report.downstream or report.late or report.long_running or report.removed
                or report.unanswered or report.capped or report.resumed):
            logger.warning("cron_celery reconciler: %s", report)
        leadership.mark(leadership.RECONCILED, me)
        return report
    finally:
        leadership.release(PASS_LEASE, token)


def _end_pauses() -> int:
    """Resume the jobs whose pause has ended, and send the runs their pause held."""
    resumed = pauses.end_due()
    for job_id in resumed:
        resumes.release_job(current_app, job_id)
    return len(resumed)


def _downstream(report: Report, options: dict[str, Any]) -> None:
    decided = outcomes.decided_late(int(options["BATCH"]), float(options["PENDING_GRACE"]))
    report.downstream += len(decided)
    for execution_id in decided:
        tasks.send_downstream(current_app, execution_id)


def _timing(report: Report, batch: int) -> None:
    """Late and long runs, each marked and alerted once (the mark and its alert rows commit together).
    A statement the database refuses here is logged, and the pass's other steps are already done."""
    for mark, event in ((timing.mark_late, enums.Event.LATE), (timing.mark_long_running, enums.Event.LONG_RUNNING)):
        try:
            with transaction.atomic():
                flagged = mark(batch)
                alerts.record_timing(flagged, event)
        except DatabaseError:
            logger.exception("cron_celery reconciler: the %s check failed; the next pass tries again", event)
            continue
        for found in flagged:
            logger.warning("execution %s of %s: %s (since %s)", found.execution_id, found.task_name,
                           "not started by its start_deadline" if event == enums.Event.LATE
                           else "running past its max_runtime", slots.iso(found.since),
                           extra={"execution": found.execution_id})
        if event == enums.Event.LATE:
            report.late += len(flagged)
        else:
            report.long_running += len(flagged)


def _tidy(report: Report, batch: int) -> None:
    """Once an hour across all workers (a lease row that is taken and never released, so it runs
    out an hour later): delete old heartbeat, alert, rollup and schedule change rows (``retention.tidy``)."""
    if leadership.hold(TIDY_LEASE, uuid.uuid4().hex, f"{socket.gethostname()}:{os.getpid()}", TIDY_SECONDS):
        tidied = retention.tidy(batch)
        report.tidied = tidied.heartbeats + tidied.alerts + tidied.rollups + tidied.schedule_changes


def _expired_leases(report: Report, batch: int) -> None:
    rows = repairs.expired_leases(batch)
    for execution_id, job_id, task_name, task_id in rows:
        ended = outcomes.dead(
            registry.by_task_name(task_name), job_id=job_id, execution_id=execution_id, status=S.LOST,
            error_code="LEASE_EXPIRED",
            message="The worker stopped renewing the lease (it died or lost the database); "
                    "recorded by the reconciler.",
        )
        if ended is None:
            continue
        report.lost += 1
        # Under the execution's own task id, by which the stranded check finds its message.
        if ended.status == S.RETRYING and _send(task_name, ended.execution_id, ended.slot, ended.trigger,
                                                task_id or None):
            report.retried += 1
        job = registry.by_task_name(task_name)
        if job is not None:  # the job's live run is over: an execution waiting for it may start
            tasks.send_waiting(current_app, job)


def _stranded(report: Report, options: dict[str, Any], me: str) -> None:
    grace = float(options["PENDING_GRACE"])
    rows = repairs.stranded(grace, int(options["BATCH"]))
    verdicts = _where_are({str(row[6]): str(row[7]) for row in rows if row[6]})
    if verdicts is None:
        # A broker that cannot be asked is not a broker that lost the messages: after a restart
        # they arrive. Nothing is recorded, sent or counted; the next pass asks again.
        report.unanswered += len(rows)
        logger.warning("cron_celery reconciler: could not ask the broker where the messages of %d stranded "
                       "execution(s) are: left alone until it answers", len(rows))
        leadership.mark(leadership.BROKER_UNANSWERED, me)
        return
    limit = int(options["REPUBLISH_LIMIT"])
    late: list[tuple[dt.datetime, int]] = []
    for (execution_id, job_id, slot, status, trigger, republished, task_id, task_name, job_catch_up, waits,
         newer, created_at, too_old) in rows:
        verdict = verdicts.get(task_id, inflight.GONE) if task_id else inflight.GONE
        if verdict == inflight.QUEUED:
            # Late, not lost: behind a backlog, prefetched, or waiting for its countdown.
            if repairs.mark_late(execution_id):
                report.waiting += 1
                late.append((created_at, execution_id))
            continue
        if verdict == inflight.UNKNOWN:
            # The broker cannot tell (a RabbitMQ queue with a backlog): send it again, each time
            # after a longer gap and at most ``limit`` times, then leave it waiting; never give it
            # up for that. The claim runs it once, whichever copy arrives first.
            if republished >= limit:
                if resends.held(execution_id, republished, grace):
                    report.capped += 1
                continue
            sent_as = _resent_as(job_id, execution_id, status, trigger, job_catch_up)
            if sent_as and _send(task_name, execution_id, slot, sent_as, task_id or None) and resends.counted(
                    execution_id, republished, grace):
                report.resent += 1
            continue
        if waits:
            # Asked for, it waited its turn and its message is gone (dropped when it waited): send
            # it again, never give it up. The claim runs it once.
            if _send(task_name, execution_id, slot, trigger, task_id or None) and repairs.mark_late(execution_id):
                report.resent += 1
            continue
        by_beat = status == S.PENDING and trigger in (enums.Trigger.BEAT, enums.Trigger.CATCH_UP)
        if by_beat and (job_catch_up == enums.CatchUp.NONE or (job_catch_up == enums.CatchUp.LATEST and newer)
                        or too_old):
            policy = "its catch-up policy is 'none'" if job_catch_up == enums.CatchUp.NONE else \
                "a newer slot was dispatched since (catch-up 'latest')" if not too_old else \
                "it is older than the job's catch_up_window"
            if outcomes.unstarted(
                registry.by_task_name(task_name), job_id=job_id, execution_id=execution_id, slot=slot,
                status=S.MISSED, error_code="NOT_DELIVERED", stranded_for=grace,
                message=f"Missed: no worker received this slot within {grace:g} s (was the broker down?), "
                        f"and it is not run late: {policy}.",
            ):
                report.missed += 1
            continue
        if republished >= limit:
            if outcomes.unstarted(
                registry.by_task_name(task_name), job_id=job_id, execution_id=execution_id, slot=slot,
                status=S.LOST, error_code="NOT_DELIVERED", stranded_for=grace,
                message=f"Lost: no worker started it although its message was sent {republished + 1} times.",
            ):
                report.abandoned += 1
            continue
        sent_as = _resent_as(job_id, execution_id, status, trigger, job_catch_up)
        if sent_as and _send(task_name, execution_id, slot, sent_as, task_id or None):  # counted only once sent
            repairs.mark_resent(execution_id)
            report.resent += 1
    if late:
        oldest, execution_id = min(late)
        logger.warning("cron_celery reconciler: %d execution(s) not started yet but still queued or held by a "
                       "worker (the oldest, execution %s, since %s): a backlog, or a queue no worker consumes",
                       len(late), execution_id, oldest.isoformat())
    if report.capped:
        logger.warning("cron_celery reconciler: %d execution(s) sent %d times already while the broker cannot tell "
                       "where their messages are (a backlog?): left waiting, not sent again", report.capped, limit)


def _resent_as(job_id: int, execution_id: int, status: str, trigger: str, job_catch_up: str) -> str:
    """The trigger a stranded execution is sent again with: its own, except for a beat slot of a
    catch-up ``all`` job, which runs late and so is sent as a catch-up (``repairs.as_catch_up``,
    written before the send); '' when it no longer waits to start."""
    if status == S.PENDING and trigger == enums.Trigger.BEAT and job_catch_up == enums.CatchUp.ALL:
        return enums.Trigger.CATCH_UP if repairs.as_catch_up(job_id, execution_id) else ""
    return trigger


def _where_are(task_names: dict[str, str]) -> dict[str, str] | None:
    """Where the messages of these task ids (task id -> task name) are: ``inflight`` verdicts;
    None when the broker could not be asked (down, refusing), at either look.

    A message is taken for gone only when two looks a moment apart both miss it (the second
    where workers hold messages: one may have been taken off its queue in between). On a
    transport ``inflight`` cannot read, every message counts as gone: the grace period alone
    decides, as before."""
    if not task_names:
        return {}
    wanted = {task_id: inflight.queue_of(current_app, name, tasks.message_options(current_app, name))
              for task_id, name in task_names.items()}
    try:
        first = inflight.locate(current_app, wanted)
        if first is None:
            return {}
        gone = {task_id: wanted[task_id] for task_id, verdict in first.items() if verdict == inflight.GONE}
        if gone:
            time.sleep(0.2)
            first.update(inflight.locate(current_app, gone, held_only=True) or {})
    except Exception as error:  # the broker is down: its queues may come back with it
        logger.warning("reconciler could not look for queued messages: %s", error)
        return None
    return first


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
    due = dispatch.due_jobs(cutoff, limit=int(options["BATCH"]), skip_catch_up=enums.CatchUp.ALL)
    plans: dict[planning.PlanKey, catch_up.CatchUpPlan | None] = {}
    parsed: dict[tuple[str, str], schedules.Schedule] = {}
    decisions = []
    for row in due:
        decision = planning.plan(row, cutoff, plans, parsed)
        if decision is None or not decision.missed:
            continue
        # Record only what the policy will never run; beat dispatches the rest when it is back.
        keep = decision.run[0] if decision.run else decision.next_run_at
        decisions.append(dataclasses.replace(decision, run=[], next_run_at=keep, last=False))
    if decisions:
        _advanced, _publish, missed = outcomes.dispatched(decisions)  # the MISSED slots with their alerts
        report.missed += missed


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
    try:  # the edges of after= as this worker's code declares them (the beat writes them too)
        dependencies.sync(registry.all_jobs())
        # (A slot left waiting for an upstream it drops is not decided here: a worker of the old code may
        # start after the new beat. That is the deploy's schedule sync's, ``outcomes.decided_waiting``.)
        # (Jobs it does not declare are not retired here: in a rollout, a worker of the old code may
        # start after the new beat. That is the deploy's schedule sync's, ``removals``.)
    except DatabaseError as error:
        logger.warning("could not write the jobs' dependencies (after=) at worker start: %s", error)
        connection.close()
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
