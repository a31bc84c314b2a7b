"""Errors raised by cron_celery. A class's message is its ``message_template`` if it sets one, else its
docstring; the public ones (exported from ``cron_celery``) set one, so that their docstrings document them."""

from __future__ import annotations

import functools
from typing import Any, ClassVar


class CronCeleryError(Exception):
    """cron_celery failed; the message says what to do next."""

    #: The message, its ``{fields}`` filled from the keyword arguments. Read from the class itself, not
    #: inherited: a class that does not set it has its own docstring as its message.
    message_template: ClassVar[str | None] = None

    def __init__(self, detail: str = "", **context: Any) -> None:
        self.context = context
        self.detail = detail
        template = vars(type(self)).get("message_template")
        if template is None:
            template = self.__doc__ or ""
        message = " ".join(template.split()).format(**context)
        super().__init__(f"{message} {detail}".strip() if detail else message)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        """Pickled as itself, from what built it (a worker's child hands its exception to its parent,
        Celery's results keep it): rebuilt from its message, it would lack its fields, or say it twice."""
        return functools.partial(type(self), **self.context), (self.detail,)


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


class PauseRefused(CronCeleryError):
    """Job {job!r} was not paused:"""


class LockUnavailable(CronCeleryError):
    """Raised when entering ``cron_celery.lock(name)`` (the ``with`` block, or a call of a function it
    decorates) while another process holds the lock.

    A lock is non-blocking by default, so this means "someone else is doing this work right now":
    catch it to skip the work or try again later, or pass ``blocking=True`` (with a ``timeout``) to
    wait for the lock instead; with ``blocking=True`` it is raised only once ``timeout`` seconds have
    passed (without a ``timeout``, entering waits as long as it takes). Its message names the lock.
    """

    message_template = "The lock {name!r} is held elsewhere; try again later (or pass blocking=True)."


class LockDegraded(CronCeleryError):
    """The lock {name!r} cannot be taken: no quorum of its Redis masters answers (see LOCK MASTERS)."""


class LockLost(CronCeleryError):
    """Raised by ``held.check()`` of a ``cron_celery.lock`` once the lock was lost while held.

    The lock is lost when Redis says it is no longer this holder's (its key was deleted, flushed or
    taken), or when no renewal reached a quorum of the Redis masters for a whole ``ttl``, so that it
    expired. Another process may hold it now: stop the work the lock protects, without writing
    anything more that needs it, and start again later under a new lock. Leaving the ``with`` block
    does not raise it: call ``check()`` between steps (or watch ``held.lost``). A job that lets it
    escape is recorded as a failure with error code ``LOCK_LOST``.
    """

    message_template = (
        "The lock {name!r} was lost while held (its key was deleted or taken, or it expired while no quorum of "
        "its Redis masters answered for longer than its ttl): another process may hold it now; stop."
    )
    error_code = "LOCK_LOST"


class JobFailed(CronCeleryError):
    """Raise it from a job to report a failure, with a message and an error code of your own.

    ``raise JobFailed("partner down", error_code="HTTP_503")`` is recorded ``FAILED`` with exactly that
    message (no class name before it) and that error code (``JobFailed`` when none is given). Unlike
    returning ``{"error": True, ...}``, which records the same failure while the Celery task returns
    normally, the exception reaches Celery, so its tools (worker logs, Flower, Sentry's Celery
    integration) see the failure too. Like a returned error, it is retried only if the job is declared
    with ``retry_on_failure=True`` (and ``max_retries``).
    """

    def __init__(self, message: str = "", *, error_code: str = "") -> None:
        self.error_code = error_code
        Exception.__init__(self, message or "The job reported a failure.")

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return functools.partial(type(self), error_code=self.error_code), (str(self),)


class LeaseLost(CronCeleryError):
    """Raised by ``run.check()`` in a job once the run has been told to stop because it no longer
    owns its execution.

    That happens when another claim took the run over (its lease had expired: the worker was frozen
    or could not reach the database), when the worker could not renew the lease for a whole lease
    period, or when the job's Redis lock was lost. Let it propagate: stop at once, writing nothing
    more. If another run took over, or the reconciler already ended this one ``LOST``, its outcome
    is not recorded; otherwise it is recorded as a failure with error code ``LEASE_LOST``, retried
    by the job's retry policy.
    """

    message_template = "The run of job {job!r} lost its lease (another worker took it over); stop now."
    error_code = "LEASE_LOST"


class RunInTransaction(CronCeleryError):
    """Raised at once, before anything is written, when a job is called in-process (``task()``,
    ``task.apply()``, an eager ``delay()``, ``run_cron_task`` through ``call_command``) while the
    caller's database connection is inside a transaction of its own: a ``transaction.atomic()``
    block, a view under ``ATOMIC_REQUESTS``, or autocommit turned off.

    The run's claim would stay uncommitted until that transaction ends, holding the job's row
    locked for the whole run: the beat's rounds and every other run of the job would wait for it,
    and the lease could not be renewed (the run would be told to stop). Call the job after the
    commit, outside the transaction, or send it to the workers. Only the transaction a test case
    wraps each test in (Django's ``TestCase``, pytest-django's ``db``) is not refused.
    """

    message_template = (
        "Job {job!r} cannot run in-process inside the caller's database transaction (transaction.atomic(), "
        "ATOMIC_REQUESTS or autocommit turned off): its claim would keep the job's row locked until that "
        "transaction ends, holding up the beat and every other run of the job. Nothing was run or recorded. "
        "Call it outside the transaction, after the commit (transaction.on_commit(lambda: task.delay())), "
        "or send it to the workers (task.delay(), run_cron_task --enqueue)."
    )
    error_code = "IN_TRANSACTION"


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
