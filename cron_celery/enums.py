"""The values a job and an execution take: statuses, triggers, skip reasons and the job's
policies. Plain Python (no Django), so a job declaration (``registry``) and a Redis lock
(``locks``) need no models; ``models`` builds its field choices from these.

Each member is a ``str`` (it compares equal to its value and is stored as it) with a
human ``label``, as Django's ``TextChoices`` would have it.
"""

from __future__ import annotations

import enum
from typing import Any


class Choices(enum.StrEnum):
    """A ``StrEnum`` whose members are declared as ``VALUE = "value", "Label"``."""

    label: str

    def __new__(cls, value: str, label: str = "") -> Any:
        member = str.__new__(cls, value)
        member._value_ = value
        member.label = label or value.replace("_", " ").capitalize()
        return member

    @classmethod
    def choices(cls) -> list[tuple[str, str]]:
        """(value, label) pairs: a model field's ``choices``."""
        return [(member.value, member.label) for member in cls]


class Status(Choices):
    PENDING = "PENDING", "Pending"  # dispatched to the workers, not started yet
    RUNNING = "RUNNING", "Running"  # claimed by a worker that holds a live lease
    RETRYING = "RETRYING", "Retrying"  # an attempt failed; another attempt is scheduled
    SUCCEEDED = "SUCCEEDED", "Succeeded"  # the job returned without reporting an error
    FAILED = "FAILED", "Failed"  # the job raised or returned {"error": True}; no attempts left
    TIMED_OUT = "TIMED_OUT", "Timed out"  # the job hit its time limit
    LOST = "LOST", "Lost"  # the worker died or vanished; the lease expired
    SKIPPED = "SKIPPED", "Skipped"  # deliberately not run; skip_reason says why
    MISSED = "MISSED", "Missed"  # the slot was never dispatched (scheduler down)
    REVOKED = "REVOKED", "Revoked"  # its Celery task was revoked (Flower, celery control): stopped, not retried

    @classmethod
    def terminal(cls) -> frozenset[str]:
        """Statuses after which an execution never changes again."""
        return frozenset(
            {cls.SUCCEEDED, cls.FAILED, cls.TIMED_OUT, cls.LOST, cls.SKIPPED, cls.MISSED, cls.REVOKED}
        )

    @classmethod
    def failures(cls) -> frozenset[str]:
        """Terminal statuses that count as a failure (``success=False``)."""
        return frozenset({cls.FAILED, cls.TIMED_OUT, cls.LOST})


class Event(Choices):
    """What an alert is about."""

    FAILED = "FAILED", "Failed"  # the final attempt failed (retries never alert)
    TIMED_OUT = "TIMED_OUT", "Timed out"
    LOST = "LOST", "Lost"  # the worker died, or the message never reached one
    MISSED = "MISSED", "Missed"  # slots that will not run (no beat, or undelivered)
    RECOVERED = "RECOVERED", "Recovered"  # the first success after an alerted incident
    SUCCEEDED = "SUCCEEDED", "Succeeded"  # every success, for channels that want it
    UPSTREAM = "UPSTREAM", "Upstream failed"  # a slot skipped for an upstream's failure (alert_on_upstream=True)
    LATE = "LATE", "Late start"  # not started start_deadline seconds after it was due (still waiting)
    LONG_RUNNING = "LONG_RUNNING", "Running too long"  # still running max_runtime seconds after it started
    TOO_FAST = "TOO_FAST", "Finished too fast"  # succeeded in less than min_runtime seconds
    # The first success that took min_runtime after an alerted too-fast incident:
    TOO_FAST_RECOVERED = "TOO_FAST_RECOVERED", "Long enough again"
    PAUSED = "PAUSED", "Paused after failures"  # the job paused itself: pause_after_failures failures in a row


class AlertStatus(Choices):
    PENDING = "PENDING", "Pending"  # written with the state change; not delivered yet
    SENT = "SENT", "Sent"
    FAILED = "FAILED", "Failed"  # every delivery attempt failed; ``last_error`` says why


class Trigger(Choices):
    BEAT = "BEAT", "Beat"  # dispatched by the scheduler for its slot
    MANUAL = "MANUAL", "Manual"  # run in-process by `manage.py run_cron_task`
    ENQUEUE = "ENQUEUE", "Enqueued"  # sent to the workers by a person (`--enqueue`, API)
    ADMIN = "ADMIN", "Admin"  # started from the Django admin
    DIRECT = "DIRECT", "Direct call"  # the Celery task was called without cron headers
    CATCH_UP = "CATCH_UP", "Catch-up"  # a missed slot run after scheduler downtime
    BACKFILL = "BACKFILL", "Backfill"  # a past slot run on purpose
    UPSTREAM = "UPSTREAM", "Upstream"  # a job declared with after=: its upstream jobs' slot succeeded
    ONE_OFF = "ONE_OFF", "One-off"  # recorded ahead for a given time (--schedule, admin, API); sent by the beat then


class SkipReason(Choices):
    ALREADY_RAN = "ALREADY_RAN", "Slot already ran"  # the pattern forbids another run of it
    ALREADY_RUNNING = "ALREADY_RUNNING", "Slot is running"  # the same slot is in flight
    OVERLAP = "OVERLAP", "Job already running"  # another slot of the job holds a live lease
    PAUSED = "PAUSED", "Job paused"  # the job is paused in the admin
    LOCK_UNAVAILABLE = "LOCK_UNAVAILABLE", "Lock unavailable"  # another server holds the lock
    CONCURRENCY = "CONCURRENCY", "Concurrency limit"  # the job (max_concurrency) or its concurrency group is full
    UPSTREAM = "UPSTREAM", "Upstream did not succeed"  # an upstream job's execution of the slot failed or was skipped
    CANCELLED = "CANCELLED", "Cancelled"  # cancelled before it started (a one-off not sent, a waiting run)
    REMOVED = "REMOVED", "Job removed from the code"  # a deploy removed its job before it started (``removals``)


class ExecutionPattern(Choices):
    """A job's execution pattern: whether a new call for a slot runs, given the slot's other executions.

    Declared with ``@cron_task(pattern=...)`` or ``@register_task(..., execution_pattern=...)``, as a
    member or its value (``ExecutionPattern.RERUN_ON_FAILURE`` or ``"rerun_on_failure"``); a job that
    declares none takes the ``DEFAULT_PATTERN`` setting (``"standard"``). A new call for a slot runs
    unless:

    - ``STANDARD`` (``"standard"``): the slot already ran, whatever the outcome (``SUCCEEDED``,
      ``FAILED``, ``TIMED_OUT``, ``LOST``, ``REVOKED``, or ``RUNNING`` with an expired lease), or is
      in flight (``PENDING``, ``RETRYING``, ``RUNNING``); it is then skipped with reason
      ``ALREADY_RAN`` or ``ALREADY_RUNNING``. Each slot runs once.
    - ``RERUN_ON_FAILURE`` (``"rerun_on_failure"``): the slot already succeeded, or is in flight.
      A slot whose runs failed (``FAILED``, ``TIMED_OUT``, ``LOST``, ``REVOKED``) can be run again.
    - ``ALWAYS`` (``"always"``): nothing stops it; there is no slot check, and every call runs.
    - ``RATE_LIMITED`` (``"rate_limited"``): another execution of the job, of any slot, is running
      (skip reason ``OVERLAP``, or ``LOCK_UNAVAILABLE`` when another server holds the job's lock).
      There is no slot check, but never two runs at once, whatever the job's overlap policy; a
      backfill, catch-up or admin run that meets the live run is skipped rather than made to wait
      for it. ``max_concurrency`` cannot be declared with it.

    ``SKIPPED`` and ``MISSED`` executions do not count as having run. ``--rerun`` turns the slot
    check off for one call and ``--force`` also runs a paused job; a retry is not checked again. The
    overlap policy (``overlap=``) applies on top of every pattern.
    """

    STANDARD = "standard", "Standard"  # skip the slot if it already ran, whatever the outcome
    RERUN_ON_FAILURE = "rerun_on_failure", "Rerun on failure"  # skip only if it succeeded or runs
    ALWAYS = "always", "Always"  # no slot check: every call runs
    RATE_LIMITED = "rate_limited", "Rate limited"  # no slot check, but never two runs at once


class CatchUp(Choices):
    NONE = "none", "None"  # after scheduler downtime, record missed slots MISSED and wait
    LATEST = "latest", "Latest"  # run the most recent missed slot; record the rest MISSED
    ALL = "all", "All"  # run every missed slot (bounded per cycle)


class Overlap(Choices):
    SKIP = "skip", "Skip"  # never run two executions of the job at once (default)
    ALLOW = "allow", "Allow"  # executions of different slots may run side by side
    BUFFER_ONE = "buffer_one", "Buffer one"  # as skip, but one regular slot waits for the live run
