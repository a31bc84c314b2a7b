"""The errors cron_celery's system checks find (``cron_celery.checks`` defines and registers them): run
through Django's check framework, once per process for the pages that ask on every request, and the
refusal of a worker or beat that starts with one."""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any

from django.core import checks
from django.core.signals import setting_changed
from django.dispatch import receiver

TAG = "cron_celery"

logger = logging.getLogger(__name__)


def errors() -> list[checks.CheckMessage]:
    """cron_celery's system check errors that are not silenced."""
    return [message for message in checks.run_checks(tags=[TAG])
            if message.level >= checks.ERROR and not message.is_silenced()]


_found: list[checks.CheckMessage] | None = None
_found_lock = threading.Lock()


def process_errors() -> list[checks.CheckMessage]:
    """``errors()`` run once per process and kept (the health endpoint and the admin banner
    ask on every request); run again after a settings change (tests' ``override_settings``)."""
    global _found
    found = _found
    if found is None:
        with _found_lock:
            found = _found
            if found is None:
                found = _found = errors()
    return list(found)


@receiver(setting_changed)
def _forget_errors(**_kwargs: Any) -> None:
    global _found
    _found = None


def refuse_to_start(what: str) -> None:
    """Stop a worker or beat that starts with cron_celery check errors. It raises
    ``SystemExit``: Celery logs and swallows any other exception a signal receiver raises."""
    found = errors()
    if not found:
        return
    text = "\n".join(f"  {message}" + (f"\n    HINT: {message.hint}" if message.hint else "") for message in found)
    logger.critical("cron_celery: the %s refuses to start; the system checks found:\n%s", what, text)
    sys.stderr.write(f"cron_celery: the {what} refuses to start; the system checks found:\n{text}\n")
    sys.stderr.flush()
    raise SystemExit(1)
