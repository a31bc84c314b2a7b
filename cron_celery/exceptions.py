"""Errors raised by cron_celery. The docstring of each class is its message."""

from __future__ import annotations

import functools
from typing import Any


class CronCeleryError(Exception):
    """cron_celery failed; the message says what to do next."""

    def __init__(self, detail: str = "", **context: Any) -> None:
        self.context = context
        message = " ".join((self.__doc__ or "").split()).format(**context)
        super().__init__(f"{message} {detail}".strip() if detail else message)


class ImproperlyDeclared(CronCeleryError):
    """Job {job!r} is declared incorrectly:"""


class DuplicateJob(CronCeleryError):
    """Two jobs share the {field} {value!r} ({first} and {second}). Give each job a unique name and code."""


class UnknownJob(CronCeleryError):
    """Unknown job {name!r}. Registered jobs: {known}. Run `manage.py list_cron_tasks` to see them."""


class InvalidSchedule(CronCeleryError):
    """Invalid schedule {value!r}:"""


class InvalidSlot(CronCeleryError):
    """Cannot read {value!r} as a slot:"""


class InvalidParams(CronCeleryError):
    """Job {job!r} cannot take these parameters:"""

    error_code = "INVALID_PARAMS"

    def __init__(self, detail: str = "", *, job: str, field: str) -> None:
        #: The parameter that is wrong (or ``params``/``kwargs`` for the whole).
        self.field = field
        self.detail = detail
        super().__init__(detail, job=job)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        """Pickled as itself (a worker's child hands its exception to its parent, Celery's results)."""
        return functools.partial(type(self), job=self.context["job"], field=self.field), (self.detail,)


class OneOffRefused(CronCeleryError):
    """No one-off run of job {job!r} at {at}:"""


class LockUnavailable(CronCeleryError):
    """The lock {name!r} is held elsewhere; try again later (or pass blocking=True)."""


class LockDegraded(CronCeleryError):
    """The lock {name!r} cannot be taken: no quorum of its Redis masters answers (see LOCK MASTERS)."""


class LockLost(CronCeleryError):
    """The lock {name!r} was lost while held (its key was deleted or taken, or it expired while no quorum of
    its Redis masters answered for longer than its ttl): another process may hold it now; stop."""

    error_code = "LOCK_LOST"


class JobFailed(CronCeleryError):
    """The job reported a failure."""

    def __init__(self, message: str = "", *, error_code: str = "") -> None:
        self.error_code = error_code
        Exception.__init__(self, message or "The job reported a failure.")


class LeaseLost(CronCeleryError):
    """The run of job {job!r} lost its lease (another worker took it over); stop now."""

    error_code = "LEASE_LOST"


class Interrupted(CronCeleryError):
    """The run of job {job!r} stopped because its worker is shutting down; it is tried again if attempts remain."""

    error_code = "INTERRUPTED"


class DeliveryFailed(CronCeleryError):
    """The alert could not be delivered:"""


class DeliveryAttemptFailed(DeliveryFailed):
    """Delivery attempt {attempt} of alert {alert} failed, it will be retried:"""


class UnknownChannel(CronCeleryError):
    """Unknown notification channel {name!r}: use email, slack, telegram, webhook, sentry, a name
    defined under NOTIFICATIONS['channels'], or a dotted path to a Channel class."""


class BackfillInterrupted(CronCeleryError):
    """The backfill sent {sent} of {total} slots and stopped at {slot}: every slot is recorded, and the
    reconciler sends those not sent yet once the broker answers (after PENDING_GRACE):"""


class PublishFailed(CronCeleryError):
    """could not be sent to the broker; nothing will run (the execution is closed FAILED, PUBLISH_FAILED)."""


class UnknownAuditedJob(CronCeleryError):
    """No job, and no recorded schedule change, goes by {name!r}: give a job's name or code."""
