"""Warm shutdown: running jobs are told to stop early, so a deploy does not wait on them.

When a worker receives SIGTERM, Celery stops taking messages and waits for running tasks.
cron_celery then sets ``requested`` and every running job's ``run.cancelled``; a
cooperative job checks ``run.shutdown_requested()`` (or calls ``run.check()``, which
raises ``Interrupted``) and returns or stops. With the prefork pool the jobs run in child
processes: the parent passes the news on with ``SIGUSR2`` to each child that is running a
cron job (the children install a handler for it when they start).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

from celery import signals

from cron_celery import leases

logger = logging.getLogger(__name__)

#: Set once this process was asked to shut down.
requested = threading.Event()
SIGNAL = signal.SIGUSR2


def request() -> None:
    """Ask every job running in this process to stop early."""
    requested.set()
    leases.cancel_all()


def _on_signal(signum: int, frame: Any) -> None:
    request()


def _child_started(**kwargs: Any) -> None:
    signal.signal(SIGNAL, _on_signal)


def _shutting_down(**kwargs: Any) -> None:
    request()  # pools that run jobs in this process (solo, threads)
    from celery.worker import state

    from cron_celery import tasks

    for pending in list(state.active_requests):
        pid = getattr(pending, "worker_pid", None)
        if pid and pid != os.getpid() and isinstance(getattr(pending, "task", None), tasks.TrackedTask):
            try:
                os.kill(pid, SIGNAL)
            except ProcessLookupError:
                continue
            logger.info("asked worker process %s to stop %s early", pid, pending.name)


def connect() -> None:
    signals.worker_process_init.connect(_child_started, weak=False, dispatch_uid="cron_celery.shutdown.child")
    signals.worker_shutting_down.connect(_shutting_down, weak=False, dispatch_uid="cron_celery.shutdown.parent")
