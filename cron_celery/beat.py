"""``celery -A proj beat -S cron_celery.beat.Scheduler``: dispatch every slot once.

Only the leader dispatches: it holds a Redlock lease (``BEAT_LEASE_SECONDS``, renewed three
times per lease); a standby beat tries each tick and takes over once the lease expires; a
beat that loses the lease stops dispatching at once. Leadership only saves work — the
database write in ``claims.dispatch_many`` is what makes each slot dispatched once, even when
two beats both believe they lead.

Each tick asks the database whether any job is due (``next_run_at <= now``, indexed) or
was edited in the admin; if so it takes in the edits (``schedule_sync.apply_edits``),
plans the due slots by each job's catch-up policy, records them for many jobs in one
statement (``claims.dispatch_many``), and publishes only the executions it inserted.
Other periodic tasks (made in the admin, or ``beat_schedule`` entries) are sent by
django-celery-beat's ``DatabaseScheduler``, untracked, from the leader only.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import signal
import socket
import threading
import time
import zoneinfo
from collections.abc import Iterator
from typing import Any

from django.utils import timezone
from django_celery_beat.schedulers import DatabaseScheduler
from pottery import Redlock
from pottery.exceptions import ExtendUnlockedLock, QuorumIsImpossible, ReleaseUnlockedLock

from cron_celery import checks, claims, conf, exceptions, health, locks, outcomes, schedule_sync, schedules, tasks

logger = logging.getLogger(__name__)



def leader_key() -> str:
    """The Redlock key of the beat leader's lease (one per database: see ``conf.lock_prefix``)."""
    return f"{conf.lock_prefix()}:beat-leader"


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGTERM/SIGINT until the block ends.

    Celery's beat turns SIGTERM into ``SystemExit`` wherever the main thread is; between the
    commit of a PENDING row and its publish that would strand the row. While the block runs
    the signals are only noted; they are raised again, to the handlers that were in place,
    as soon as it ends. (Python handlers always run in the main thread, whichever thread
    the kernel delivered the signal to, so a signal mask would not do.)
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT)}
    for number in previous:
        signal.signal(number, lambda signum, _frame: caught.append(signum))
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler if handler is not None else signal.SIG_DFL)
        for signum in dict.fromkeys(caught):
            signal.raise_signal(signum)


class Leadership:
    """The beat leader lease. With no Redis masters configured every beat leads."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self.identity = f"{socket.gethostname()}:{os.getpid()}"
        self._lock: Redlock | None = None
        self._renewed = 0.0
        self.leading = False

    def check(self) -> bool:
        """Acquire or renew; returns whether this beat may dispatch now."""
        if os.environ.get("CRON_CELERY_BEAT_ALWAYS_LEAD") == "1" or not conf.lock_masters():
            self.leading = True
            return True
        now = time.monotonic()
        try:
            if self.leading and self._lock is not None:
                if now - self._renewed >= self.ttl / 3:
                    self._lock.extend()
                    self._renewed = now
                return True
            candidate = Redlock(key=leader_key(), masters=locks.masters(), auto_release_time=self.ttl,
                                raise_on_redis_errors=True, num_extensions=2**62)
            if candidate.acquire(blocking=False):
                self._lock, self._renewed, self.leading = candidate, now, True
                logger.warning("beat %s is now the leader", self.identity)
                return True
            return False
        except ExtendUnlockedLock:
            logger.warning("beat %s lost the leader lease; standing by", self.identity)
            self.leading, self._lock = False, None
            return False
        except QuorumIsImpossible as error:
            # The database still dispatches each slot once: keep going, say so.
            locks.warn_degraded("beat-leader", error)
            self.leading = True
            return True

    def release(self) -> None:
        if self._lock is not None and self.leading:
            with contextlib.suppress(ReleaseUnlockedLock, QuorumIsImpossible):
                self._lock.release()
        self._lock, self.leading = None, False


PlanKey = tuple[str, str, dt.datetime, str]


def plan(row: claims.DueJob, now: dt.datetime, plans: dict[PlanKey, schedules.CatchUpPlan | None],
         parsed: dict[tuple[str, str], schedules.Schedule]) -> claims.Decision | None:
    """The decision for one due job. ``plans`` shares the work between jobs with the same
    schedule that fell due together (a thousand every-minute jobs plan once); ``parsed``
    caches schedules by (expression, timezone)."""
    key = (row.schedule, row.timezone, row.next_run_at, row.catch_up)
    if key not in plans:
        try:
            if (row.schedule, row.timezone) not in parsed:
                parsed[(row.schedule, row.timezone)] = schedules.parse_expression(row.schedule, row.timezone)
            schedule = parsed[(row.schedule, row.timezone)]
        except exceptions.InvalidSchedule as error:
            logger.error("cron job %s has no usable schedule (%s); run sync_cron_schedules", row.name, error)
            plans[key] = None
        else:
            plans[key] = schedules.plan_catch_up(schedule, row.next_run_at, now, row.catch_up,
                                                 limit=conf.settings.CATCH_UP_LIMIT)
    planned = plans[key]
    if planned is None:
        return None
    if planned.unrecorded_before is not None:
        logger.warning("cron job %s: down since %s; slots before %s are not recorded as MISSED",
                       row.name, schedules.iso(row.next_run_at), schedules.iso(planned.unrecorded_before))
    return claims.Decision(job_id=row.job_id, expected_next_run_at=row.next_run_at,
                           next_run_at=planned.next_run_at, run=planned.run, missed=planned.missed,
                           tz=zoneinfo.ZoneInfo(row.timezone))


class Scheduler(DatabaseScheduler):  # type: ignore[misc]
    """Celery beat scheduler for cron_celery jobs.

    Periodic tasks that are not cron jobs (made in the admin, or ``beat_schedule``
    entries) are left to django-celery-beat's ``DatabaseScheduler``, untracked — but only
    the leader sends them, so two beats do not send them twice either.
    """

    #: Longest sleep between ticks, in seconds.
    tick_seconds = 1.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        checks.refuse_to_start("beat")  # before the first sync writes anything
        self.leadership = Leadership(float(conf.settings.BEAT_LEASE_SECONDS))
        self._schedules: dict[tuple[str, str], schedules.Schedule] = {}
        self.published = 0  # executions sent since start
        self._beat_seen, self._beat_leading = -1e9, False
        super().__init__(*args, **kwargs)

    def setup_schedule(self) -> None:
        report = schedule_sync.sync()
        logger.info("cron_celery: schedules synced: %s", report)
        super().setup_schedule()

    def enabled_models_qs(self) -> Any:
        """django-celery-beat's own entries: every enabled periodic task but ours."""
        return super().enabled_models_qs().filter(cron_job__isnull=True)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        leading = self.leadership.check()
        self.heartbeat(leading)
        if not leading:
            return self.tick_seconds
        plain = super().tick(*args, **kwargs)
        wait = self.tick_seconds
        try:
            with signals_deferred():
                wait = self.dispatch_due()
        except Exception:  # a failed round is retried next tick; beat must not die
            logger.exception("cron_celery beat: dispatch round failed")
        return max(0.005, min(float(plain), wait))

    def dispatch_due(self) -> float:
        """Record and publish every due slot; returns how long to sleep until the next one
        (at most ``tick_seconds``, so edits and other beats are noticed within a second).

        Idle, this is one query. Due jobs are planned in batches of ``BEAT_BATCH``, each
        batch recorded in one statement and published over one broker connection.
        """
        deadline = time.monotonic() + self.leadership.ttl / 3
        while True:
            next_at, edited = claims.next_due()
            now = timezone.now()
            if edited:  # take edits in first: they may move or pause what is due
                schedule_sync.apply_edits(now)
                if time.monotonic() > deadline:
                    return 0.0
                continue
            if next_at is None or next_at > now:
                ahead = (next_at - now).total_seconds() if next_at is not None else self.tick_seconds
                return min(self.tick_seconds, ahead)
            due = claims.due_jobs(now, limit=conf.settings.BEAT_BATCH)
            plans: dict[PlanKey, schedules.CatchUpPlan | None] = {}
            decisions = [decision for row in due if (decision := self.plan(row, now, plans)) is not None]
            _advanced, to_publish, missed = claims.dispatch_many(decisions)
            self.published += self.publish({row.job_id: row for row in due}, to_publish)
            if missed:  # alerts for the outage, one per job
                outcomes.missed(claims.newest_missed([d.job_id for d in decisions if d.missed]))
            if time.monotonic() > deadline:
                return 0.0

    def plan(self, row: claims.DueJob, now: dt.datetime, plans: dict[PlanKey, schedules.CatchUpPlan | None]
             ) -> claims.Decision | None:
        return plan(row, now, plans, self._schedules)

    def publish(self, jobs: dict[int, claims.DueJob], to_publish: list[claims.ToPublish]) -> int:
        """Send the executions this beat inserted, oldest slot first, over one connection and,
        where the broker transport can (Redis, kombu >= 5.7), in pipelined batches.

        If the broker fails, what was not sent stays PENDING (and is logged).
        """
        if not to_publish:
            return 0
        sent = 0
        try:
            with self.app.producer_or_acquire() as producer:
                batch = getattr(producer, "batch", None)
                with batch(max_size=conf.settings.BEAT_BATCH) if batch else contextlib.nullcontext():
                    for item in to_publish:
                        self.app.send_task(jobs[item.job_id].task, task_id=item.celery_task_id,
                                           headers=tasks.headers(item.execution_id, item.slot, item.trigger),
                                           producer=producer)
                        sent += 1
        except Exception:
            logger.exception("could not publish all of %d executions; those not sent stay PENDING",
                             len(to_publish))
            return 0
        return sent

    def heartbeat(self, leading: bool) -> None:
        """Tell the health check this beat is alive, every few seconds and on every change."""
        now = time.monotonic()
        if leading == self._beat_leading and now - self._beat_seen < min(10.0, self.leadership.ttl / 3):
            return
        try:
            health.beat_seen(self.leadership.identity, leading)
        except Exception:  # health reporting must not stop the schedule
            logger.exception("cron_celery beat: could not record its heartbeat")
            return
        self._beat_seen, self._beat_leading = now, leading

    def close(self) -> None:
        with contextlib.suppress(Exception):
            health.beat_gone(self.leadership.identity)
        self.leadership.release()
        super().close()
