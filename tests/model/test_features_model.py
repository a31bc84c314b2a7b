"""Every feature added after the claim protocol's model, by exhaustion: ``after=`` fan-in and chains,
a concurrency group, jitter, active windows, one-off runs, runs with parameters, timing alerts, edits
made through the admin's path while claims and finishes wait on the job's row, deploys that remove
jobs from the code and bring them back, and reconciler passes while the broker is unreachable.

A Hypothesis state machine whose rules are the real operations, each on a database connection of its
own: the leading beat's round (``Scheduler.dispatch_due``, on a clock the test moves an hour at a
time; two beats at once too), a worker receiving a message from the session's Redis queue, a body
ending, a lease running out, the reconciler's pass, a person's runs (with parameters, ``--force``,
``--rerun``, ``--cascade``, one-offs scheduled and cancelled), an admin's save of a periodic task,
a deploy. After every step the rows are checked against what each feature must keep
(tests/model/features.py); at the end of every example everything is delivered, ended and reconciled,
and nothing may stay open nor any upstream slot stay undecided downstream.

Profiles as the claim protocol's model (tests/model/profiles.py): ``model-ci`` by default, with
``CRON_FEATURES_EXAMPLES`` examples (10), and ``long`` with ``--hypothesis-profile=long``.
"""

from __future__ import annotations

import collections
import datetime as dt
import functools
import os
import threading
from typing import Any

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from django.test import override_settings
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, rule, run_state_machine_as_test

from cron_celery import models
from cron_celery.decisions import oneoffs
from cron_celery.run import outcomes, tasks
from tests.model import features as f
from tests.model import features_harness as fh
from tests.model import harness as h

KEYS = st.sampled_from(list(fh.FEATURES))
SCHEDULED = st.sampled_from([key for key, options in fh.FEATURES.items() if "schedule" in options])
PICK = h.PICK
RESULTS = st.sampled_from(["ok", "ok", "fail", "logical", "timeout"])
#: What an admin's save of a periodic task may change, and to what (windows relative to the clock, in hours).
EDITS = st.one_of(
    st.tuples(st.just("enabled"), st.booleans()),
    st.tuples(st.just("interval"), st.sampled_from([1, 2])),
    st.tuples(st.just("start_time"), st.sampled_from([None, -2, 1, 3])),
    st.tuples(st.just("expires"), st.sampled_from([None, 1, 2, 4])),
    st.tuples(st.just("one_off"), st.booleans()),
    st.tuples(st.just("kwargs"), st.sampled_from(['{}', '{"region": "us"}', '{"region": 5}', '{"nope": 1}',
                                                   '{"region": "\\u0000"}', '[1]', '{bad'])),
)
STATS: collections.Counter[str] = collections.Counter()


def _returned(worker: h.Worker) -> None:
    """A call that ended returned, or raised what its body raised on its last attempt (Celery's
    failure of the task), nothing else."""
    if worker.raised is not None:
        assert isinstance(worker.raised, SoftTimeLimitExceeded) or (
            isinstance(worker.raised, RuntimeError) and str(worker.raised) == "the job raised"), (
            f"a call raised {worker.raised!r}")


class Features(h.Machine):
    world: fh.World  # set by the test before the machine runs

    def __init__(self) -> None:
        super().__init__()
        base = fh.base_slot()
        self.known = f.Known(base=base, now=base)
        self.removed: set[str] = set()

    @initialize()
    def fresh_world(self) -> None:
        fh.reset(self.world, self.known.base)
        self.beats = [fh.scheduler(), fh.scheduler()]
        self.ready = True
        self._beat(0)

    # ---- helpers -----------------------------------------------------------------------------

    def _start(self, target: Any, barrier: threading.Barrier | None = None) -> h.Worker:
        worker = h.Worker(target, barrier)
        self.held.workers.append(worker)
        worker.start()
        return worker

    def _settled(self, worker: h.Worker) -> None:
        worker.settle()
        assert worker.raised is None, f"a delivery raised {worker.raised!r}"
        STATS["claimed" if worker.entered.is_set() else "declined"] += 1

    def _deliver(self, message: h.Message) -> h.Worker:
        worker = self._start(h.deliver(self.world.as_jobs, message))
        self._settled(worker)
        return worker

    def _end_run(self, worker: h.Worker, result: str) -> None:
        worker.end(result)
        _returned(worker)
        STATS[f"ended {result}"] += 1

    def _newest(self) -> int:
        return max((row.id for row in fh.rows()), default=0)

    def _beat(self, hours: int, *, two: bool = False) -> None:
        self.known.now += hours * fh.HOUR
        before = self._newest()
        with fh.clock(self.known.now):
            if two:
                barrier = threading.Barrier(2)
                beats = [self._start(beat.dispatch_due, barrier) for beat in self.beats]
                for beat in beats:
                    assert beat.done.wait(h.WAIT) and beat.raised is None, beat.raised
            else:
                h.in_thread(self.beats[0].dispatch_due)
        STATS["beat round"] += 1
        f.check_round(self.world, self.known, before)
        f.check_pause_ends()

    def _live_keys(self) -> list[str]:
        return [key for key in fh.FEATURES if key not in self.removed]

    # ---- the beats -------------------------------------------------------------------------------

    @rule(hours=st.sampled_from([0, 1, 1, 2, 3]), two=st.booleans())
    def beat(self, hours: int, two: bool) -> None:
        self._beat(hours, two=two)

    # ---- workers ----------------------------------------------------------------------------------

    deliver, deliver_again = h.delivery_rules()

    @rule(index=PICK, result=RESULTS)
    def finish(self, index: int, result: str) -> None:
        running = list(self.held.running())
        if running:
            self._end_run(running[index % len(running)], result)

    @rule(index=PICK)
    def expire_lease(self, index: int) -> None:
        live = [row.id for row in fh.rows() if row.live]
        if live:
            h.in_thread(lambda: h.expire(live[index % len(live)]))

    # ---- people -----------------------------------------------------------------------------------

    @rule(key=KEYS, index=st.integers(-1, 3),
          how=st.sampled_from(["enqueue", "force", "rerun", "cascade", "params", "in-process"]))
    def send_run(self, key: str, index: int, how: str) -> None:
        if key in self.removed:
            return
        job = self.world.declared[key]
        at = self.known.base + index * fh.HOUR
        if how == "in-process":
            self._settled(self._start(h.run_in_process(self.world.as_jobs, key, at)))
            return
        given = {"region": "us"} if how == "params" and key == "par" else None
        h.in_thread(lambda: tasks.send_run(job, at, "ENQUEUE", force=how == "force",
                                           rerun=how in ("rerun", "cascade"), cascade=how == "cascade", given=given))
        STATS[f"sent {how}"] += 1

    @rule(key=SCHEDULED, hours=st.integers(0, 4), half=st.booleans(), force=st.booleans())
    def schedule_one_off(self, key: str, hours: int, half: bool, force: bool) -> None:
        if key in self.removed:
            return
        at = self.known.now + hours * fh.HOUR + (dt.timedelta(minutes=30) if half else dt.timedelta(0))
        job = self.world.declared[key]
        try:
            h.in_thread(lambda: oneoffs.record(job, self.world.ids[key], at, force=force))
            STATS["one-off recorded"] += 1
        except ValueError as refused:
            assert str(refused), "a one-off refused without a reason"
            STATS["one-off refused"] += 1

    @rule(index=PICK, any_pending=st.booleans())
    def cancel(self, index: int, any_pending: bool) -> None:
        choices = fh.unsent_one_offs() if not any_pending else [
            row.id for row in fh.rows() if row.status == "PENDING"]
        if not choices:
            return
        chosen = choices[index % len(choices)]
        done = h.in_thread(lambda: outcomes.cancelled([chosen], "model", any_pending=any_pending))
        if done and not any_pending:
            self.known.cancelled.add(chosen)
        STATS[f"cancelled {bool(done)}"] += 1

    @rule(key=SCHEDULED, change=EDITS, index=PICK)
    def admin_edit(self, key: str, change: tuple[str, Any], index: int) -> None:
        """An admin saves the job's periodic task; while the save's transaction is open, a worker's
        claim of one of the job's messages or the end of one of its runs waits on the job's row."""
        field, value = change
        if field in ("start_time", "expires") and value is not None:
            value = self.known.now + value * fh.HOUR
        job_id = self.world.ids[key]
        task_name = self.world.declared[key].task_name
        choices: list[tuple[str, Any]] = [("deliver", m) for m in h.queued() if m.task == task_name]
        choices += [("finish", w) for w in self.held.running()
                    if w.run_info is not None and w.run_info.job == self.world.declared[key].name]
        holder = fh.EditHolder(job_id, field, value)
        holder.start()
        assert holder.locked.wait(h.WAIT) and holder.raised is None, holder.raised
        if holder.applied:
            self.known.disturbed.add(key)
        held = fh.row_locked(job_id)  # the save changed what the job's row keeps: it holds the row
        waiter: h.Worker | None = None
        if choices:
            what, target = choices[index % len(choices)]
            if what == "deliver":
                assert h.take(target)
                self.history.append(target)
                waiter = self._start(h.deliver(self.world.as_jobs, target))
            else:
                waiter = target
                target.commands.put("ok")
            pid = holder.backend_pid
            assert pid is not None
            if held:
                h.wait_until(lambda: h.blocked_by(pid), "the claim or finish to wait for the admin's save")
                STATS["admin save waited for"] += 1
            else:
                h.wait_until(lambda: waiter.done.is_set() or waiter.entered.is_set(), "the claim or finish")
        holder.release.set()
        assert holder.done.wait(h.WAIT) and holder.raised is None, holder.raised
        if waiter is not None:
            if choices[index % len(choices)][0] == "deliver":
                self._settled(waiter)
            else:
                assert waiter.done.wait(h.WAIT)
                _returned(waiter)
        STATS[f"admin {field}"] += 1

    @rule(key=st.sampled_from(fh.REMOVABLE))
    def deploy(self, key: str) -> None:
        """A deploy removes the job from the code, or declares it again."""
        if key in self.removed:
            self.removed.discard(key)
            self.known.removed.pop(key, None)
        else:
            self.removed.add(key)
            self.known.removed[key] = self._newest()
            self.known.ever_removed.add(key)
        self.known.disturbed.add(key)
        h.in_thread(lambda: fh.deploy(self.world, self.removed, self.known.now))
        STATS["deploy"] += 1

    # ---- time and the reconciler -----------------------------------------------------------------

    @rule(index=PICK)
    def late(self, index: int) -> None:
        waiting = [row.id for row in fh.rows() if row.status == "PENDING" and row.celery_task_id]
        if waiting:
            h.in_thread(lambda: fh.make_late(waiting[index % len(waiting)]))

    @rule()
    def time_passes(self) -> None:
        h.in_thread(lambda: fh.time_passes(h.TIME_PASSES_BY))

    @rule()
    def reconcile(self) -> None:
        h.in_thread(h.reconcile)
        STATS["reconcile"] += 1
        f.check_pause_ends()

    @rule(key=SCHEDULED)
    def pause_with_an_end(self, key: str) -> None:
        """The admin's Pause… with an end that has passed by the next rule: the next beat round or
        reconciler pass ends it."""
        if h.in_thread(functools.partial(fh.pause_with_an_end, self.world.ids[key])):
            self.known.disturbed.add(key)
            STATS["pause with an end"] += 1

    @rule()
    def reconcile_without_broker(self) -> None:
        before = fh.rows()
        with fh.broker_unreachable():
            h.in_thread(h.reconcile)
        f.check_broker_pass(before, fh.rows())
        STATS["reconcile without broker"] += 1

    # ---- checks -----------------------------------------------------------------------------------

    @invariant()
    def features_keep_their_promises(self) -> None:
        if self.ready:
            rows = f.check(self.world, self.known)
            f.check_self_pauses(self.world, self.known)
            f.check_stream(self.world, self.known, rows)
            STATS["steps"] += 1

    def drain(self) -> None:
        """Resume everything, then deliver, end, move the clock past every slot and reconcile until
        nothing moves: nothing may stay open, and every upstream slot is decided downstream."""
        STATS["examples"] += 1
        for key in fh.FEATURES:
            if "schedule" in fh.FEATURES[key] and key not in self.removed:
                job_id = self.world.ids[key]
                h.in_thread(functools.partial(fh.edit, job_id, "one_off", False))
                h.in_thread(functools.partial(fh.edit, job_id, "enabled", True))
        models.CronJob.objects.update(paused=False)
        target = max([row.slot for row in fh.rows()] + [self.known.now]) + 2 * fh.HOUR
        for _ in range(80):
            if self.settle_everything():
                continue
            if self.known.now < target:
                self._beat(1)
                continue
            rows = fh.rows()
            if not any(row.status in f.OPEN for row in rows):
                break
            for row in rows:
                if row.live:
                    h.in_thread(functools.partial(h.expire, row.id))
            self.time_passes()
            self.reconcile()
        f.check_drained(self.world, self.known, fh.rows())



def _profile() -> settings:
    if settings.get_current_profile_name() == "default":
        return settings(settings.get_profile("model-ci"),
                        max_examples=int(os.environ.get("CRON_FEATURES_EXAMPLES", "10")))
    return settings()


_LONG = settings.get_current_profile_name() not in ("default", "model-ci")


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(0 if _LONG else 900)
def test_every_feature_keeps_its_promises_whatever_the_steps() -> None:
    world = fh.declare(f"f{os.getpid()}")
    try:
        with override_settings(CRON_CELERY=fh.SETTINGS), fh.registry_of(world):
            Features.world = world
            run_state_machine_as_test(Features, settings=_profile())
    finally:
        print("features model:", dict(sorted(STATS.items())))
        fh.forget(world)
        Features.world = fh.World({}, {})
