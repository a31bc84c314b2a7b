"""Writing an execution's final outcome, and announcing it.

Every writer of a final status — the worker (``runs``), the worker's parent (``parent``),
the reconciler and the admin — goes through here, so that each outcome gets the same
treatment:

1. the status, and what the listeners record with it (the alert outbox), in one transaction
   (``events.record``); when no listener records anything this is the bare statement;
2. after the commit, the announcement (``events.ended``): the Django signals and Sentry's
   final check-in, neither of which can change what was recorded.

An execution that did not succeed may end a chain (``after=``): the database skips the downstream
slots in the same write (``dependencies``); so may a success, whose slot another upstream never runs
(paused, outside its window, removed from the code). Right after that write, in its transaction, each of
those skips is handed to the listeners as an outcome of its own (SKIPPED, ``UPSTREAM``, with the
status that stopped the chain: ``events.Ended.upstream_status``), so a job declared with
``alert_on_upstream=True`` alerts with it, and each is announced after the commit. Only an
execution of a job that a declared job runs after asks (``registry.has_downstream``): a plain
job's outcome costs no statement more.

The run's start is announced here too (``started``). The listeners are subscribed at app
start; this module knows none of them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
from collections.abc import Callable
from typing import Any

from django.db import transaction

from cron_celery import enums, exceptions
from cron_celery.decisions import dependencies, dispatch, finishes, jobs, oneoffs, repairs
from cron_celery.declaring import registry
from cron_celery.run import events

S = enums.Status


def started(job: registry.Job, execution_id: int, slot: dt.datetime, attempt: int) -> None:
    """After a committed claim: the run's body is about to start."""
    events.started(events.Started(job=job, execution_id=execution_id, slot=slot, attempt=attempt))


def finish(job: registry.Job, job_id: int, execution_id: int, slot: dt.datetime, *, fence: int, status: str,
           message: str, error_code: str, traceback: str, result: Any, history: bool = True,
           runtime: float | None = None) -> bool:
    """``finishes.finish_counting`` with what the listeners record, then the announcement;
    False when fenced. ``runtime``: the seconds the attempt's body took."""
    kwargs = {"job_id": job_id, "execution_id": execution_id, "fence": fence, "status": status,
              "message": message, "error_code": error_code, "traceback": traceback, "result": result,
              "history": history}
    event = events.Ended(job=job, job_id=job_id, execution_id=execution_id, slot=slot, status=status,
                         error_code=error_code, message=message, counted=False, runtime=runtime)
    below: list[events.Ended] = []
    key = (execution_id, fence)
    if events.records(event) or _may_skip_below(job):
        with transaction.atomic():
            events.record(event)  # before the write: what it reads is the job as it was
            before = finishes.finish_counting(**kwargs)
            if before is None:
                transaction.set_rollback(True)
            else:
                below = _record_all(_skipped_below(job, execution_id, status))
                _keep_unconfirmed(key, (_as_written(event, before), below))  # until the commit answers
        if before is not None:  # committed and answered (a write tried again writes nothing: it is kept)
            _unconfirmed.pop(key, None)
    else:
        before = finishes.finish_counting(**kwargs)
    if before is None:
        return False
    events.ended(_as_written(event, before))
    _announce_all(below)
    return True


def _as_written(event: events.Ended, before: int) -> events.Ended:
    """The announcement of a final write that found ``before`` failures in a row."""
    return dataclasses.replace(event, recovered=event.status == S.SUCCEEDED and before > 0)


#: Final writes whose COMMIT was sent but not answered (the connection failed at the commit), by
#: (execution id, fence): what ``finish`` would have announced, for ``written`` to announce once the
#: write is found (``finishes.written_by``). A few at most: one per run whose database went away then.
_unconfirmed: dict[tuple[int, int], tuple[events.Ended, list[events.Ended]]] = {}


def _keep_unconfirmed(key: tuple[int, int], announced: tuple[events.Ended, list[events.Ended]]) -> None:
    while len(_unconfirmed) >= 64:  # runs that gave up on the database never come back for theirs
        _unconfirmed.pop(next(iter(_unconfirmed)))
    _unconfirmed[key] = announced


def written(job: registry.Job, job_id: int, execution_id: int, slot: dt.datetime, *, fence: int, status: str,
            error_code: str, message: str) -> None:
    """A final write tried again found its outcome already written by this claim (its first COMMIT
    landed, the answer was lost): announce it once, as ``finish`` would have (a recovery is one,
    and the downstream slots it skipped), when this process still knows what that write found;
    else the bare announcement (``announce``)."""
    kept = _unconfirmed.pop((execution_id, fence), None)
    if kept is None:
        announce(job, job_id, execution_id, slot, status, error_code, message)
        return
    events.ended(kept[0])
    _announce_all(kept[1])


def dead(job: registry.Job | None, **kwargs: Any) -> repairs.Ended | None:
    """``repairs.end_dead_attempts``, recorded by the listeners when final or when its worker was
    lost (a lost worker is news even when the execution is retried), then announced when final."""
    status = str(kwargs["status"])
    below: list[events.Ended] = []
    with transaction.atomic():
        ended = repairs.end_dead_attempts(**kwargs)
        if ended is not None:
            event = events.Ended(job=job, job_id=ended.job_id, execution_id=ended.execution_id, slot=ended.slot,
                                 status=status, error_code=str(kwargs.get("error_code", "")),
                                 message=str(kwargs.get("message", "")), final=ended.status != S.RETRYING,
                                 lost_attempt=ended.status == S.RETRYING and status == S.LOST)
            if event.final or event.lost_attempt:
                events.record(event)
            if event.final:
                below = _record_all(_skipped_below(job, ended.execution_id, status))
    if ended is not None and ended.status != S.RETRYING:
        events.ended(event)
        _announce_all(below)
    return ended


def unstarted(job: registry.Job | None, *, job_id: int, execution_id: int, slot: dt.datetime, status: str,
              error_code: str, message: str, running_too: bool = False, stranded_for: float | None = None) -> bool:
    """``repairs.close_unstarted`` (MISSED or LOST), recorded and announced."""
    event = events.Ended(job=job, job_id=job_id, execution_id=execution_id, slot=slot, status=status,
                         error_code=error_code, message=message)
    below: list[events.Ended] = []
    with transaction.atomic():
        closed = repairs.close_unstarted(job_id=job_id, execution_id=execution_id, status=status,
                                         error_code=error_code, message=message, running_too=running_too,
                                         stranded_for=stranded_for)
        if closed:
            events.record(event)
            below = _record_all(_skipped_below(job, execution_id, status))
    if closed:
        events.ended(event)
        _announce_all(below)
    return closed


def given_up(job: registry.Job | None, *, job_id: int, execution_id: int, note: str) -> finishes.GivenUp | None:
    """``finishes.give_up`` (an attempted execution that reached a paused job): it ends with its
    own failure, counted, recorded and announced like any final failure."""
    below: list[events.Ended] = []
    with transaction.atomic():
        ended = finishes.give_up(job_id=job_id, execution_id=execution_id, note=note)
        if ended is not None:
            event = events.Ended(job=job, job_id=job_id, execution_id=execution_id, slot=ended.slot,
                                 status=ended.status, error_code=ended.error_code, message=ended.message)
            events.record(event)
            below = _record_all(_skipped_below(job, execution_id, ended.status))
    if ended is not None:
        events.ended(event)
        _announce_all(below)
    return ended


def revoked(job: registry.Job | None, **kwargs: Any) -> finishes.Revoked | None:
    """``finishes.revoke``, announced. A revoked run is recorded by nobody else (no alert):
    somebody stopped it on purpose, and the history shows it. The downstream slots it skipped are
    announced even when it had not started."""
    below: list[events.Ended] = []
    with transaction.atomic() if _may_skip_below(job) else contextlib.nullcontext():
        ended = finishes.revoke(**kwargs)
        if ended is not None:
            below = _record_all(_skipped_below(job, ended.execution_id, S.REVOKED))
    if ended is not None and ended.started:
        events.ended(events.Ended(job=job, job_id=int(kwargs["job_id"]), execution_id=ended.execution_id,
                                  slot=ended.slot, status=S.REVOKED, error_code="REVOKED",
                                  message=str(kwargs.get("message", ""))))
    _announce_all(below)
    return ended


def dispatched(decisions: list[dispatch.Decision]) -> tuple[set[int], list[dispatch.ToPublish], int]:
    """``dispatch.dispatch_many``, with what the listeners record of the slots it writes MISSED (the
    alert outbox: one alert per job and outage) in the same transaction, so that no process dying
    between the two leaves an outage recorded and never alerted. Its downstream skips are announced
    after the commit. Returns what ``dispatch_many`` returns."""
    if not any(decision.missed for decision in decisions):
        return dispatch.dispatch_many(decisions)
    with transaction.atomic():
        advanced, to_publish, missed = dispatch.dispatch_many(decisions)
        _recorded, below = _missed(repairs.newest_missed(
            [d.job_id for d in decisions if d.missed and d.job_id in advanced])) if missed else (0, [])
    _announce_all(below)
    return advanced, to_publish, missed


def missed(rows: list[tuple[int, int, dt.datetime]]) -> int:
    """Record slots written MISSED already (``rows``: job id, the newest MISSED execution id of the
    job, its slot), in one transaction, and announce their downstream skips. Returns how many jobs'
    MISSED slots a listener recorded."""
    with transaction.atomic():
        recorded, below = _missed(rows)
    _announce_all(below)
    return recorded


def _missed(rows: list[tuple[int, int, dt.datetime]]) -> tuple[int, list[events.Ended]]:
    """What the listeners record of slots written MISSED in bulk, in the caller's transaction: how many
    jobs' slots a listener recorded (the alert outbox writes one alert per job and outage, not one
    per slot), and the downstream slots they skipped, to announce after the commit."""
    by_id = jobs.jobs_by_row_id()
    recorded, below = 0, []
    for job_id, execution_id, slot in rows:
        job = by_id.get(job_id) or jobs.job_for_row(job_id)
        event = events.Ended(job=job, job_id=job_id, execution_id=execution_id, slot=slot, status=S.MISSED)
        if events.records(event):
            events.record(event)
            recorded += 1
        # The downstream slots of all the job's slots written MISSED with this one.
        below += _record_all(_skipped_below(job, execution_id, S.MISSED, missed=True))
    return recorded, below


def decided_late(batch: int, grace: float) -> list[int]:
    """``dependencies.undecided`` (a reconciler pass): upstream executions whose downstream slots
    had no decision are decided now, with what the listeners record of the skips that writes, in
    its transaction; the skips are announced after the commit. Returns the ids of the upstream
    executions that decided something (those that succeeded have downstream executions to send)."""
    return _decided_now(lambda: dependencies.undecided(batch, grace))


def decided_waiting(downstream_ids: list[int]) -> list[int]:
    """``dependencies.decide_waiting`` (a deploy's schedule sync, for the downstream jobs it dropped an
    upstream of), recorded and announced as ``decided_late`` does; returns the upstream executions
    that decided something (their downstream executions to send)."""
    return _decided_now(lambda: dependencies.decide_waiting(downstream_ids)) if downstream_ids else []


def _decided_now(decide: Callable[[], list[int]]) -> list[int]:
    below: list[events.Ended] = []
    with transaction.atomic():
        decided = decide()
        if decided:
            below = _record_all(_as_events(dependencies.skipped_below(decided, written_now=True)))
    _announce_all(below)
    return decided


def unsent(job: registry.Job, execution_id: int, message: str) -> None:
    """``dispatch.abandon`` (a PENDING execution whose message the broker refused, closed FAILED
    ``PUBLISH_FAILED``): the downstream slots that closing skipped are recorded in its transaction
    and announced after it, like any upstream's end. The execution itself alerts nobody: the
    person or process that asked was told at once."""
    with transaction.atomic() if _may_skip_below(job) else contextlib.nullcontext():
        dispatch.abandon(execution_id, message)
        below = _record_all(_skipped_below(job, execution_id, S.FAILED))
    _announce_all(below)


def cancelled(execution_ids: list[int], by: str, *, any_pending: bool = False) -> list[oneoffs.Cancelled]:
    """``oneoffs.cancel``: those of these one-off runs not sent yet (``any_pending``: these runs not
    started) become SKIPPED (CANCELLED), announced as skips (no alert: a person cancelled them).
    The cancel of a slot's run skips the downstream slots it leaves undecided (the database's rule,
    ``dependencies``): what the listeners record of those is recorded in the cancel's transaction,
    and they are announced after it. Returns the cancelled ones."""
    below: list[events.Ended] = []
    with transaction.atomic():
        done = oneoffs.cancel(execution_ids, by, any_pending=any_pending)
        declared = {item.job_id: jobs.job_for_row(item.job_id) for item in done}
        for item in done:
            below += _record_all(_skipped_below(declared[item.job_id], item.execution_id, S.SKIPPED))
    for item in done:
        events.ended(events.Ended(job=declared[item.job_id], job_id=item.job_id,
                                  execution_id=item.execution_id, slot=item.slot, status=S.SKIPPED,
                                  error_code=enums.SkipReason.CANCELLED, message=item.message))
    _announce_all(below)
    return done


def announce(job: registry.Job | None, job_id: int, execution_id: int, slot: dt.datetime, status: str,
             error_code: str, message: str) -> None:
    """After the commit of an outcome written elsewhere (a skip at the claim; a final write whose
    answer was lost with the connection): the announcement alone, and that of the downstream slots
    the write skipped (what the listeners record of those was recorded with it by ``finish``)."""
    events.ended(events.Ended(job=job, job_id=job_id, execution_id=execution_id, slot=slot, status=status,
                              error_code=error_code, message=message))
    if not (status == S.SKIPPED and error_code in _DECIDES_NOTHING):
        _announce_all(_skipped_below(job, execution_id, status))


#: A duplicate delivery's skip decides no downstream slot (the database's rule, ``dependencies``).
_DECIDES_NOTHING = frozenset({enums.SkipReason.ALREADY_RAN, enums.SkipReason.ALREADY_RUNNING})


def _may_skip_below(job: registry.Job | None) -> bool:
    """Whether an execution that ended ``status`` may have skipped downstream slots: an execution of a
    job that a job declared here runs after (or of a job this process does not know). A success too:
    it skips a slot whose other upstream never runs it (paused, outside its window, removed)."""
    return job is None or registry.has_downstream(job.name)


def _skipped_below(job: registry.Job | None, execution_id: int, status: str, *,
                   missed: bool = False) -> list[events.Ended]:
    """The downstream slots that the write ending this execution skipped (down the chain), as
    outcomes of their own; no statement when ``_may_skip_below`` says there can be none.
    ``missed``: the execution names the job's slots written MISSED in one statement."""
    if not _may_skip_below(job):
        return []
    if missed:
        return _as_events(dependencies.skipped_below_missed([execution_id]))
    return _as_events(dependencies.skipped_below([execution_id]))


def _as_events(skipped: list[dependencies.Skipped]) -> list[events.Ended]:
    return [events.Ended(job=_declared(item.code), job_id=item.job_id, execution_id=item.execution_id,
                         slot=item.slot, status=S.SKIPPED, error_code=enums.SkipReason.UPSTREAM,
                         message=item.message, upstream_status=item.upstream_status) for item in skipped]


def _declared(code: str) -> registry.Job | None:
    try:
        return registry.get(code)
    except exceptions.UnknownJob:
        return None


def _record_all(below: list[events.Ended]) -> list[events.Ended]:
    """What the listeners record of each (inside the transaction of the write that skipped them)."""
    for event in below:
        events.record(event)
    return below


def _announce_all(below: list[events.Ended]) -> None:
    for event in below:
        events.ended(event)


