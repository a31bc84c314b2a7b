"""``celery -A proj beat -S cron_celery.beat.Scheduler``: dispatch every slot once.

Only the leader dispatches: it holds the ``beat`` lease row in PostgreSQL (``leadership``;
``BEAT_LEASE_SECONDS`` on the database clock, renewed three times per lease) and, when Redis
masters are configured and a quorum answers, the Redlock lease too (see ``Leadership``); a
standby beat tries each tick and takes over once the lease is released or runs out; a beat
that loses it stops dispatching at once. For cron jobs leadership only saves work — the
database write in ``dispatch.dispatch_many`` is what makes each slot dispatched once, even when
two beats both believe they lead; for django-celery-beat's own periodic tasks it is what
keeps them from being sent twice.

Each tick asks the database whether any job is due (``next_run_at <= now``, indexed) or
was edited in the admin; if so it takes in the edits (``schedule_sync.apply_edits``),
plans the due slots by each job's catch-up policy, records them for many jobs in one
statement (``dispatch.dispatch_many``), and publishes only the executions it inserted.
Other periodic tasks (made in the admin, or ``beat_schedule`` entries) are sent by
django-celery-beat's ``DatabaseScheduler``, untracked, from the leader only, and once per due time
across a change of leader (``plain_tasks``).
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
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

from django.db import DatabaseError, connection
from django.db.models import Q
from django_celery_beat.schedulers import DatabaseScheduler
from pottery import Redlock
from pottery.exceptions import ExtendUnlockedLock, QuorumIsImpossible, ReleaseUnlockedLock

from cron_celery import catch_up, check_errors, conf, schedules, slots
from cron_celery.beat import health, plain_tasks, publishing, schedule_problems, schedule_sync
from cron_celery.beat.planning import PlanKey, log_round, plan
from cron_celery.decisions import audit, dispatch, leadership, oneoffs, pauses
from cron_celery.run import locks, outcomes, resumes, tasks
from cron_celery.tracking import fires, rows

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
    """Which beat leads: the one holding the database lease ``beat``, always.

    The row (``leadership.hold``) is the arbiter, on the database clock, so exactly one beat
    leads whether Redis answers or not. With Redis masters configured the leader also holds
    the Redlock ``beat-leader``: a standby that sees another beat holding it does not ask the
    database, and a leader that sees another beat holding it (Redis came back after an
    outage in which this beat led through the database alone) steps down and releases the
    row, so the Redis holder takes the row at its next tick; a beat that holds the Redlock but
    cannot get the row releases the Redlock. Without a quorum of masters the row alone decides
    (``lock degraded`` is logged). ``CRON_CELERY_BEAT_ALWAYS_LEAD=1`` (tests) makes every
    beat lead.
    """

    #: The name of the lease row.
    LEASE = "beat"

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self.identity = f"{socket.gethostname()}:{os.getpid()}"
        self.token = uuid.uuid4().hex
        self._lock: Redlock | None = None
        self._renewed = 0.0
        self.leading = False

    def check(self) -> bool:
        """Acquire or renew; returns whether this beat may dispatch now."""
        if os.environ.get("CRON_CELERY_BEAT_ALWAYS_LEAD") == "1":
            self.leading = True
            return True
        now = time.monotonic()
        if self.leading and now - self._renewed < self.ttl / 3:
            return True
        redis = self._redis()
        if redis is False:  # another beat holds the Redlock
            if self.leading:
                logger.warning("beat %s: another beat holds the Redis leader lease; standing by", self.identity)
            self._step_down()
            return False
        try:
            held = leadership.hold(self.LEASE, self.token, self.identity, self.ttl)
        except DatabaseError as error:  # no database, no dispatch: stand by and try again next tick
            logger.warning("beat %s could not reach the leader lease in the database: %s", self.identity, error)
            connection.close_if_unusable_or_obsolete()
            held = False
        if held and not self.leading:
            how = "" if redis else " (database lease; no Redis quorum)" if conf.lock_masters() else " (database lease)"
            logger.warning("beat %s is now the leader%s", self.identity, how)
        elif not held and self.leading:
            logger.warning("beat %s lost the leader lease; standing by", self.identity)
        if held:
            self._renewed = now
        else:
            self._release_redis()  # let the row's holder (or the next beat) have the Redlock too
        self.leading = held
        return held

    def _redis(self) -> bool | None:
        """Hold the Redlock too: True when this beat holds it, False when another beat does,
        None when no masters are configured or no quorum answers."""
        if not conf.lock_masters():
            return None
        try:
            if self._lock is not None:
                with contextlib.suppress(ExtendUnlockedLock):  # it ran out: take it again if it is free
                    self._lock.extend()
                    return True
                self._lock = None
            candidate = Redlock(key=leader_key(), masters=locks.masters(), auto_release_time=self.ttl,
                                raise_on_redis_errors=True, num_extensions=2**62)
            if candidate.acquire(blocking=False):
                self._lock = candidate
                return True
            return False
        except QuorumIsImpossible as error:
            locks.warn_degraded("beat-leader", error)
            return None

    def _release_redis(self) -> None:
        if self._lock is not None:
            with contextlib.suppress(ReleaseUnlockedLock, QuorumIsImpossible):
                self._lock.release()
        self._lock = None

    def _step_down(self) -> None:
        if self.leading:
            with contextlib.suppress(DatabaseError):
                leadership.release(self.LEASE, self.token)
        self.leading = False

    def release(self) -> None:
        """Give both leases up (beat stops): a standby takes over at its next tick."""
        self._release_redis()
        with contextlib.suppress(DatabaseError):
            leadership.release(self.LEASE, self.token)
        self.leading = False


class Scheduler(DatabaseScheduler):  # type: ignore[misc]
    """Celery beat scheduler for cron_celery jobs.

    Periodic tasks that are not cron jobs (made in the admin, or ``beat_schedule``
    entries) are left to django-celery-beat's ``DatabaseScheduler``, untracked — but only
    the leader sends them, so two beats do not send them twice either.
    """

    #: Longest sleep between ticks, in seconds.
    tick_seconds = 1.0
    #: When (monotonic) the clock skew was last logged.
    _skew_warned = -1e9

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        check_errors.refuse_to_start("beat")  # before the first sync writes anything
        self.leadership = Leadership(float(conf.settings.BEAT_LEASE_SECONDS))
        self._schedules: dict[tuple[str, str], schedules.Schedule] = {}
        self.published = 0  # executions sent since start
        self.uncounted: Counter[int] = Counter()  # sent per job, not yet on its periodic task
        self._beat_seen, self._beat_leading = -1e9, False
        self._plain_read = False  # django-celery-beat's entries read since this beat took the lead
        super().__init__(*args, **kwargs)

    def setup_schedule(self) -> None:
        # First slots after the database's now; the audit log names the beat's start as the source.
        report = schedule_sync.sync(leadership.database_now(), source=audit.DEPLOY_BEAT)
        logger.info("cron_celery: schedules synced: %s", report)
        schedule_problems.log_outstanding()
        super().setup_schedule()

    def enabled_models_qs(self) -> Any:
        """django-celery-beat's own entries: every enabled periodic task but ours. Its query reads every
        crontab row's timezone; one it cannot read (a row written past the admin) falls back to all of them."""
        ours = Q(cron_job__isnull=True) | fires.TRACKED_FIRES  # a tracked clocked or solar one: as it fires
        try:
            return super().enabled_models_qs().filter(ours)
        except Exception as error:  # one bad crontab row must not stop the beat's start or its ticks
            logger.warning("cron_celery beat: django-celery-beat cannot read its crontab rows (%s: %s); taking "
                           "every enabled periodic task", type(error).__name__, error)
            return self.Model.objects.enabled().filter(ours)

    def all_as_schedule(self) -> Any:
        """django-celery-beat reads its periodic tasks again (at the start, on a change, every five
        minutes): the tracked ones are linked to their job rows first (``tracking.rows``), so it reads
        only the rest; one that is no longer tracked comes back to it."""
        try:
            rows.sync(source=audit.BEAT_TRACKING)
        except Exception:  # the beat goes on: the next change or sync links them
            logger.exception("cron_celery beat: the tracked periodic tasks could not be linked to their jobs")
            connection.close_if_unusable_or_obsolete()
        return super().all_as_schedule()

    def tick(self, *args: Any, **kwargs: Any) -> float:
        leading = self.leadership.check()
        self.heartbeat(leading)
        if not leading:
            self._plain_read = False
            return self.tick_seconds
        plain = self.tick_plain(*args, **kwargs)
        wait = self.tick_seconds
        try:
            with signals_deferred():
                wait = self.dispatch_due()
        except Exception:  # a failed round is retried next tick; beat must not die
            logger.exception("cron_celery beat: dispatch round failed")
        return max(0.005, min(float(plain), wait))

    def tick_plain(self, *args: Any, **kwargs: Any) -> float:
        """django-celery-beat's own periodic tasks, as ``DatabaseScheduler`` sends them, but read again
        from the database whenever this beat takes the lead, and each one's send written (compared and
        set) before it is sent (``plain_tasks``). SIGTERM waits until the tick's sends are done."""
        try:
            with signals_deferred():
                if not self._plain_read:
                    plain_tasks.read_again(self)
                    self._plain_read = True
                return float(super().tick(*args, **kwargs))
        except plain_tasks.SentElsewhere as elsewhere:  # another beat sent it since this one read it
            logger.warning("cron_celery beat: %s; its periodic tasks are read again", elsewhere)
        except Exception as error:  # a database that went away: nothing sent that was not written
            logger.warning("cron_celery beat: django-celery-beat's periodic tasks are read again next tick (%s: %s)",
                           type(error).__name__, str(error).strip())
        self._plain_read = False
        return self.tick_seconds

    def reserve(self, entry: Any) -> Any:
        """The entry about to be sent: its last run and run count written to its row first, only if the
        row still holds the run count this beat read (else ``plain_tasks.SentElsewhere``: not sent)."""
        new_entry = super().reserve(entry)
        self._dirty.discard(new_entry.name)  # never written by DatabaseScheduler's lazy sync: by the line below
        plain_tasks.record_reserved(self._schedule, entry, new_entry)
        return new_entry

    def apply_async(self, entry: Any, producer: Any = None, advance: bool = True, **kwargs: Any) -> Any:
        """An entry's send: a tracked clocked or solar periodic task's as a run of its job
        (``tracking.fires``), any other as ``DatabaseScheduler`` sends it."""
        if fires.fires(entry.model):
            entry = self.reserve(entry) if advance else entry
            sent = fires.send(self.app, entry.model)
            if sent is not None:
                return sent
        return super().apply_async(entry, producer=producer, advance=False, **kwargs)

    def dispatch_due(self) -> float:
        """Record and publish every due slot; returns how long to sleep until the next one
        (at most ``tick_seconds``, so edits and other beats are noticed within a second).

        Idle, this is one query. Due jobs are planned in batches of ``BEAT_BATCH``, each
        batch recorded in one statement and published over one broker connection.
        """
        deadline = time.monotonic() + self.leadership.ttl / 3
        while True:
            next_at, edited, now = dispatch.next_due()  # now: the database's clock, not this machine's
            if edited:  # take edits in first: they may move or pause what is due
                schedule_sync.apply_edits(now)
                if time.monotonic() > deadline:
                    return 0.0
                continue
            if next_at is None or next_at > now:
                ahead = (next_at - now).total_seconds() if next_at is not None else self.tick_seconds
                return min(self.tick_seconds, ahead)
            if self.end_pauses():  # resumed: the trigger has the next look take the resume in
                continue
            one_offs = self.send_one_offs(now)
            self.published += one_offs
            due = dispatch.due_jobs(now, limit=conf.settings.BEAT_BATCH)
            if not due and not one_offs:  # what was due is being taken elsewhere (a row another beat holds)
                return self.tick_seconds
            plans: dict[PlanKey, catch_up.CatchUpPlan | None] = {}
            problems: dict[int, str] = {}
            decisions = [decision for row in due if (decision := self.plan(row, now, plans, problems)) is not None]
            if problems:  # no longer due: they would come back every round, ahead of the others
                schedule_problems.set_aside(problems)
            began = time.monotonic()
            # The slots written MISSED commit with their outage's alert (one per job).
            _advanced, to_publish, missed = outcomes.dispatched(decisions)
            by_id = {row.job_id: row for row in due}
            sent = self.publish(by_id, to_publish)
            self.published += sent
            log_round(by_id, decisions, sent, missed, time.monotonic() - began)
            # django-celery-beat's "last run" of the periodic tasks: a courtesy, never in the way.
            # Counts it could not write (a row held by an admin's save) are written next round.
            self.uncounted.update(item.job_id for item in to_publish[:sent])
            try:
                dispatch.count_sent(dict(self.uncounted))
                self.uncounted.clear()
            except DatabaseError as error:
                logger.info("cron_celery beat: the periodic tasks' last run is kept for the next round (%s: %s)",
                            type(error).__name__, str(error).strip())
            if time.monotonic() > deadline:
                return 0.0

    def end_pauses(self) -> bool:
        """Resume the jobs whose pause has ended and send the runs their pause held (``pauses``)."""
        resumed = pauses.end_due()
        for job_id in resumed:
            resumes.release_job(self.app, job_id)
        return bool(resumed)

    def plan(self, row: dispatch.DueJob, now: dt.datetime, plans: dict[PlanKey, catch_up.CatchUpPlan | None],
             problems: dict[int, str] | None = None) -> dispatch.Decision | None:
        return plan(row, now, plans, self._schedules, problems)

    def publish(self, jobs: dict[int, dispatch.DueJob], to_publish: list[dispatch.ToPublish]) -> int:
        """Send the executions this beat inserted, oldest slot first, over one connection and,
        where the broker transport can (Redis, kombu >= 5.7), in pipelined batches.

        If the broker fails, what was not sent stays PENDING (and is logged).
        """
        if not to_publish:
            return 0
        sent = 0
        try:
            with self.app.producer_or_acquire() as producer:
                sender = publishing.sender_for(self.app, producer)
                batch = getattr(producer, "batch", None)
                with batch(max_size=conf.settings.BEAT_BATCH) if batch else contextlib.nullcontext():
                    for item in to_publish:
                        sender.send(jobs[item.job_id].task, tasks.headers(item.execution_id, item.slot, item.trigger),
                                    item.celery_task_id)
                        sent += 1
        except Exception:
            logger.exception("could not publish all of %d executions; those not sent stay PENDING",
                             len(to_publish))
            return 0
        return sent

    def send_one_offs(self, now: dt.datetime) -> int:
        """Take the one-off runs due by ``now`` (each once, whichever beat asks) and send them. One
        whose message the broker refuses keeps its task id and stays PENDING: the reconciler sends
        it after ``PENDING_GRACE``, as any PENDING execution no worker started."""
        taken = oneoffs.take_due(now, conf.settings.BEAT_BATCH)
        sent = 0
        try:
            with self.app.producer_or_acquire() as producer:
                sender = publishing.sender_for(self.app, producer)
                for due in taken:
                    sender.send(due.task, tasks.headers(due.execution_id, due.slot, oneoffs.ONE_OFF, force=due.force),
                                due.celery_task_id)
                    logger.info("cron_celery beat: one-off run %s (execution %d) sent", slots.iso(due.slot),
                                due.execution_id)
                    sent += 1
        except Exception:
            logger.exception("could not send all of %d one-off runs; those not sent stay PENDING", len(taken))
        if sent:
            self.uncounted.update(due.job_id for due in taken[:sent])
        return sent

    def heartbeat(self, leading: bool) -> None:
        """Tell the health check this beat is alive, every few seconds and on every change."""
        now = time.monotonic()
        if leading == self._beat_leading and now - self._beat_seen < min(10.0, self.leadership.ttl / 3):
            return
        try:
            before = time.time()
            database = health.beat_seen(self.leadership.identity, leading)
            skew = health.clock_skew(database, before, time.time())
        except Exception:  # health reporting must not stop the schedule
            logger.exception("cron_celery beat: could not record its heartbeat")
            return
        if skew is not None and now - self._skew_warned >= 600:  # at most every ten minutes
            logger.warning("beat %s: this machine's clock is %+.1f s off the database's; slots are dispatched "
                           "by the database's clock, but keep this machine on NTP",
                           self.leadership.identity, skew)
            self._skew_warned = now
        self._beat_seen, self._beat_leading = now, leading

    def close(self) -> None:
        with contextlib.suppress(Exception):
            health.beat_gone(self.leadership.identity)
        self.leadership.release()
        super().close()
