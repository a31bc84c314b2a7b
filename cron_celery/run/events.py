"""A run's start and end, announced to whoever listens: the one way news leaves the run path.

``outcomes`` announces (it is the only writer of final outcomes, see there); the listeners
live in their own modules and are subscribed when the app starts (``apps``): the alert
outbox (``alerts.OUTBOX``), the Django signals (``signals.SIGNALS``) and Sentry Crons
check-ins (``sentry.CRONS``). Nothing on the run path imports a listener, and no listener
imports the run path: both sides meet here, at the bottom.

A listener hears of an outcome at up to two moments:

* ``record``, inside the transaction that writes the outcome, for rows that must commit with
  it or not at all (the alert outbox). Only called when ``records`` says it may write
  something, so an outcome nobody records is one bare statement. Each listener's ``record``
  runs in a savepoint of its own.
* ``ended`` (and ``started``, after the claim of an execution's first attempt), after the
  commit: for news that cannot change what was recorded (signals, check-ins).

A listener that raises never breaks the run, the reconciler or whoever wrote the outcome:
its failure is logged with its traceback (so an error tracker sees it) and counted
(``failures``), and the other listeners still hear of the outcome. A failed ``record`` rolls
back only its own savepoint: the outcome is written without that listener's rows.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import logging
import threading
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from django.db import transaction

if TYPE_CHECKING:  # types only: a declaration needs nothing from here
    from cron_celery.declaring.registry import Job

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Started:
    """An execution's attempt was claimed (committed) and its body is about to run."""

    job: Job
    execution_id: int
    slot: dt.datetime
    attempt: int  # 1 for the execution's first attempt


@dataclasses.dataclass(frozen=True, kw_only=True)
class Ended:
    """An execution's outcome, or the end of one of its attempts.

    ``final``: the execution ended with ``status`` (False: an attempt ended and the execution
    goes on, RETRYING). ``lost_attempt``: that attempt lost its worker (LOST, retried).
    ``counted``: the write that ended it already counted the job's failure (every writer but
    the worker's own final write, which records first and counts in the same statement).
    ``recovered``: the job's first success after one or more failures.
    ``upstream_status``: a downstream slot (``after=``) that the database skipped (``UPSTREAM``) in
    the write that ended an upstream execution: the status that execution ended with (through a
    chain, the one whose write decided it: FAILED, LOST, REVOKED, SKIPPED, MISSED...); '' otherwise.
    ``runtime``: seconds the body of the attempt that ended took, when the worker ran it (None when
    another writer ended the execution: the parent, the reconciler, the admin).
    """

    job: Job | None
    job_id: int
    execution_id: int
    slot: dt.datetime
    status: str
    error_code: str = ""
    message: str = ""
    final: bool = True
    counted: bool = True
    lost_attempt: bool = False
    recovered: bool = False
    upstream_status: str = ""
    runtime: float | None = None


class Listener:
    """Override what you listen to; every method is called with the outcome's details."""

    #: Names the listener in logs and in ``failures``.
    name = "listener"

    def records(self, ended: Ended) -> bool:
        """Whether ``record`` may have anything to write for this outcome (saves a transaction)."""
        return False

    def record(self, ended: Ended) -> None:
        """Inside the outcome's transaction, before its final write: write what commits with it."""

    def started(self, started: Started) -> None:
        """After the claim of an execution's first attempt was committed."""

    def ended(self, ended: Ended) -> None:
        """After the outcome was committed."""


_listeners: tuple[Listener, ...] = ()
_lock = threading.Lock()
_failures: Counter[str] = Counter()


def subscribe(listener: Listener) -> None:
    """Add a listener (once: subscribing one of the same name again replaces it)."""
    global _listeners
    with _lock:
        kept = tuple(known for known in _listeners if known.name != listener.name)
        _listeners = (*kept, listener)


def unsubscribe(name: str) -> None:
    global _listeners
    with _lock:
        _listeners = tuple(known for known in _listeners if known.name != name)


def listeners() -> tuple[Listener, ...]:
    return _listeners


def failures() -> dict[str, int]:
    """How many calls of each listener raised in this process."""
    return dict(_failures)


def _guarded(listener: Listener, what: str, call: Callable[[], object], execution_id: int) -> None:
    try:
        call()
    except Exception:
        _failures[listener.name] += 1
        logger.exception("the %s listener failed on %s of execution %s; the outcome stands", listener.name, what,
                         execution_id)


def records(ended: Ended) -> bool:
    """Whether any listener may record something for this outcome (then it needs a transaction)."""
    for listener in _listeners:
        try:
            if listener.records(ended):
                return True
        except Exception:
            _failures[listener.name] += 1
            logger.exception("the %s listener failed to say whether it records execution %s", listener.name,
                             ended.execution_id)
    return False


def record(ended: Ended) -> None:
    """Call it inside the outcome's transaction: each listener that records writes its rows in a
    savepoint of its own."""

    for listener in _listeners:
        _guarded(listener, "recording", functools.partial(_record_in_savepoint, listener, ended), ended.execution_id)


def _record_in_savepoint(listener: Listener, ended: Ended) -> None:
    if listener.records(ended):
        with transaction.atomic():
            listener.record(ended)


def started(event: Started) -> None:
    for listener in _listeners:
        _guarded(listener, "the start", functools.partial(listener.started, event), event.execution_id)


def ended(event: Ended) -> None:
    for listener in _listeners:
        _guarded(listener, "the end", functools.partial(listener.ended, event), event.execution_id)
