"""The claim protocol against the reference model (tests/model/reference.py), by exhaustion.

A Hypothesis state machine whose rules are the real operations — the beat's dispatch, a worker
receiving a message from the session's Redis queue (``TrackedTask.__call__``: claim, body, retry or
fenced finish), a heartbeat, a lease that expires, the reconciler's pass, pause and resume, an admin
edit holding the job's row, ``--force``, ``--rerun``, admin re-runs, backfills, in-process runs, a
duplicate delivery of any earlier message, two workers receiving at the same instant — each on a
database connection of its own. After every step the rows are compared with the model and the
invariants are checked; at the end of every example everything is delivered, expired and
reconciled until nothing is open.

Profiles (tests/model/conftest.py): ``model-ci`` by default (fixed seed, bounded), and ``long``
with ``pytest tests/model --hypothesis-profile=long``.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import functools
import os
import re
import threading
from typing import Any

import pytest
from celery.exceptions import Retry
from django.test import override_settings
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from cron_celery import models
from cron_celery.decisions import claims, dispatch, heartbeats, room
from cron_celery.run import backfill, identity, outcomes, retries, runs, tasks
from tests.model import harness as h
from tests.model.reference import CAPPED, CLAIM, DUPLICATE, FINAL, GIVE_UP, SKIP, WAITING, Exe, Model

RESULTS = st.sampled_from(["ok", "fail", "logical", "timeout"])
KEYS = st.sampled_from([spec.key for spec in h.SPECS])
PICK = h.PICK
OVERLAPPING = ("OVERLAP", "LOCK_UNAVAILABLE")
LOST_OR_CAPPED = "LOST_OR_CAPPED"
#: What the run did: examples, steps, and how often each kind of outcome was checked (printed at the end).
STATS: collections.Counter[str] = collections.Counter()


@dataclasses.dataclass(frozen=True)
class Seen:
    """What a settled delivery or in-process call did."""

    kind: str  # CLAIM, SKIP, DUPLICATE, WAITING, GIVE_UP, CAPPED
    execution_id: int | None
    reason: str = ""
    fence: int | None = None
    status: str = ""


def seen(worker: h.Worker) -> Seen:
    """Read what a settled worker did from what the real call returned."""
    if worker.entered.is_set() and not worker.done.is_set():
        run = worker.run_info
        assert run is not None
        return Seen(CLAIM, run.execution_id, fence=run.fence)
    if worker.raised is not None:
        raise AssertionError(f"the call raised {worker.raised!r}") from worker.raised
    value = worker.returned
    if isinstance(value, runs.Outcome):  # in-process
        status, execution_id, message, reason = value.status, value.execution_id, value.message, value.skip_reason
    else:
        assert isinstance(value, dict), value
        status, execution_id, message = value["status"], value["execution_id"], value["message"]
        reason = next((key for key, text in room.SKIP_MESSAGES.items() if text == message), "")
        behind = re.fullmatch(re.escape(room.BEHIND_MESSAGE).replace(re.escape("{ahead}"), r"\d+"), message)
        if behind or message == room.BUFFER_FULL_MESSAGE:
            # Behind older runs that wait, or buffer_one's buffer full: OVERLAP, LOCK_UNAVAILABLE or
            # CONCURRENCY, as its row says (the message names none).
            reason = models.CronExecution.objects.get(id=execution_id).skip_reason
    if status == models.Status.SKIPPED:
        return Seen(SKIP, execution_id, reason=reason)
    if status == claims.DUPLICATE:
        # A capped attempt recorded LOST and a duplicate of a LOST execution both say "LOST".
        return Seen(LOST_OR_CAPPED if message == models.Status.LOST else DUPLICATE, execution_id)
    if status == claims.WAITING:
        return Seen(WAITING, execution_id)
    if status in (models.Status.FAILED, models.Status.TIMED_OUT, models.Status.LOST):
        return Seen(GIVE_UP, execution_id, status=status)
    raise AssertionError(f"a delivery ended {status!r} without running its body")


def pick(items: list[Any], index: int) -> Any:
    """The ``index``-th thing on hand, counting round: a draw that does not depend on how many there are."""
    return items[index % len(items)]


def same_reason(expected: str, actual: str) -> bool:
    return expected == actual or (expected in OVERLAPPING and actual in OVERLAPPING)


class Protocol(h.Machine):
    """One example: the model's jobs from scratch, real operations, rows checked after each step."""

    jobs: h.Jobs  # set by the test before the machine runs

    def __init__(self) -> None:
        super().__init__()
        self.model = Model(h.SPECS)
        self.on_worker: dict[h.Worker, bool] = {}

    @initialize()
    def fresh_world(self) -> None:
        h.reset(self.jobs)
        self.ready = True

    # ---- helpers ---------------------------------------------------------------------------

    def _start(self, target: Any, barrier: threading.Barrier | None = None, *, on_worker: bool = True) -> h.Worker:
        worker = h.Worker(target, barrier)
        self.held.workers.append(worker)
        self.on_worker[worker] = on_worker
        worker.start()
        return worker

    def _apply(self, model: Model, actual: Seen, *, execution_id: int | None, key: str | None = None,
               slot_index: int | None = None, force: bool = False, rerun: bool = False) -> str:
        """Check a delivery (``execution_id``) or in-process call (``key``/``slot_index``) against the
        model and apply it; returns '' or what disagreed."""
        if execution_id is not None:
            expected = model.decide_delivery(execution_id, force=force, rerun=rerun)
        else:
            assert key is not None and slot_index is not None
            expected = model.decide_new(key, h.slot(slot_index), force=force, rerun=rerun)
        if actual.kind == LOST_OR_CAPPED:
            actual = dataclasses.replace(actual, kind=CAPPED if expected.kind == CAPPED else DUPLICATE)
        if expected.kind != actual.kind or (expected.kind == SKIP and not same_reason(expected.reason, actual.reason)):
            return f"expected {expected}, the real call did {actual}"
        STATS[f"claim {actual.kind} {actual.reason}".strip()] += 1
        delivered = model.exes.get(execution_id) if execution_id is not None else None
        if delivered is not None and delivered.trigger == "BEAT" and (
                model.jobs[delivered.job].spec.overlap == "buffer_one"):
            STATS[f"buffer_one beat slot {actual.kind}"] += 1
        if execution_id is None and actual.execution_id is not None:  # an in-process call wrote a new row
            assert key is not None and slot_index is not None
            model.exes[actual.execution_id] = Exe(actual.execution_id, key, h.slot(slot_index), "MANUAL",
                                                  forced=force or rerun)
        exe = model.exes.get(actual.execution_id) if actual.execution_id is not None else None
        if actual.kind == CLAIM:
            assert exe is not None and actual.fence is not None
            job = model.jobs[exe.job]
            if actual.fence <= job.top_fence:
                return f"fence {actual.fence} of execution {exe.id} is not larger than {job.top_fence}"
            model.claimed(exe, actual.fence, slot_read=execution_id is not None or not (force or rerun))
        elif actual.kind == SKIP:
            assert exe is not None
            model.skipped(exe, actual.reason)
            if (actual.reason == "PAUSED" and execution_id is not None) or actual.reason in ("OVERLAP", "CONCURRENCY"):
                model.next_waiting(exe.job)  # the oldest that may go is sent, when the job has room for it
        elif actual.kind == WAITING:
            assert exe is not None
            model.mark_waiting(exe)
            if actual.reason in ("OVERLAP", "CONCURRENCY"):
                model.next_waiting(exe.job)  # behind older waiting runs, with room: the oldest is sent
        elif actual.kind == GIVE_UP:
            assert exe is not None
            status = model.give_up(exe)
            if status != actual.status:
                return f"a give-up ended {actual.status}, the model says {status}"
            model.next_waiting(exe.job)
        elif actual.kind == CAPPED:
            assert exe is not None
            model.dead_attempt(exe)
        return ""

    def _deliver(self, message: h.Message) -> None:
        worker = self._start(h.deliver(self.jobs, message))
        worker.settle()
        problem = self._apply(self.model, seen(worker), execution_id=message.execution_id,
                              force=bool(message.headers.get(tasks.HEADER_FORCE)),
                              rerun=bool(message.headers.get(tasks.HEADER_RERUN)))
        assert not problem, problem

    def _end_run(self, worker: h.Worker, result: str) -> None:
        self._finish(worker, result)

    def _finish(self, worker: h.Worker, result: str) -> None:
        run = worker.run_info
        assert run is not None
        exe = self.model.exes[run.execution_id]
        expected = self.model.finish(exe, run.fence, result, on_worker=self.on_worker[worker])
        STATS[f"finish {expected}"] += 1
        worker.end(result)
        if expected == "RETRYING":
            assert isinstance(worker.returned, Retry), (worker.returned, worker.raised)
        self.model.next_waiting(exe.job)

    def _queued_ids(self) -> set[int]:
        task_ids = {message.task_id for message in h.queued()}
        return {row.id for row in h.rows() if row.celery_task_id and row.celery_task_id in task_ids}

    def _reconcile(self) -> None:
        STATS["reconcile"] += 1
        expired = h.expired_in_pass_order()
        self.model.reconcile(expired, self._queued_ids(), h.REPUBLISH_LIMIT)
        h.in_thread(h.reconcile)

    # ---- the beat ----------------------------------------------------------------------------

    @rule(key=KEYS, mode=st.sampled_from(["on-time", "late-latest", "late-all", "stale", "two-beats"]))
    def dispatch(self, key: str, mode: str) -> None:
        job = self.model.jobs[key]
        k = job.next_slot
        if mode == "on-time":
            run, missed, advance = [h.slot(k)], [], 1
        elif mode == "late-latest":
            run, missed, advance = [h.slot(k + 1)], [h.slot(k)], 2
        elif mode == "late-all":
            run, missed, advance = [h.slot(k), h.slot(k + 1)], [], 2
        else:
            run, missed, advance = [h.slot(k)], [], 1
        expected_next = job.next_run_at
        if mode == "stale":
            expected_next = h.slot(k + 40)  # a beat that read an older row
        next_run_at = h.slot(k + advance)
        if mode == "two-beats":
            barrier = threading.Barrier(2)
            results: list[tuple[bool, list[dispatch.ToPublish]]] = []
            beats = [self._start(lambda: h.dispatch(self.jobs, key, expected_next, next_run_at, run, missed),
                                 barrier) for _ in range(2)]
            for beat in beats:
                assert beat.done.wait(h.WAIT)
                assert beat.raised is None, beat.raised
                results.append(beat.returned)
            winners = [result for result in results if result[0]]
            should = 0 if job.paused else 1
            assert len(winners) == should, f"{len(winners)} beats advanced the job"
            published = [item for _, items in results for item in items]
        else:
            advanced, published = h.in_thread(lambda: h.dispatch(self.jobs, key, expected_next, next_run_at, run,
                                                                  missed))
            should_advance = not job.paused and mode != "stale"
            assert advanced == should_advance, (advanced, mode, job.paused)
        if job.paused or mode == "stale":
            assert not published
            return
        # A slot that already has an execution (run by hand, sent, backfilled) is not dispatched again.
        taken = {exe.slot for exe in self.model.of_job(key)}
        assert sorted(item.slot for item in published) == [when for when in run if when not in taken]
        for item in published:
            # Several slots at once are a catch-up, the newest too: each waits for the live run.
            trigger = "CATCH_UP" if len(run) > 1 else "BEAT"
            assert item.trigger == trigger
            self.model.exes[item.execution_id] = Exe(item.execution_id, key, item.slot, trigger)
        missed = [when for when in missed if when not in taken]
        if missed:
            by_slot = {(row.job_id, row.slot, row.run_number): row for row in h.rows()}
            missed_rows = [by_slot[(self.jobs.ids[key], when, 1)] for when in missed]
            for missed_row in missed_rows:
                self.model.exes[missed_row.id] = Exe(missed_row.id, key, missed_row.slot, "BEAT", status="MISSED")
            newest_row = max(missed_rows, key=lambda missed_row: missed_row.slot)
            self.model.missed_alert(self.model.exes[newest_row.id])
        job.next_slot = k + advance
        job.next_run_at = next_run_at

    # ---- workers -------------------------------------------------------------------------------

    # No rule has a precondition on what is on hand: which rules can run would then depend on races,
    # and a replay would draw differently. A rule with nothing to act on does nothing.

    deliver, deliver_again = h.delivery_rules()

    @rule(key=KEYS)
    def a_slot_meets_the_live_run(self, key: str) -> None:
        """A regular slot falls due while the job runs and reaches a worker at once: an overlap-skip job
        skips it, a buffer_one job keeps one waiting and skips the next, an allow job runs it beside."""
        if not self.model.live_runs(key):
            return
        STATS[f"slot meets the live run of {key}"] += 1
        before = set(self.model.exes)
        self.dispatch(key, "on-time")
        for message in h.queued():
            if message.execution_id in set(self.model.exes) - before:
                assert h.take(message)
                self.history.append(message)
                self._deliver(message)

    @rule(one=PICK, other=PICK)
    def two_workers_at_once(self, one: int, other: int) -> None:
        """Two workers receive messages (the same one, or two of one job) at the same instant."""
        pool = h.queued() + self.history
        if not pool:
            return
        first = pick(pool, one)
        second = pick([message for message in pool if message.task == first.task], other)
        for message in (first, second):
            if h.take(message):
                self.history.append(message)
        barrier = threading.Barrier(2)
        workers = [self._start(h.deliver(self.jobs, message), barrier) for message in (first, second)]
        for worker in workers:
            worker.settle()
        actual = [seen(worker) for worker in workers]
        problems = []
        for order in ((0, 1), (1, 0)):
            trial = copy.deepcopy(self.model)
            problem = ""
            for index in order:
                message = (first, second)[index]
                problem = self._apply(trial, actual[index], execution_id=message.execution_id,
                                      force=bool(message.headers.get(tasks.HEADER_FORCE)),
                                      rerun=bool(message.headers.get(tasks.HEADER_RERUN)))
                if problem:
                    break
            if not problem:
                # Both orders may agree on what each delivery did and still differ in what they
                # left behind: two give-ups of one job (it was paused) write their final rows in
                # the order the job's row lock let them, and only the first one alerts. The order
                # taken is the one whose whole state the rows show.
                try:
                    check(trial, self.jobs)
                except AssertionError as disagreement:
                    problem = f"after order {order}: {disagreement}"
            if not problem:
                self.model = trial
                return
            problems.append(problem)
        raise AssertionError(f"no serial order explains the two deliveries: {problems}")

    @rule(index=PICK, result=RESULTS)
    def finish(self, index: int, result: str) -> None:
        running = list(self.held.running())
        if running:
            self._finish(pick(running, index), result)

    @rule(index=PICK, status=st.sampled_from(["TIMED_OUT", "LOST"]))
    def parent_records_a_death(self, index: int, status: str) -> None:
        """A worker's parent saw the process running a body killed by the hard time limit (or die) and
        records it (``run.parent``); then the body's own late write, as a process that got to it
        before the kill. Only runs whose claim is still their execution's latest: this process's
        threads share one worker identity and pid, so a run taken over since would look like the new
        claim's (a real parent's worker or pid differs); a superseded run is such a run."""
        running = [worker for worker in self.held.running() if worker.run_info is not None
                   and self.model.exes[worker.run_info.execution_id].claims[-1] == worker.run_info.fence]
        if not running:
            return
        # Superseded runs first: the case the protocol treats apart, drawn whenever one is on hand.
        running.sort(key=lambda worker: self.model.exes[worker.run_info.execution_id].fence == worker.run_info.fence)
        worker = pick(running, index)
        run = worker.run_info
        assert run is not None
        exe = self.model.exes[run.execution_id]
        job = self.jobs.declared[exe.job]
        retry = status == "LOST" or retries.wanted_after_kill(job)
        ended = h.in_thread(lambda: outcomes.dead(
            job, job_id=self.jobs.ids[exe.job], status=status, error_code="TIME_LIMIT", message="killed",
            retry=retry, worker=identity.WORKER, pid=os.getpid(), execution_id=run.execution_id))
        superseded = exe.status == "RUNNING" and exe.fence != run.fence
        expected = self.model.parent_reported(exe, run.fence, status, retry=retry)
        STATS[f"parent {status} {'superseded' if superseded else expected}"] += 1
        assert (None if ended is None else ended.status) == expected, (
            f"the parent's record of execution {exe.id} (fence {run.fence}) wrote {ended}, the model says {expected}")
        self._end_run(worker, "ok")

    @rule(index=PICK)
    def heartbeat(self, index: int) -> None:
        running = list(self.held.running())
        if not running:
            return
        worker = pick(running, index)
        run = worker.run_info
        assert run is not None
        expected = self.model.heartbeat(self.model.exes[run.execution_id], run.fence)
        renewed = h.in_thread(lambda: heartbeats.heartbeat(run.execution_id, run.fence, h.LEASE_SECONDS))
        assert renewed == expected, f"heartbeat of execution {run.execution_id} fence {run.fence}: {renewed}"

    @rule(index=PICK)
    def expire_lease(self, index: int) -> None:
        """The worker froze or died: its lease runs out (the database's clock moves past it)."""
        live = sorted(exe.id for exe in self.model.exes.values() if exe.status == "RUNNING" and exe.live)
        if not live:
            return
        execution_id = pick(live, index)
        h.in_thread(lambda: h.expire(execution_id))
        self.model.expire(self.model.exes[execution_id])

    @rule(key=KEYS, index=st.integers(0, 3), force=st.booleans(), rerun=st.booleans())
    def run_in_process(self, key: str, index: int, force: bool, rerun: bool) -> None:
        """``run_cron_task JOB --at SLOT`` (optionally ``--force``/``--rerun``) in this process."""
        worker = self._start(h.run_in_process(self.jobs, key, h.slot(index), force=force, rerun=rerun),
                             on_worker=False)
        worker.settle()
        problem = self._apply(self.model, seen(worker), execution_id=None, key=key, slot_index=index, force=force,
                              rerun=rerun)
        assert not problem, problem

    # ---- people ------------------------------------------------------------------------------

    @rule(key=KEYS, index=st.integers(0, 3),
          how=st.sampled_from(["enqueue", "force", "rerun", "admin-rerun", "backfill"]))
    def send_run(self, key: str, index: int, how: str) -> None:
        """``run_cron_task --enqueue`` (plain, ``--force``, ``--rerun``), the admin's re-run, a backfill."""
        job = self.jobs.declared[key]
        at = h.slot(index)
        if how == "backfill":
            sent = h.in_thread(lambda: backfill.send(job, backfill.Plan(slots=[at], done=[])))[0]
            trigger, force, rerun = "BACKFILL", False, True
        else:
            trigger = "ADMIN" if how == "admin-rerun" else "ENQUEUE"
            force, rerun = how in ("force", "admin-rerun"), how == "rerun"
            sent = h.in_thread(lambda: tasks.send_run(job, at, trigger, force=force, rerun=rerun))
        self.model.exes[sent.execution_id] = Exe(sent.execution_id, key, at, trigger, forced=force or rerun,
                                                 force=force)

    @rule(key=KEYS, paused=st.booleans())
    def pause_or_resume(self, key: str, paused: bool) -> None:
        h.in_thread(lambda: models.CronJob.objects.filter(id=self.jobs.ids[key]).update(paused=paused))
        self.model.jobs[key].paused = paused

    @rule(index=PICK, edit=st.sampled_from(["schedule", "pause-toggle"]), result=RESULTS)
    def admin_edit_holds_the_job_row(self, index: int, edit: str, result: str) -> None:
        """An admin edit's transaction holds a job's row while a worker's claim, a worker's finish or a
        reconciler pass must wait for it; then it commits, and the waiting operation goes on."""
        choices: list[tuple[str, Any]] = [("deliver", message) for message in h.queued()]
        choices += [("finish", worker) for worker in self.held.running()]
        if not choices:
            choices = [("reconcile", key) for key in self.model.jobs]
        what, target = pick(choices, index)
        if what == "deliver":
            key = self.jobs.key_of_task(target.task)
        elif what == "finish":
            key = self.model.exes[target.run_info.execution_id].job
        else:
            key = target
        assert key is not None
        statement = (f"UPDATE {h.JOB} SET schedule_version = schedule_version + 1 WHERE id = %s" if edit == "schedule"
                     else f"UPDATE {h.JOB} SET paused = NOT paused WHERE id = %s")
        holder = h.RowHolder(statement, [self.jobs.ids[key]])
        holder.start()
        assert holder.locked.wait(h.WAIT) and holder.raised is None, holder.raised
        if edit == "pause-toggle":  # it commits before the waiting operation reads the row
            self.model.jobs[key].paused = not self.model.jobs[key].paused
        holder_pid = holder.backend_pid
        assert holder_pid is not None
        if what == "deliver":
            assert h.take(target)
            self.history.append(target)
            worker = self._start(h.deliver(self.jobs, target))
            h.wait_until(lambda: h.blocked_by(holder_pid), "the claim to wait for the job's row")
            holder.release.set()
            assert holder.done.wait(h.WAIT)
            worker.settle()
            problem = self._apply(self.model, seen(worker), execution_id=target.execution_id,
                                  force=bool(target.headers.get(tasks.HEADER_FORCE)),
                                  rerun=bool(target.headers.get(tasks.HEADER_RERUN)))
            assert not problem, problem
        elif what == "finish":
            run = target.run_info
            exe = self.model.exes[run.execution_id]
            expected = self.model.finish(exe, run.fence, result, on_worker=self.on_worker[target])
            target.commands.put(result)
            h.wait_until(lambda: h.blocked_by(holder_pid) or target.done.is_set(),
                         "the finish to wait for the job's row")
            holder.release.set()
            assert holder.done.wait(h.WAIT)
            assert target.done.wait(h.WAIT)
            if expected == "RETRYING":
                assert isinstance(target.returned, Retry), (target.returned, target.raised)
            self.model.next_waiting(exe.job)
        else:
            expired = h.expired_in_pass_order()
            self.model.reconcile(expired, self._queued_ids(), h.REPUBLISH_LIMIT)
            worker = self._start(h.reconcile)
            h.wait_until(lambda: h.blocked_by(holder_pid) or worker.done.is_set(),
                         "the pass to wait or end")
            holder.release.set()
            assert holder.done.wait(h.WAIT) and worker.done.wait(h.WAIT)
            assert worker.raised is None, worker.raised

    # ---- time and the reconciler ---------------------------------------------------------------

    @rule()
    def time_passes(self) -> None:
        """More than the reconciler's grace period passes (leases last far longer)."""
        h.in_thread(lambda: h.shift(h.TIME_PASSES_BY))
        self.model.time_passes()

    @rule()
    def reconcile(self) -> None:
        self._reconcile()

    # ---- checks ----------------------------------------------------------------------------

    @invariant()
    def rows_agree_with_the_model(self) -> None:
        if not self.ready:
            return
        STATS["steps"] += 1
        check(self.model, self.jobs)

    def drain(self) -> None:
        """Deliver every outstanding message, end every run, expire and reconcile, until nothing moves:
        then nothing may stay open."""
        STATS["examples"] += 1
        for key, job in self.model.jobs.items():
            if job.paused:
                self.pause_or_resume(key, False)
        for _ in range(60):
            moved = self.settle_everything()
            check(self.model, self.jobs)
            if moved:
                continue
            if not any(exe.open for exe in self.model.exes.values()):
                break
            for exe in list(self.model.exes.values()):
                if exe.status == "RUNNING" and exe.live:
                    h.in_thread(functools.partial(h.expire, exe.id))
                    self.model.expire(exe)
            self.time_passes()
            self._reconcile()
            check(self.model, self.jobs)
        still_open = [row for row in h.rows() if row.status in ("PENDING", "RUNNING", "RETRYING")]
        assert not still_open, f"open after everything was delivered and reconciled: {still_open}"



claim_fences = h.claim_fences


def check(model: Model, jobs: h.Jobs) -> None:
    """The rows against the model, and the invariants that hold whatever the model says."""
    rows = h.rows()
    by_id = {row.id: row for row in rows}
    assert set(by_id) == set(model.exes), (
        f"rows {sorted(set(by_id) - set(model.exes))} unknown to the model, "
        f"{sorted(set(model.exes) - set(by_id))} missing")
    specs = {key: job.spec for key, job in model.jobs.items()}
    for exe in model.exes.values():
        row = by_id[exe.id]
        assert jobs.key_of_id(row.job_id) == exe.job
        expected = (exe.status, exe.retry_count)
        assert (row.status, row.retry_count) == expected, (
            f"execution {exe.id} ({exe.job} {exe.trigger} slot {exe.slot:%H}): row {row.status} retry {row.retry_count}"
            f", model {expected}")
        assert row.trigger == exe.trigger, f"execution {exe.id}: trigger {row.trigger}, model {exe.trigger}"
        if exe.status in ("PENDING", "RETRYING"):
            assert row.waiting == exe.waiting, f"execution {exe.id}: waiting {row.waiting}, model {exe.waiting}"
        if exe.status == "RUNNING":
            assert row.live == exe.live and row.fence == exe.fence, (exe, row)
        assert claim_fences(row) == exe.claims, (
            f"execution {exe.id}: claims under fences {claim_fences(row)} (history {row.attempts}), "
            f"model {exe.claims}")
        if exe.status == "SKIPPED":
            assert not exe.attempted and row.retry_count == 0 and not row.attempts, (
                f"execution {exe.id} had an attempt and ended SKIPPED")
        spec = specs[exe.job]
        assert row.retry_count <= spec.max_retries and len(row.attempts) <= spec.max_retries + 1, row
    job_rows = h.job_rows()
    alerts = h.alert_rows()
    for key, job in model.jobs.items():
        job_id = jobs.ids[key]
        mine = [row for row in rows if row.job_id == job_id]
        live = [row.id for row in mine if row.live]
        if job.spec.limit is not None:
            assert len(live) <= job.spec.limit, f"{key}: {len(live)} live runs at once: {live}"
        if job.spec.slot_checked:
            won: dict[Any, int] = {}
            for row in mine:
                if row.status == "SUCCEEDED" and not row.forced:
                    won[row.slot] = won.get(row.slot, 0) + 1
            assert all(count <= 1 for count in won.values()), f"{key}: a slot succeeded twice unforced: {won}"
        # Fences are checked on claims, not on the column: a superseded run carries the fence of
        # the claim that superseded it, and its history keeps the one it ran under.
        fences = [fence for row in mine for fence in claim_fences(row)]
        assert len(fences) == len(set(fences)), f"{key}: two claims got the same fence: {sorted(fences)}"
        real = job_rows[job_id]
        assert max(fences, default=0) <= real.fence
        assert (real.paused, real.consecutive_failures, real.fenced_count, real.alerted) == (
            job.paused, job.consecutive_failures, job.fenced_count, job.alerted), (
            f"{key}: row paused/failures/fenced/alerted {real}, model {job}")
        expected_alerts = {(job_id, execution_id, event) for execution_id, event in job.alerts}
        assert {alert for alert in alerts if alert[0] == job_id} == expected_alerts, key
    assert all(status in FINAL or status in ("PENDING", "RUNNING", "RETRYING") for status in (r.status for r in rows))


def _profile() -> settings:
    """The profile chosen with ``--hypothesis-profile``, else the bounded CI one (loaded for this
    test alone, so no other test is affected)."""
    if settings.get_current_profile_name() == "default":
        return settings.get_profile("model-ci")
    return settings()


#: The CI profile's run takes a minute or two; a hang fails it. The long profile runs unbounded.
_LONG = settings.get_current_profile_name() not in ("default", "model-ci")


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(0 if _LONG else 900)
def test_the_claim_protocol_agrees_with_the_reference_model() -> None:
    declared = h.declare_jobs(f"p{os.getpid()}")  # unique per process: two Django lines share Redis (job locks)
    try:
        with override_settings(CRON_CELERY=h.SETTINGS):
            Protocol.jobs = declared.jobs
            run_state_machine_as_test(Protocol, settings=_profile())
    finally:
        print("model test:", dict(sorted(STATS.items())))
        h.forget_jobs(declared)
        Protocol.jobs = h.Jobs({}, {})
