"""A small pure-Python reference model of the claim protocol: what each operation must do.

It is written from the guarantees in docs/concepts.md and docs/reliability.md, not from the SQL:
one execution per row, the pattern's slot check, the overlap policy (a regular beat slot that meets
a live run is skipped; a requested slot and every retry wait), fences, leases, the attempt cap, the
reconciler's four steps (three of which matter here), ``max_concurrency`` (at most N live runs of
an overlap-``allow`` job: a regular slot over it is skipped, a requested one waits), the failure
streak and the alert policy
(``on_failure`` and ``on_recovery`` channels, ``alert_after``, no repeat).

Time is abstract: a lease is live or expired, and an open execution is ``fresh`` until the
reconciler's grace period has passed since its ``lease_until``/``created_at`` was last set.
Nothing here touches a database; the state machine in ``test_model.py`` runs the real operations
and compares the rows with this model after every step.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

OPEN = ("PENDING", "RUNNING", "RETRYING")
FINAL = ("SUCCEEDED", "FAILED", "TIMED_OUT", "LOST", "SKIPPED", "MISSED", "REVOKED")
FAILING = ("FAILED", "TIMED_OUT", "LOST")
#: Triggers whose executions wait for a live run of their exclusive job instead of being skipped.
BUFFERED = ("BACKFILL", "CATCH_UP", "ENQUEUE", "ADMIN")

# What a delivery (or an in-process call) must do.
CLAIM, SKIP, DUPLICATE, WAITING, GIVE_UP, CAPPED = "CLAIM", "SKIP", "DUPLICATE", "WAITING", "GIVE_UP", "CAPPED"


@dataclasses.dataclass(frozen=True)
class Spec:
    """A job's declaration, as far as the protocol cares."""

    key: str  # the model's short name for the job
    pattern: str  # standard, rerun_on_failure, always, rate_limited
    overlap: str  # skip, allow, buffer_one
    max_retries: int
    retry_on_failure: bool
    catch_up: str  # none, latest, all
    alert_after: int
    max_concurrency: int | None = None  # for overlap "allow": at most this many live runs at once

    @property
    def exclusive(self) -> bool:
        return self.overlap != "allow" or self.pattern == "rate_limited"

    @property
    def limit(self) -> int | None:
        """Live runs allowed at once: 1 for an exclusive job, else its max_concurrency (None: any)."""
        return 1 if self.exclusive else self.max_concurrency

    @property
    def over_limit(self) -> str:
        """The skip reason of a call that meets the limit."""
        return "OVERLAP" if self.exclusive else "CONCURRENCY"

    @property
    def slot_checked(self) -> bool:
        return self.pattern in ("standard", "rerun_on_failure")


@dataclasses.dataclass
class Exe:
    """One execution row, as the model expects it."""

    id: int
    job: str
    slot: dt.datetime
    trigger: str
    forced: bool = False  # past the slot check (--rerun, --force, a backfill)
    force: bool = False  # past a pause too (--force)
    status: str = "PENDING"
    retry_count: int = 0
    fence: int | None = None
    live: bool = False  # RUNNING with a lease that has not expired
    waiting: bool = False  # waiting_since set
    fresh: bool = True  # the reconciler's grace period has not passed since lease_until/created_at
    republished: int = 0
    attempted: bool = False  # it had an attempt (claimed at least once)
    skip_reason: str = ""
    last_failure: str = "FAILED"  # the status of its last failed attempt (what a give-up ends with)
    claims: list[int] = dataclasses.field(default_factory=list)  # the fence of each of its claims, in order

    @property
    def open(self) -> bool:
        return self.status in OPEN


@dataclasses.dataclass
class JobState:
    spec: Spec
    paused: bool = False
    consecutive_failures: int = 0
    fenced_count: int = 0
    alerted: bool = False  # alerted_at set: the current failure incident was alerted
    alerts: set[tuple[int, str]] = dataclasses.field(default_factory=set)  # (execution id, event)
    next_slot: int = 0  # index of the next slot the beat dispatches
    next_run_at: dt.datetime | None = None  # what the job's row holds (the beat's expectation)
    top_fence: int = 0  # the largest fence any claim of the job got


@dataclasses.dataclass(frozen=True)
class Decision:
    kind: str
    reason: str = ""


class Model:
    """The expected state of every job and execution of one example."""

    def __init__(self, specs: list[Spec]) -> None:
        self.jobs = {spec.key: JobState(spec) for spec in specs}
        self.exes: dict[int, Exe] = {}

    # ---- what the job is doing -------------------------------------------------------------

    def of_job(self, key: str) -> list[Exe]:
        return [exe for exe in self.exes.values() if exe.job == key]

    def live_runs(self, key: str, besides: int | None = None) -> list[Exe]:
        return [exe for exe in self.of_job(key) if exe.status == "RUNNING" and exe.live and exe.id != besides]

    def has_room(self, key: str, besides: int | None = None) -> bool:
        """Fewer live runs than the job's limit (always, for a job without one)."""
        limit = self.jobs[key].spec.limit
        return limit is None or len(self.live_runs(key, besides=besides)) < limit

    def ahead(self, key: str, slot: dt.datetime, me: int | None) -> int:
        """The job's waiting executions that may go and come before this one (by slot, then id)."""
        return sum(1 for exe in self.of_job(key) if exe.id != me and self.may_go(exe)
                   and (exe.slot < slot or (exe.slot == slot and me is not None and exe.id < me)))

    def behind(self, key: str, slot: dt.datetime, me: int | None) -> bool:
        """The job has room, but not once the older waiting runs have theirs: they go first."""
        limit = self.jobs[key].spec.limit
        return limit is not None and len(self.live_runs(key, besides=me)) + self.ahead(key, slot, me) >= limit

    def buffers_one(self, exe: Exe) -> bool:
        """overlap buffer_one: a regular beat slot kept from the job waits, if no other beat slot of it waits."""
        spec = self.jobs[exe.job].spec
        return (spec.overlap == "buffer_one" and exe.trigger == "BEAT" and spec.pattern != "rate_limited"
                and not any(other.id != exe.id and other.waiting and other.status == "PENDING"
                            and other.trigger == "BEAT" and not other.force for other in self.of_job(exe.job)))

    # ---- the claim ---------------------------------------------------------------------------

    def _slot_reason(self, spec: Spec, slot: dt.datetime, me: int | None) -> str:
        """The pattern's slot check (standard, rerun_on_failure): '' when the slot may run."""
        if not spec.slot_checked:
            return ""
        same = [exe for exe in self.of_job(spec.key) if exe.slot == slot and exe.id != me]
        if any(exe.status in ("PENDING", "RETRYING") or (exe.status == "RUNNING" and exe.live) for exe in same):
            return "ALREADY_RUNNING"
        if any(exe.status == "SUCCEEDED" for exe in same):
            return "ALREADY_RAN"
        if spec.pattern == "standard" and any(
                exe.status in ("FAILED", "TIMED_OUT", "LOST", "REVOKED") or (exe.status == "RUNNING" and not exe.live)
                for exe in same):
            return "ALREADY_RAN"
        return ""

    def decide_delivery(self, execution_id: int, *, force: bool = False, rerun: bool = False) -> Decision:
        """What a delivered message for an existing execution must do."""
        exe = self.exes.get(execution_id)
        if exe is None or exe.status in FINAL or (exe.status == "RUNNING" and exe.live):
            return Decision(DUPLICATE)
        job = self.jobs[exe.job]
        spec = job.spec
        if exe.status == "RUNNING" and exe.retry_count >= spec.max_retries:
            return Decision(CAPPED)  # its worker vanished on the last allowed attempt: LOST, not taken over
        force = force or exe.force
        rerun = rerun or exe.forced
        attempted = exe.status in ("RETRYING", "RUNNING")
        # Asked for (or the forced last slot of a one_off task): it waits rather than being skipped.
        buffered = (exe.trigger in BUFFERED or exe.force) and spec.pattern != "rate_limited"
        if job.paused and not force:
            if attempted:
                return Decision(GIVE_UP, "PAUSED")
            return Decision(WAITING, "PAUSED") if buffered else Decision(SKIP, "PAUSED")
        if not (force or rerun or attempted):
            reason = self._slot_reason(spec, exe.slot, exe.id)
            if reason:
                return Decision(SKIP, reason)
        if not self.has_room(exe.job, besides=exe.id) or self.behind(exe.job, exe.slot, exe.id):
            if attempted or buffered or self.buffers_one(exe):
                return Decision(WAITING, spec.over_limit)
            return Decision(SKIP, spec.over_limit)
        return Decision(CLAIM)

    def decide_new(self, key: str, slot: dt.datetime, *, force: bool = False, rerun: bool = False) -> Decision:
        """What an in-process call (``run_cron_task`` without ``--enqueue``) must do: a new row."""
        job = self.jobs[key]
        if job.paused and not force:
            return Decision(SKIP, "PAUSED")
        if not (force or rerun):
            reason = self._slot_reason(job.spec, slot, None)
            if reason:
                return Decision(SKIP, reason)
        if not self.has_room(key) or self.behind(key, slot, None):
            return Decision(SKIP, job.spec.over_limit)
        return Decision(CLAIM)

    def claimed(self, exe: Exe, fence: int, *, slot_read: bool = True) -> None:
        """The claim ran: RUNNING with a new fence; a takeover counts as another attempt.

        As ``supersede.stale_runs``: a claim of a job with a limit supersedes every other RUNNING
        execution of the job whose lease expired (and whose fence is smaller); a claim of a
        slot-checked job that read its slot (``slot_read``: not a new forced or re-run one), those of
        its slot. That one takes this claim's fence, so its late heartbeat and finish are refused; it
        stays RUNNING until the reconciler ends it. Its own claims (its ``attempts`` history) keep the
        fences it ran under.
        """
        job = self.jobs[exe.job]
        by_slot = job.spec.limit is None and job.spec.slot_checked and slot_read
        if job.spec.limit is not None or by_slot:
            for other in self.of_job(exe.job):
                if (other.id != exe.id and other.status == "RUNNING" and not other.live and (other.fence or 0) < fence
                        and (not by_slot or other.slot == exe.slot)):
                    other.fence = fence
        if exe.status == "RUNNING":
            exe.retry_count += 1
        exe.status, exe.live, exe.waiting, exe.attempted = "RUNNING", True, False, True
        exe.fence = fence
        exe.claims.append(fence)
        job.top_fence = max(job.top_fence, fence)

    def mark_waiting(self, exe: Exe) -> None:
        if exe.status in ("PENDING", "RETRYING"):
            exe.waiting, exe.fresh, exe.republished = True, True, 0

    def skipped(self, exe: Exe, reason: str) -> None:
        exe.status, exe.skip_reason, exe.waiting = "SKIPPED", reason, False

    # ---- outcomes ------------------------------------------------------------------------------

    def final(self, exe: Exe, status: str) -> None:
        """A final outcome written: the failure streak and the alert policy follow it."""
        job = self.jobs[exe.job]
        exe.status, exe.live, exe.waiting = status, False, False
        if status == "SUCCEEDED":
            if job.alerted:
                job.alerts.add((exe.id, "RECOVERED"))
            job.alerted = False
            job.consecutive_failures = 0
        elif status in FAILING:
            job.consecutive_failures += 1
            if not job.alerted and job.consecutive_failures >= job.spec.alert_after:
                job.alerts.add((exe.id, status))
                job.alerted = True
        if status == "MISSED":
            self.missed_alert(exe)

    def missed_alert(self, exe: Exe) -> None:
        """MISSED slots alert once per job and outage. An outage is the run of MISSED slots after the
        job's newest slot that started (was claimed): decided by slots, not by when rows were written."""
        job = self.jobs[exe.job]
        started = [other.slot for other in self.of_job(exe.job) if other.attempted]
        newest_start = max(started, default=None)
        alerted = {execution_id for execution_id, event in job.alerts if event == "MISSED"}
        if not any(other.id in alerted and other.id != exe.id and (newest_start is None or other.slot > newest_start)
                   for other in self.of_job(exe.job)):
            job.alerts.add((exe.id, "MISSED"))

    def retried(self, exe: Exe, failure: str) -> None:
        exe.status, exe.live, exe.retry_count, exe.fresh = "RETRYING", False, exe.retry_count + 1, True
        exe.last_failure = failure

    def finish(self, exe: Exe, fence: int, result: str, *, on_worker: bool) -> str:
        """A body ended with ``result`` (ok, fail, logical, timeout): the status written, or FENCED."""
        job = self.jobs[exe.job]
        if exe.status != "RUNNING" or exe.fence != fence:
            job.fenced_count += 1
            return "FENCED"
        status = {"ok": "SUCCEEDED", "fail": "FAILED", "logical": "FAILED", "timeout": "TIMED_OUT"}[result]
        wanted = status != "SUCCEEDED" and (result != "logical" or job.spec.retry_on_failure)
        if on_worker and wanted and exe.retry_count < job.spec.max_retries:
            self.retried(exe, status)
            return "RETRYING"
        self.final(exe, status)
        return status

    def heartbeat(self, exe: Exe, fence: int) -> bool:
        """A worker renews its lease: only while its claim still holds (not superseded, not taken over)."""
        if exe.status == "RUNNING" and exe.fence == fence:
            exe.live = True
            return True
        return False

    def dead_attempt(self, exe: Exe) -> str:
        """A RUNNING attempt whose lease expired, ended by the reconciler (or a capped redelivery)."""
        job = self.jobs[exe.job]
        if exe.retry_count < job.spec.max_retries:
            self.retried(exe, "LOST")
            job.alerts.add((exe.id, "LOST"))  # a lost worker alerts at once, once per execution
            return "RETRYING"
        self.final(exe, "LOST")
        return "LOST"

    def parent_reported(self, exe: Exe, fence: int, status: str, *, retry: bool) -> str | None:
        """A worker's parent recorded that the process running the claim under ``fence`` was killed
        (``TIMED_OUT``: the hard time limit) or died (``LOST``): only while that claim still holds
        the execution, as a finish. A run superseded since (its fence taken by the job's next run) is
        left to the reconciler. What the execution became, or None (nothing written)."""
        if exe.status != "RUNNING" or exe.fence != fence:
            return None
        job = self.jobs[exe.job]
        if retry and exe.retry_count < job.spec.max_retries:
            self.retried(exe, status)
            if status == "LOST":
                job.alerts.add((exe.id, "LOST"))  # a lost worker alerts at once, once per execution
            return "RETRYING"
        self.final(exe, status)
        return status

    def give_up(self, exe: Exe) -> str:
        """An attempted execution that reached a paused job ends with its own failure."""
        status = "LOST" if exe.status == "RUNNING" else exe.last_failure
        self.final(exe, status)
        return status

    def may_go(self, exe: Exe) -> bool:
        """A waiting execution may be sent: its job is not paused, or it runs past a pause (force)."""
        return exe.waiting and exe.status in ("PENDING", "RETRYING") and (not self.jobs[exe.job].paused or exe.force)

    def next_waiting(self, key: str) -> Exe | None:
        """The job's oldest waiting execution that may go, when the job has room for a run: it is sent
        again now. A paused job's are held (unless forced)."""
        if self.jobs[key].spec.limit is None or not self.has_room(key):
            return None
        waiting = sorted((exe for exe in self.of_job(key) if self.may_go(exe)), key=lambda exe: (exe.slot, exe.id))
        if not waiting:
            return None
        waiting[0].fresh = True
        return waiting[0]

    # ---- time ------------------------------------------------------------------------------

    def time_passes(self) -> None:
        """More than the reconciler's grace period passes (leases are far longer)."""
        for exe in self.exes.values():
            exe.fresh = False

    def expire(self, exe: Exe) -> None:
        exe.live = False

    # ---- the reconciler ----------------------------------------------------------------------

    def reconcile(self, expired_order: list[int], queued: set[int], republish_limit: int) -> None:
        """One pass: expired leases (``expired_order``: their ids in the pass's order), then
        stranded executions (``queued``: those whose message the broker still holds)."""
        for execution_id in expired_order:
            exe = self.exes[execution_id]
            self.dead_attempt(exe)
            exe.fresh = True
            self.next_waiting(exe.job)
        stranded = []
        for exe in sorted(self.exes.values(), key=lambda exe: (exe.job, exe.slot)):
            if exe.status not in ("PENDING", "RETRYING") or exe.fresh:
                continue
            if exe.waiting:
                if not self.may_go(exe):  # held by its job's pause: never stranded meanwhile
                    continue
                oldest = sorted((other for other in self.of_job(exe.job) if self.may_go(other)),
                                key=lambda other: (other.slot, other.id))
                if not self.has_room(exe.job) or oldest[0].id != exe.id:
                    continue
            stranded.append(exe)
        for exe in stranded:
            spec = self.jobs[exe.job].spec
            if exe.id in queued:
                exe.fresh = True  # late, not lost
                continue
            if exe.waiting:
                exe.fresh = True  # sent again, never given up
                continue
            by_beat = exe.status == "PENDING" and exe.trigger in ("BEAT", "CATCH_UP")
            newer = any(other.slot > exe.slot and other.trigger in ("BEAT", "CATCH_UP")
                        for other in self.of_job(exe.job))
            if by_beat and (spec.catch_up == "none" or (spec.catch_up == "latest" and newer)):
                self.final(exe, "MISSED")
                continue
            if exe.republished >= republish_limit:
                self.final(exe, "LOST")
                continue
            if exe.status == "PENDING" and exe.trigger == "BEAT" and spec.catch_up == "all":
                exe.trigger = "CATCH_UP"  # sent again late: a catch-up, which waits for a live run
            exe.republished += 1
            exe.fresh = True
