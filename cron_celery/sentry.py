"""Sentry: error events at a job's final failure, and Crons check-ins owned by cron_celery.

Nothing here does anything unless ``sentry_sdk.init()`` ran in the process. Check-ins are
sent for scheduled jobs when ``"sentry"`` is one of the job's failure channels (and
``NOTIFICATIONS["sentry"]["crons"]`` is not False): ``in_progress`` at the first claim of
an execution (its id is kept on the row), then ``ok`` or ``error`` once, at the final
outcome, so retries never report an error. The monitor is created or updated from the job
(``monitor_config``). Celery's own ``CeleryIntegration(monitor_beat_tasks=True)`` only
watches entries of Celery's beat schedule, which never include cron_celery's jobs, so
nothing is reported twice.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import sentry_sdk
from sentry_sdk.crons import capture_checkin

from cron_celery import conf, exceptions, registry, retries, schedules
from cron_celery.notifiers.base import Channel, Message

logger = logging.getLogger(__name__)


def active() -> bool:
    """Whether ``sentry_sdk.init()`` ran here with a DSN (events would go somewhere)."""
    client = sentry_sdk.get_client()
    return bool(client.is_active() and getattr(client, "dsn", None) and getattr(client, "transport", None))


def options() -> dict[str, Any]:
    value = conf.settings.NOTIFICATIONS.get("sentry") or {}
    return dict(value) if isinstance(value, dict) else {}


def crons_enabled(job: registry.Job) -> bool:
    from cron_celery import alerts

    return (job.schedule is not None and active() and options().get("crons", True) is not False
            and "sentry" in alerts.channel_names(job, "FAILED"))


def monitor_config(job: registry.Job) -> dict[str, Any]:
    """The monitor as Sentry should know it: schedule, timezone, margin, runtime, thresholds."""
    assert job.schedule is not None
    schedule: dict[str, Any]
    if isinstance(job.schedule, schedules.Interval):
        schedule = {"type": "interval", "value": max(1, math.ceil(job.schedule.seconds / 60)), "unit": "minute"}
    else:
        schedule = {"type": "crontab", "value": job.schedule.expression}
    per_attempt = job.time_limit or float(options().get("max_runtime_per_attempt", 3600))
    waits = sum(retries.longest_wait(job, n) for n in range(job.max_retries))
    return {
        "schedule": schedule,
        # A schedule may carry its own zone (daily(at(6).am(), timezone=...)); it wins.
        "timezone": job.schedule.timezone or job.timezone,
        "checkin_margin": int(options().get("checkin_margin", 1)),
        "max_runtime": max(1, math.ceil((per_attempt * (job.max_retries + 1) + waits) / 60)),
        "failure_issue_threshold": max(1, job.alert_after),
        "recovery_threshold": int(options().get("recovery_threshold", 1)),
    }


def in_effect(job: registry.Job) -> registry.Job:
    """The job with the schedule the beat runs: an admin edit wins over the code."""
    from cron_celery import schedule_sync  # it imports runs, which imports this module

    return schedule_sync.in_effect(job)


#: The monitor configuration sent with each open check-in, by check-in id, so that its
#: closing check-in repeats it without reading the job's schedule again (one query per run,
#: not two). Left behind only by a check-in closed in another process (a killed child's).
_open_configs: dict[str, dict[str, Any]] = {}


def checkin_started(job: registry.Job) -> str:
    """Send ``in_progress``; returns the check-in id ("" when Sentry is off)."""
    if not crons_enabled(job):
        return ""
    try:
        config = monitor_config(in_effect(job))
        check_in_id = capture_checkin(monitor_slug=job.name, status="in_progress",
                                      monitor_config=config) or ""  # type: ignore[arg-type]
    except Exception:  # monitoring must never break a run
        logger.exception("could not send the Sentry check-in of %s", job.name)
        return ""
    if len(_open_configs) >= 1000:
        _open_configs.clear()
    if check_in_id:
        _open_configs[check_in_id] = config
    return check_in_id


def checkin_finished(job: registry.Job, check_in_id: str, ok: bool, duration: float | None) -> None:
    if not check_in_id or not crons_enabled(job):
        return
    try:
        config = _open_configs.pop(check_in_id, None) or monitor_config(in_effect(job))
        capture_checkin(monitor_slug=job.name, check_in_id=check_in_id, status="ok" if ok else "error",
                        duration=duration, monitor_config=config)  # type: ignore[arg-type]
    except Exception:
        logger.exception("could not send the Sentry check-in of %s", job.name)


#: The options of ``NOTIFICATIONS["sentry"]``, each with the rule its value must meet.
OPTION_RULES: dict[str, tuple[str, Any]] = {
    "crons": ("True or False", lambda value: isinstance(value, bool)),
    "checkin_margin": ("a whole number of minutes, at least 1",
                       lambda value: isinstance(value, int) and not isinstance(value, bool) and value >= 1),
    "recovery_threshold": ("a whole number, at least 1",
                           lambda value: isinstance(value, int) and not isinstance(value, bool) and value >= 1),
    "max_runtime_per_attempt": ("a number of seconds above 0",
                                lambda value: isinstance(value, int | float) and not isinstance(value, bool)
                                and value > 0),
}


class SentryChannel(Channel):
    """Error events: one per final failure, tagged and grouped per job and error code."""

    def problems(self) -> list[str]:
        found = [f"unknown option {key!r} (known: {', '.join(OPTION_RULES)})"
                 for key in sorted(self.options) if key not in OPTION_RULES]
        found += [f"option {key!r} must be {rule}, not {self.options[key]!r}"
                  for key, (rule, good) in OPTION_RULES.items() if key in self.options and not good(self.options[key])]
        return found + super().problems()

    def send(self, message: Message, timeout: float) -> None:
        if not active():
            raise exceptions.DeliveryFailed("sentry-sdk is not initialised in this worker (call sentry_sdk.init).")
        first_line = (message.error.strip().splitlines() or [message.status])[0][:200]
        event: dict[str, Any] = {
            "level": "error",
            "logger": "cron_celery",
            "message": f"{message.job} ({message.code}) {message.status}: {first_line}",
            "tags": {"cron.job": message.job, "cron.code": message.code, "cron.slot": message.slot.isoformat(),
                     "cron.attempt": str(message.attempt), "cron.event": message.event},
            "fingerprint": ["cron_celery", message.code, message.error_code or message.status],
            "extra": {"execution_id": message.execution_id, "admin_url": message.admin_url,
                      "traceback": message.traceback[-8000:], "error": message.excerpt()},
        }
        if sentry_sdk.capture_event(event) is None:  # type: ignore[arg-type]
            raise exceptions.DeliveryFailed("sentry-sdk dropped the event (sampling or before_send).")
