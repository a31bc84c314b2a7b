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

The attempt is found by the job, this host and the child's pid, so a row another worker
has taken over since is never touched. When the parent itself dies, the reconciler does
the same after the lease expires.
"""

from __future__ import annotations

import logging
from typing import Any

from billiard.einfo import ExceptionWithTraceback  # type: ignore[attr-defined]
from billiard.exceptions import WorkerLostError
from celery.worker.request import Request
from django.db import DatabaseError, close_old_connections, connection

from cron_celery import claims, models, outcomes, registry, retries

logger = logging.getLogger(__name__)
S = models.Status


class CronRequest(Request):
    """Celery's worker-side request for ``TrackedTask`` messages (``TrackedTask.Request``)."""

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
        died = isinstance(exc, WorkerLostError) or (
            isinstance(exc, SystemExit | KeyboardInterrupt)
            and not (getattr(self, "_already_cancelled", False) or getattr(self, "_already_revoked", False))
        )
        if died:
            ended = self._record(S.LOST, "WORKER_LOST", f"The worker process {self.worker_pid} died: {exc}")
            if ended is not None and ended.status != S.RETRYING:
                self.acknowledge()  # final: do not let Celery requeue a job that keeps dying
        super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)

    def _record(self, status: str, code: str, message: str, *, retry: bool = True) -> claims.Ended | None:
        job = _job_of(self)
        if job is None or not self.worker_pid:
            return None
        from cron_celery import runs

        try:
            close_old_connections()
            ended = outcomes.dead(
                job, job_id=runs.job_id(job), status=status, error_code=code, message=message, retry=retry,
                worker=runs.HOSTNAME, pid=int(self.worker_pid),
            )
        except DatabaseError:
            logger.exception("could not record that the process running %s died", job.name)
            connection.close()
            return None
        if ended is not None:
            logger.warning("%s execution %s: %s (%s); now %s", job.name, ended.execution_id, message, code,
                           ended.status)
        return ended


def _job_of(request: Request) -> registry.Job | None:
    return getattr(request.task, "job", None) or registry.by_task_name(request.name)


def _send_retry(request: Request, job: registry.Job, ended: claims.Ended) -> None:
    from cron_celery import tasks

    try:
        tasks.send(request.task.app, job.task_name, execution_id=ended.execution_id, slot=ended.slot,
                   trigger=ended.trigger, countdown=retries.countdown(job, ended.retry_count - 1))
    except Exception:  # the reconciler sends it when the broker is back
        logger.exception("could not send the retry of execution %s", ended.execution_id)
