"""Sentry Crons check-ins owned by cron_celery: a listener of the run's start and end.

Nothing here does anything unless sentry-sdk is installed (the ``[sentry]`` extra) and
``sentry_sdk.init()`` ran in the process. Check-ins are
sent for scheduled jobs when ``"sentry"`` is one of the job's failure channels (and
``NOTIFICATIONS["sentry"]["crons"]`` is not False): ``in_progress`` at the first claim of
an execution (its id is kept on the row), then ``ok`` or ``error`` once, at the final
outcome, so retries never report an error. The monitor is created or updated from the job
(``monitor_config``). Celery's own ``CeleryIntegration(monitor_beat_tasks=True)`` only
watches entries of Celery's beat schedule, which never include cron_celery's jobs, so
nothing is reported twice. The error events of final failures are an alert channel
(``notifiers.sentry``); ``SentryChannel``, ``active`` and ``options`` are named here too.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from cron_celery import enums, schedules
from cron_celery.alerts import channels
from cron_celery.decisions import heartbeats
from cron_celery.decisions import in_effect as effective
from cron_celery.declaring import registry
from cron_celery.notifiers.sentry import OPTION_RULES, SentryChannel, active, options
from cron_celery.run import events, retries

try:
    from sentry_sdk.crons import capture_checkin
except ImportError:  # the [sentry] extra is not installed: active() is False, nothing is sent
    capture_checkin = None  # type: ignore[assignment]

__all__ = ["CRONS", "OPTION_RULES", "SentryChannel", "active", "checkin_finished", "checkin_started",
           "crons_enabled", "in_effect", "monitor_config", "options"]

logger = logging.getLogger(__name__)
S = enums.Status


def crons_enabled(job: registry.Job) -> bool:
    return (job.schedule is not None and active() and options().get("crons", True) is not False
            and "sentry" in channels.channel_names(job, "FAILED"))


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
        # A job with jitter checks in up to its offset after the slot: the margin covers it.
        # A declared start_deadline widens the margin to itself (Sentry counts whole minutes).
        "checkin_margin": max(int(options().get("checkin_margin", 1)),
                              math.ceil((job.start_deadline or 0) / 60)) + math.ceil(job.jitter_ms / 60_000),
        # A declared max_runtime is the monitor's too (Sentry then records the check-in as timed out:
        # a failure there, where cron_celery only warns with LONG_RUNNING).
        "max_runtime": max(1, math.ceil((job.max_runtime if job.max_runtime is not None
                                         else per_attempt * (job.max_retries + 1) + waits) / 60)),
        "failure_issue_threshold": max(1, job.alert_after),
        "recovery_threshold": int(options().get("recovery_threshold", 1)),
    }


def in_effect(job: registry.Job) -> registry.Job:
    """The job with the schedule the beat runs: an admin edit wins over the code."""
    return effective.in_effect(job)


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


class Crons(events.Listener):
    """Opens a check-in at an execution's first attempt and closes it at its final outcome."""

    name = "sentry-crons"

    def __init__(self) -> None:
        #: Check-ins opened in this process, by execution id: closing one needs no query.
        self._opened: dict[int, str] = {}

    def started(self, started: events.Started) -> None:
        if started.attempt != 1 or not crons_enabled(started.job):
            return
        check_in_id = checkin_started(started.job)
        if check_in_id:
            heartbeats.set_checkin(started.execution_id, check_in_id)
            if len(self._opened) >= 1000:
                self._opened.clear()
            self._opened[started.execution_id] = check_in_id

    def ended(self, ended: events.Ended) -> None:
        job = ended.job
        if (job is None or not ended.final or ended.status not in S.terminal()
                or ended.status in (S.SKIPPED, S.MISSED) or not crons_enabled(job)):
            return
        check_in_id = self._opened.pop(ended.execution_id, "") or heartbeats.checkin_of(ended.execution_id)
        checkin_finished(job, check_in_id, ended.status == S.SUCCEEDED, None)


CRONS = Crons()
