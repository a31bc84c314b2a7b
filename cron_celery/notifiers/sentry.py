"""Sentry as an alert channel: one error event per final failure, grouped per job and error code.

Nothing is sent unless ``sentry_sdk.init()`` ran in the process (``active``). Crons check-ins
are not alerts: they live in ``cron_celery.alerts.sentry``, a listener of the run's start and end.
sentry-sdk is the ``[sentry]`` extra: without it nothing is ever active, and a channel list
that names ``sentry`` is a configuration error (``problems``, system check E011).
"""

from __future__ import annotations

from typing import Any

from cron_celery import conf, exceptions
from cron_celery.notifiers.base import Channel, Message

try:
    import sentry_sdk
except ImportError:  # the [sentry] extra is not installed
    sentry_sdk = None  # type: ignore[assignment]

#: What to run when sentry-sdk is missing.
INSTALL = "pip install 'cron_celery[sentry]'"


def installed() -> bool:
    """Whether sentry-sdk can be imported here (the ``[sentry]`` extra)."""
    return sentry_sdk is not None


def active() -> bool:
    """Whether ``sentry_sdk.init()`` ran here with a DSN (events would go somewhere)."""
    if sentry_sdk is None:
        return False
    client = sentry_sdk.get_client()
    return bool(client.is_active() and getattr(client, "dsn", None) and getattr(client, "transport", None))


def options() -> dict[str, Any]:
    value = conf.settings.NOTIFICATIONS.get("sentry") or {}
    return dict(value) if isinstance(value, dict) else {}


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
        if not installed():
            return [f"sentry-sdk is not installed ({INSTALL})"]
        found = [f"unknown option {key!r} (known: {', '.join(OPTION_RULES)})"
                 for key in sorted(self.options) if key not in OPTION_RULES]
        found += [f"option {key!r} must be {rule}, not {self.options[key]!r}"
                  for key, (rule, good) in OPTION_RULES.items() if key in self.options and not good(self.options[key])]
        return found + super().problems()

    def send(self, message: Message, timeout: float) -> None:
        if not installed():
            raise exceptions.DeliveryFailed(f"sentry-sdk is not installed in this worker ({INSTALL}).")
        if not active():
            raise exceptions.DeliveryFailed("sentry-sdk is not initialised in this worker (call sentry_sdk.init).")
        first_line = (message.error.strip().splitlines() or [message.status])[0][:200]
        event: dict[str, Any] = {
            "level": "warning" if message.warning else "error",
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
