"""Warm shutdown: running jobs are told to stop early, so a deploy does not wait on them.

When a worker receives SIGTERM, Celery stops taking messages and waits for running tasks.
cron_celery then sets ``requested`` and every running job's ``run.cancelled``; a
cooperative job checks ``run.shutdown_requested()`` (or calls ``run.check()``, which
raises ``Interrupted``) and returns or stops. With the prefork pool the jobs run in child
processes: the parent passes the news on with ``SIGUSR2`` to each child that is running a
cron job (the children install a handler for it when they start).

All of it runs inside signal handlers (Celery sends ``worker_shutting_down`` from its
SIGTERM handler), that is in the main thread between two bytecodes, wherever that thread
is: in a solo worker, inside the job itself. So nothing here takes a lock or sets a
``threading.Event`` (whose lock the interrupted code may hold): ``requested`` is a plain
flag, and the lease thread sets the runs' ``cancelled`` events (see ``leases.cancel_all``).
"""

from __future__ import annotations

import logging
import os
import signal
from typing import Any

from celery import signals

from cron_celery.declaring import registry
from cron_celery.run import leases

logger = logging.getLogger(__name__)


class Flag:
    """A flag that only ever goes up, safe to raise in a signal handler: unlike
    ``threading.Event`` it has no lock (reading and writing one attribute is atomic)."""

    __slots__ = ("_up",)

    def __init__(self) -> None:
        self._up = False

    def set(self) -> None:
        self._up = True

    def is_set(self) -> bool:
        return self._up


#: Set once this process was asked to shut down.
requested = Flag()
SIGNAL = signal.SIGUSR2


def request() -> None:
    """Ask every job running in this process to stop early. Safe in a signal handler."""
    requested.set()
    leases.cancel_all()


def _on_signal(signum: int, frame: Any) -> None:
    request()


def _child_started(**kwargs: Any) -> None:
    signal.signal(SIGNAL, _on_signal)


def _shutting_down(**kwargs: Any) -> None:
    request()  # pools that run jobs in this process (solo, threads)
    from celery.worker import state

    for pending in list(state.active_requests):
        pid = getattr(pending, "worker_pid", None)
        # A cron job's request: its task is a declared job's (a ``TrackedTask``).
        if pid and pid != os.getpid() and registry.by_task_name(str(getattr(pending, "name", ""))) is not None:
            try:
                os.kill(pid, SIGNAL)
            except ProcessLookupError:
                continue
            logger.info("asked worker process %s to stop %s early", pid, pending.name)


def connect() -> None:
    signals.worker_process_init.connect(_child_started, weak=False, dispatch_uid="cron_celery.run.shutdown.child")
    signals.worker_shutting_down.connect(_shutting_down, weak=False, dispatch_uid="cron_celery.run.shutdown.parent")
