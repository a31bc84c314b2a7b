"""Django signals for your own hooks, sent after an execution's outcome is committed.

Receivers get ``sender`` (the job's name) and keyword arguments ``execution_id``, ``job``
(name), ``code``, ``slot``, ``status``, ``error_code`` and ``message``::

    from cron_celery.signals import execution_failed

    @receiver(execution_failed)
    def page_someone(sender, execution_id, **details): ...

A receiver that raises is logged and ignored: it never changes the recorded outcome.
"""

from __future__ import annotations

import datetime as dt
import logging

from django.dispatch import Signal

from cron_celery import enums
from cron_celery.run import events

logger = logging.getLogger(__name__)
S = enums.Status

#: Final failure (FAILED or TIMED_OUT) after the last attempt.
execution_failed = Signal()
#: Every success.
execution_succeeded = Signal()
#: The first success after one or more failures.
execution_recovered = Signal()
#: The worker died or the message never reached one (final LOST).
execution_lost = Signal()
#: A call that was refused (SKIPPED, with its skip reason as ``error_code``), and each downstream
#: slot (``after=``) that the database skipped because an upstream did not succeed (``UPSTREAM``).
execution_skipped = Signal()


def send(*, job: str, code: str, execution_id: int, slot: dt.datetime, status: str, error_code: str = "",
         message: str = "", recovered: bool = False) -> None:
    """Send the signals this outcome calls for."""
    by_status: dict[str, list[Signal]] = {
        S.FAILED: [execution_failed], S.TIMED_OUT: [execution_failed], S.LOST: [execution_lost],
        S.SKIPPED: [execution_skipped], S.SUCCEEDED: [execution_succeeded]}
    chosen = by_status.get(status, [])
    if recovered:
        chosen = [*chosen, execution_recovered]
    for signal in chosen:
        for receiver, result in signal.send_robust(
            sender=job, job=job, code=code, execution_id=execution_id, slot=slot, status=status,
            error_code=error_code, message=message,
        ):
            if isinstance(result, Exception):
                logger.error("signal receiver %r failed for execution %s: %r", receiver, execution_id, result)


class Signals(events.Listener):
    """Sends the signals of every final outcome, after its commit."""

    name = "signals"

    def ended(self, ended: events.Ended) -> None:
        if ended.final:
            job = ended.job
            send(job=job.name if job is not None else "", code=job.code if job is not None else "",
                 execution_id=ended.execution_id, slot=ended.slot, status=ended.status,
                 error_code=ended.error_code, message=ended.message, recovered=ended.recovered)


SIGNALS = Signals()
