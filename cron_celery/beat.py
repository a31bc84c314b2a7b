"""``celery -A proj beat -S cron_celery.beat.Scheduler``: dispatch every slot once.

Only the leader dispatches: it holds a Redlock lease (``BEAT_LEASE_SECONDS``, renewed three
times per lease); a standby beat tries each tick and takes over once the lease expires; a
beat that loses the lease stops dispatching at once. Leadership only saves work — the
database write in ``claims.dispatch`` is what makes each slot dispatched once, even when
two beats both believe they lead.

Each tick asks the database for the jobs that are due (``next_run_at <= now``, indexed),
plans their slots by the catch-up policy, records them, and publishes only the executions
this beat inserted. Plain Celery beat entries (``beat_schedule``) are run by Celery's own
scheduler as usual, untracked.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

from celery import beat
from django.utils import timezone
from pottery import Redlock
from pottery.exceptions import ExtendUnlockedLock, QuorumIsImpossible, ReleaseUnlockedLock

from cron_celery import claims, conf, locks, models, registry, runs, schedules, tasks

logger = logging.getLogger(__name__)

LEADER_KEY = "cron_celery:beat-leader"


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGTERM/SIGINT until the block ends.

    Celery's beat turns SIGTERM into ``SystemExit`` wherever the main thread is; between the
    commit of a PENDING row and its publish that would strand the row. The signal is
    delivered as soon as the round is over.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = {signal.SIGTERM, signal.SIGINT}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


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
            candidate = Redlock(key=LEADER_KEY, masters=locks.masters(), auto_release_time=self.ttl,
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


class Scheduler(beat.Scheduler):  # type: ignore[misc]
    """Celery beat scheduler for cron_celery jobs (and plain beat entries)."""

    #: Longest sleep between ticks, in seconds.
    tick_seconds = 1.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.leadership = Leadership(float(conf.settings.BEAT_LEASE_SECONDS))
        self._jobs: dict[int, registry.Job] = {}
        super().__init__(*args, **kwargs)

    def setup_schedule(self) -> None:
        super().setup_schedule()
        self.load_jobs()

    def load_jobs(self) -> None:
        """Make sure every scheduled job has its row and a first ``next_run_at``."""
        now = timezone.now()
        jobs: dict[int, registry.Job] = {}
        for job in registry.all_jobs():
            if job.schedule is None:
                continue
            job_id = runs.job_id(job, refresh=True)
            # A job new to the scheduler starts at its next slot: nothing to catch up.
            claims.init_next_run_at(job_id, job.schedule.next_after(now))
            jobs[job_id] = job
        self._jobs = jobs

    def tick(self, *args: Any, **kwargs: Any) -> float:
        plain = super().tick(*args, **kwargs)
        if not self.leadership.check():
            return min(plain, self.tick_seconds)
        try:
            with signals_deferred():
                self.dispatch_due()
        except Exception:  # a failed round is retried next tick; beat must not die
            logger.exception("cron_celery beat: dispatch round failed")
        return min(plain, self.tick_seconds)

    def dispatch_due(self) -> int:
        """One round: record and publish every due slot; returns how many were published."""
        now = timezone.now()
        published = 0
        due = claims.due_jobs(now, limit=conf.settings.BEAT_BATCH, among=list(self._jobs))
        for job_id, next_run_at in due:
            job = self._jobs[job_id]
            assert job.schedule is not None  # only scheduled jobs are loaded
            plan = schedules.plan_catch_up(job.schedule, next_run_at, now, job.catch_up,
                                           limit=conf.settings.CATCH_UP_LIMIT)
            done = claims.dispatch(job=job, job_id=job_id, expected_next_run_at=next_run_at,
                                   next_run_at=plan.next_run_at, run=plan.run, missed=plan.missed)
            for execution_id, slot in done.to_publish:
                published += self.publish(job, execution_id, slot, late=execution_id in done.catch_up_ids)
        return published

    def publish(self, job: registry.Job, execution_id: int, slot: Any, *, late: bool) -> int:
        trigger = models.Trigger.CATCH_UP if late else models.Trigger.BEAT
        headers = {tasks.HEADER_SLOT: schedules.iso(slot), tasks.HEADER_EXECUTION: execution_id,
                   tasks.HEADER_TRIGGER: trigger}
        try:
            result = self.app.send_task(job.task_name, headers=headers)
        except Exception:
            logger.exception("could not publish %s %s (execution %s); it stays PENDING",
                             job.name, schedules.iso(slot), execution_id,
                             extra={"job": job.code, "slot": schedules.iso(slot), "execution": execution_id})
            return 0
        claims.set_celery_task_id(execution_id, result.id)
        return 1

    def close(self) -> None:
        self.leadership.release()
        super().close()

