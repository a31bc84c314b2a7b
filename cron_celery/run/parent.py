"""What a worker's parent process records when the child running a job dies or is killed.

With the prefork pool a job runs in a child process. If the hard time limit kills it, or
it dies (SIGKILL, out of memory, ``os._exit``), the child cannot record anything; the
parent can, and does so at once instead of waiting for the lease to expire:

* the attempt ends ``TIMED_OUT`` (hard limit) or ``LOST`` (the process died);
* if the job's row allows another attempt the execution becomes ``RETRYING``: after a
  death the message Celery requeues (``reject_on_worker_lost``) carries the retry, after
  the hard limit (whose message Celery acknowledges) a new message is sent with the
  job's backoff;
* otherwise the outcome is final and the message is acknowledged, so a job that kills its
  own process cannot loop.

The attempt is found by the execution the request ran (its ``cron_execution_id`` header, else
the Celery task id its claim recorded), this worker (``identity.WORKER``: the host and the boot of
this main process, which its children share) and the child's pid: never by host and pid alone,
which repeat across pid namespaces (containers with host networking). So a row another worker
runs, or has taken over since, is never touched; nor is a run the job's next run superseded (its
lease ran out while its worker was frozen or cut off): that death is fenced like its outcome.
When the parent itself dies, the reconciler does the same after the lease expires.

A revoked task (``celery control revoke``/``terminate``, Flower) ends its execution
``REVOKED`` at once, final: with ``terminate`` the row is written *before* the child is
signalled, so whatever the child still does (its own failure write, a retry) finds it ended;
a message revoked before it ran is recorded when the worker discards it (or at once with
``terminate``). Nothing is retried, requeued or sent again.
"""

from __future__ import annotations

import logging
import signal as signals
from typing import Any

from billiard.einfo import ExceptionWithTraceback  # type: ignore[attr-defined]
from billiard.exceptions import WorkerLostError
from celery.concurrency.base import BasePool
from celery.platforms import signals as celery_signals
from celery.worker.request import Request
from django.db import DatabaseError, close_old_connections, connection

from cron_celery import enums, exceptions
from cron_celery.decisions import jobs, repairs
from cron_celery.declaring import registry
from cron_celery.run import identity, outcomes, retries, tasks

logger = logging.getLogger(__name__)
S = enums.Status


class CronRequest(Request):
    """Celery's worker-side request for ``TrackedTask`` messages (``TrackedTask.Request``), and for the
    tasks a worker wraps for tracked periodic tasks (``tracking.worker``) that keep Celery's own request
    class: a message of theirs without the ``cron_job`` header is Celery's request, unchanged."""

    def on_timeout(self, soft: bool, timeout: float) -> None:
        if not soft:
            job = _job_of(self)
            ended = self._record(S.TIMED_OUT, "TIME_LIMIT",
                                 f"Killed by the hard time limit ({timeout:g} s).",
                                 retry=job is not None and retries.wanted_after_kill(job))
            if job is not None and ended is not None and ended.status == S.RETRYING:
                _send_retry(self, job, ended)
        super().on_timeout(soft, timeout)

    def on_failure(self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False) -> None:
        exc = exc_info.exception
        if isinstance(exc, ExceptionWithTraceback):
            exc = exc.exc
        revoked = getattr(self, "_already_revoked", False)  # recorded REVOKED already (``terminate``)
        stopped = revoked or getattr(self, "_already_cancelled", False)
        died = (isinstance(exc, WorkerLostError) and not revoked) or (
            isinstance(exc, SystemExit | KeyboardInterrupt) and not stopped)
        if died:
            ended = self._record(S.LOST, "WORKER_LOST", f"The worker process {self.worker_pid} died: {exc}")
            if ended is not None and ended.status != S.RETRYING:
                self.acknowledge()  # final: do not let Celery requeue a job that keeps dying
        super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)

    def terminate(self, pool: Any, signal: Any = None) -> None:
        """``revoke(terminate=True)``: the run is recorded REVOKED before its process is signalled."""
        number = celery_signals.signum(signal or "SIGTERM")
        try:
            name = signals.Signals(number).name
        except ValueError:
            name = str(number)
        ended_run = False
        if self.time_start and self.worker_pid:
            if getattr(pool.terminate_job, "__func__", None) is not BasePool.terminate_job:  # solo cannot stop one
                ended_run = self._revoke(f"Revoked: its worker process {self.worker_pid} was sent {name} "
                                         "(revoke with terminate).")
        else:
            self._revoke("Revoked before it started (revoke with terminate).")
        super().terminate(pool, signal)
        if ended_run:  # only once its process was signalled: never two runs of the job at once
            self._send_waiting()

    def _announce_revoked(self, reason: str, terminated: bool, signum: Any, expired: bool) -> None:
        # Celery's one path for a revoked request: discarded before it ran, or its process
        # terminated. An expired message (``expires=``) is left to the reconciler, like any
        # message that did not run in time.
        ended_run = False
        if not expired and not getattr(self, "_cron_revoked", False):
            if terminated:
                ended_run = self._revoke(f"Revoked: its worker process was terminated ({signum}).")
            else:
                self._revoke("Revoked before it started: the worker discarded its message.")
        super()._announce_revoked(reason, terminated, signum, expired)  # type: ignore[misc]
        if ended_run:
            self._send_waiting()

    def _send_waiting(self) -> None:
        job = _job_of(self)
        if job is not None:  # the job's live run is over: an execution waiting for it may start
            tasks.send_waiting(self.task.app, job)

    def _revoke(self, message: str) -> bool:
        """Record the revocation once (``finishes.revoke``); a failure is logged, never raised into Celery.
        True when it ended a run that had started (the caller sends the job's waiting execution once
        that run's process is stopped)."""
        job = _job_of(self)
        if job is None or getattr(self, "_cron_revoked", False):
            return False
        self._cron_revoked = True
        try:
            close_old_connections()
            ended = outcomes.revoked(job, job_id=jobs.job_id(job), message=message,
                                     execution_id=_execution_of(self), task_id=self.id or "", worker=identity.WORKER,
                                     pid=int(self.worker_pid) if self.time_start and self.worker_pid else None)
        except DatabaseError:
            logger.exception("could not record that %s was revoked", job.name)
            connection.close()
            return False
        if ended is None:
            return False
        logger.warning("%s execution %s now REVOKED: %s", job.name, ended.execution_id, message)
        return bool(ended.started)

    def _record(self, status: str, code: str, message: str, *, retry: bool = True) -> repairs.Ended | None:
        job = _job_of(self)
        if job is None or not self.worker_pid:
            return None
        try:
            close_old_connections()
            ended = outcomes.dead(
                job, job_id=jobs.job_id(job), status=status, error_code=code, message=message, retry=retry,
                worker=identity.WORKER, pid=int(self.worker_pid), execution_id=_execution_of(self),
                task_id=self.id or "",
            )
        except DatabaseError:
            logger.exception("could not record that the process running %s died", job.name)
            connection.close()
            return None
        if ended is not None:
            logger.warning("%s execution %s: %s (%s); now %s", job.name, ended.execution_id, message, code,
                           ended.status)
            tasks.send_waiting(self.task.app, job)  # the job's live run is over: a waiting execution may start
        return ended


def _execution_of(request: Request) -> int | None:
    """The execution the request's message names (its ``cron_execution_id`` header), if any."""
    header = request.request_dict.get(tasks.HEADER_EXECUTION)
    return int(header) if header else None


def _job_of(request: Request) -> registry.Job | None:
    """The job of the request: a cron job's task, else the tracked periodic task its ``cron_job`` header
    names (read from its row); None for any other message."""
    code = request.request_dict.get(tasks.HEADER_JOB)
    if code:
        for attempt in range(2):
            try:
                return registry.get(str(code))
            except exceptions.UnknownJob:
                return None
            except DatabaseError:  # the parent's connection went stale between messages: once more
                connection.close()
                if attempt:
                    logger.exception("could not read the tracked job %s", code)
        return None
    return getattr(request.task, "job", None) or registry.by_task_name(request.name)


def _send_retry(request: Request, job: registry.Job, ended: repairs.Ended) -> None:
    try:
        tasks.send(request.task.app, job.task_name, execution_id=ended.execution_id, slot=ended.slot,
                   trigger=ended.trigger, countdown=retries.countdown(job, ended.retry_count - 1))
    except Exception:  # the reconciler sends it when the broker is back
        logger.exception("could not send the retry of execution %s", ended.execution_id)
