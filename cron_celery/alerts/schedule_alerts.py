"""Alerts about a job's schedule, not an execution: an admin edit (or a stored schedule) that cannot
drive its job, told to the job's failure channels once per new reason."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from typing import Any

from celery import shared_task

from cron_celery import conf, exceptions
from cron_celery.alerts.channels import E, channel, deliverable
from cron_celery.declaring import registry
from cron_celery.notifiers.base import Channel, Message

logger = logging.getLogger(__name__)


## Nothing ran and no slot was missed — the job stays on its previous schedule, or paused — so
# no execution stands behind this alert and it has no outbox row. The problem itself is
# stored on the job (``CronJob.schedule_problem``, shown in the dashboard, cleared by a usable
# edit); this tells the job's failure channels once per new reason, through a task with
# retries like ``deliver_alert``. If the broker is down at that moment the alert is logged
# as not sent; the dashboard and the beat's log still say it.

#: The ``event`` of these alerts, and their ``error_code``.
SCHEDULE_EVENT, SCHEDULE_NOT_APPLIED = "SCHEDULE", "SCHEDULE_NOT_APPLIED"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScheduleMessage(Message):
    """A job's schedule edit that was not applied: no slot, no execution; ``slot`` is when
    it was found, ``status`` what the job does meanwhile, ``error`` the reason."""

    @property
    def title(self) -> str:
        return f"[cron] {self.job} ({self.code}): schedule edit not applied"

    @property
    def failing(self) -> bool:
        return True

    def facts(self) -> list[tuple[str, str]]:
        return [("Job", f"{self.job} ({self.code})"), ("Meanwhile", self.status),
                ("Found", self.slot.strftime("%Y-%m-%d %H:%M:%S UTC")), ("Error code", self.error_code)]

    def as_dict(self) -> dict[str, Any]:
        return {**super().as_dict(), "slot": None, "execution_date": None, "execution_id": None,
                "run_number": None, "attempt": None, "trigger": None, "found_at": self.slot.isoformat()}


def schedule_problem(job: registry.Job | None, *, code: str, name: str, problem: str, state: str) -> int:
    """Queue the alert that a job's schedule edit cannot drive it, one task per failure
    channel of the job; returns how many were queued."""
    found = dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()
    queued = 0
    for channel_name in deliverable(job, E.FAILED):
        try:
            deliver_schedule_problem.apply_async((code, name, channel_name, problem, state, found),
                                                 ignore_result=True)
            queued += 1
        except Exception as error:
            logger.warning("could not queue the schedule alert of cron job %s on %s (%s)", name, channel_name, error)
    return queued


def schedule_message(*, code: str, name: str, problem: str, state: str, found: dt.datetime) -> ScheduleMessage:
    base = str(conf.settings.ADMIN_BASE_URL or "").rstrip("/")
    return ScheduleMessage(
        event=SCHEDULE_EVENT, job=name, code=code, slot=found, execution_date=found.date(), execution_id=0,
        run_number=0, attempt=0, status=state, trigger="", duration=None, error_code=SCHEDULE_NOT_APPLIED,
        error=problem, traceback="", admin_url=f"{base}/admin/cron_celery/cronjob/?q={code}" if base else "",
    )


@shared_task(name="cron_celery.deliver_schedule_problem", bind=True, max_retries=None, ignore_result=True)
def deliver_schedule_problem(self: Any, code: str, name: str, channel_name: str, problem: str, state: str,
                             found: str) -> str:
    """Send one schedule alert; a failed attempt is retried with the backoff of
    ``deliver_alert`` until ``NOTIFICATIONS["max_attempts"]``."""
    settings = conf.settings.NOTIFICATIONS
    message = schedule_message(code=code, name=name, problem=problem, state=state,
                               found=dt.datetime.fromisoformat(found))
    target: Channel | None = None
    try:
        target = channel(channel_name)
        target.send(message, float(settings.get("timeout", 10)))
    except Exception as failure:  # a channel must never break the worker
        text = f"{type(failure).__name__}: {failure}"
        text = target.redact(text) if target is not None else text
        attempt = self.request.retries + 1
        if attempt >= int(settings.get("max_attempts", 5)):
            logger.error("schedule alert of cron job %s on %s, attempt %d, given up: %s", name, channel_name,
                         attempt, text)
            return "FAILED"
        logger.warning("schedule alert of cron job %s on %s, attempt %d: %s", name, channel_name, attempt, text)
        raise self.retry(countdown=min(300, 2 ** attempt), exc=exceptions.DeliveryFailed(text)) from None
    return "SENT"
