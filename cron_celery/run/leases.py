"""Keeps the database leases of running executions alive.

One daemon thread per process renews every active run's lease each third of the lease
with a fenced ``UPDATE``; when the update matches no row (another worker took the
execution over, or it was marked lost) the run's ``cancelled`` event is set and the
process counts a ``fenced`` event. The thread keeps its own database connection.

``cancel_all`` is called from signal handlers (warm shutdown), which run in the main thread
between two bytecodes, wherever it is: possibly inside ``track`` with the registry's lock
held, or inside a job's ``run.cancelled.wait()``. So it takes no lock and sets no
``threading.Event``: it raises a plain flag and writes a byte to the thread's wake-up socket;
the lease thread then sets the runs' ``cancelled`` events, from its own thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
import threading
import time

from django.db import connection

from cron_celery.decisions import heartbeats
from cron_celery.run import locks

logger = logging.getLogger(__name__)


@dataclasses.dataclass(kw_only=True)
class _Active:
    execution_id: int
    fence: int
    lease_seconds: int
    cancelled: threading.Event
    extra: dict[str, object]
    lock: locks.JobLock | None = None
    due: float = 0.0
    confirmed: float = 0.0


_lock = threading.Lock()  # guards _active; never taken in a signal handler
_active: dict[int, _Active] = {}
_start_lock = threading.Lock()  # guards starting the thread
_thread: threading.Thread | None = None
#: (pid, the thread's end, the end that wakes it); replaced in one assignment after a fork.
_waker: tuple[int, socket.socket, socket.socket] | None = None
#: Set by ``cancel_all``: every run of this process, tracked now or later, is told to stop.
_stop_all = False
counters = {"fenced": 0, "heartbeat_errors": 0, "lock_lost": 0}
#: The longest the thread sleeps between two looks at what is due. A run tracked now is due a third
#: of its lease from now; only when that is sooner is the thread woken at once (a write to its
#: socket and a thread switch that a run of a minute's lease does not need).
IDLE_PAUSE = 1.0


def track(
    execution_id: int, fence: int, lease_seconds: int, cancelled: threading.Event,
    extra: dict[str, object], lock: locks.JobLock | None = None,
) -> None:
    """Start renewing this execution's lease (and its job lock) until ``untrack``."""
    now = time.monotonic()
    entry = _Active(execution_id=execution_id, fence=fence, lease_seconds=lease_seconds,
                    cancelled=cancelled, extra=extra, lock=lock, confirmed=now)
    entry.due = now + _period(entry)
    if _stop_all:
        cancelled.set()
    with _lock:
        _active[execution_id] = entry
    _ensure_thread()
    if entry.due - now < IDLE_PAUSE:  # the thread, asleep for up to IDLE_PAUSE, would wake too late
        _nudge()


def cancel_all() -> None:
    """Tell every run of this process to stop: those running and any tracked later (the worker
    is shutting down). Safe in a signal handler: no lock, no ``Event``; the lease thread sets
    the runs' ``cancelled`` events at once."""
    global _stop_all
    _stop_all = True
    _nudge()


def untrack(execution_id: int) -> None:
    with _lock:
        _active.pop(execution_id, None)


def _nudge() -> None:
    """Wake the lease thread; safe in a signal handler (one non-blocking ``send``)."""
    waker = _waker
    if waker is None or waker[0] != os.getpid():  # no thread in this process yet: it looks when it starts
        return
    with contextlib.suppress(OSError):  # a full socket: the thread is already due to wake
        waker[2].send(b"\0")


def _ensure_thread() -> None:
    global _thread, _waker
    if _thread is not None and _waker is not None and _waker[0] == os.getpid() and _thread.is_alive():
        return  # every run but a process's first: no lock taken
    with _start_lock:
        if _thread is not None and _thread.is_alive() and _waker is not None and _waker[0] == os.getpid():
            return
        if _waker is not None and _waker[0] != os.getpid():  # the parent's pair, inherited by a fork
            _waker[1].close()
            _waker[2].close()
        receiver, sender = socket.socketpair()
        sender.setblocking(False)
        _waker = (os.getpid(), receiver, sender)
        _thread = threading.Thread(target=_loop, args=(receiver,), name="cron-celery-leases", daemon=True)
        _thread.start()


def _loop(receiver: socket.socket) -> None:
    while True:
        try:
            if _stop_all:
                _cancel_tracked()
            _tick()
        except Exception:  # the thread must outlive any one failure
            logger.exception("lease thread failed a round; going on")
        with _lock:
            next_due = min((entry.due for entry in _active.values()), default=None)
        pause = IDLE_PAUSE if next_due is None else min(IDLE_PAUSE, max(0.02, next_due - time.monotonic()))
        _sleep(receiver, pause)


def _sleep(receiver: socket.socket, pause: float) -> None:
    """Wait ``pause`` seconds or until ``_nudge`` (a byte left over only wakes one more round)."""
    receiver.settimeout(pause)
    with contextlib.suppress(OSError):  # TimeoutError: nobody nudged
        receiver.recv(4096)


def _cancel_tracked() -> None:
    with _lock:
        entries = list(_active.values())
    for entry in entries:
        entry.cancelled.set()


def _tick() -> None:
    now = time.monotonic()
    with _lock:
        due = [entry for entry in _active.values() if entry.due <= now]
    for entry in due:
        renew(entry)
    if due or connection.connection is None:
        return
    with _lock:
        idle = not _active
    if idle:  # nothing to renew: give the connection back until a run needs it
        connection.close()
    else:  # drop a broken connection between rounds so that a database restart heals
        connection.close_if_unusable_or_obsolete()


def _period(entry: _Active) -> float:
    ttl = entry.lock.ttl if entry.lock is not None else entry.lease_seconds
    return min(entry.lease_seconds, ttl) / 3


def renew(entry: _Active) -> None:
    now = time.monotonic()
    if entry.lock is not None and not entry.cancelled.is_set():
        try:
            kept = entry.lock.extend()
        except Exception:
            logger.warning("job lock renewal failed", exc_info=True, extra=entry.extra)
            kept = True  # the database lease below still decides
        if not kept:
            counters["lock_lost"] += 1
            logger.warning("execution %s lost its job lock %s; asking the job to stop",
                           entry.execution_id, entry.lock.name, extra=entry.extra)
            entry.cancelled.set()
    try:
        held = heartbeats.heartbeat(entry.execution_id, entry.fence, entry.lease_seconds)
    except Exception:
        counters["heartbeat_errors"] += 1
        logger.warning("lease renewal failed; will retry", exc_info=True, extra=entry.extra)
        connection.close()
        entry.due = now + 1.0
        if now - entry.confirmed >= entry.lease_seconds:
            entry.cancelled.set()
        return
    if not held:
        counters["fenced"] += 1
        logger.warning(
            "execution %s was fenced: another claim owns it now; stopping",
            entry.execution_id, extra=entry.extra,
        )
        entry.cancelled.set()
        untrack(entry.execution_id)
        return
    entry.confirmed = now
    entry.due = now + _period(entry)
