"""The alert channels: which a job's event goes to (its own ``notify`` or the settings' lists), each
channel built once from ``NOTIFICATIONS``, and what is wrong with their configuration (check E011)."""

from __future__ import annotations

import functools
import logging

from django.utils.module_loading import import_string

from cron_celery import conf, enums, exceptions, models
from cron_celery.declaring import registry
from cron_celery.notifiers import sentry as notifiers_sentry
from cron_celery.notifiers.base import Channel

logger = logging.getLogger(__name__)

S = enums.Status
E = enums.Event
JOB = models.CronJob._meta.db_table
EXE = models.CronExecution._meta.db_table
ALERT = models.Alert._meta.db_table

BUILT_IN = {
    "email": "cron_celery.notifiers.email.EmailChannel",
    "slack": "cron_celery.notifiers.http.SlackChannel",
    "telegram": "cron_celery.notifiers.http.TelegramChannel",
    "webhook": "cron_celery.notifiers.http.WebhookChannel",
    "sentry": "cron_celery.notifiers.sentry.SentryChannel",
}
#: Which ``NOTIFICATIONS`` list names the channels of each event.
KIND = {E.FAILED: "on_failure", E.TIMED_OUT: "on_failure", E.LOST: "on_failure", E.MISSED: "on_failure",
        E.RECOVERED: "on_recovery", E.SUCCEEDED: "on_success", E.UPSTREAM: "on_failure", E.LATE: "on_failure",
        E.LONG_RUNNING: "on_failure", E.TOO_FAST: "on_failure", E.TOO_FAST_RECOVERED: "on_recovery",
        E.PAUSED: "on_failure"}
#: The upstream outcomes whose skip of a downstream slot alerts a job declared with
#: ``alert_on_upstream=True`` (event UPSTREAM): the failures.
UPSTREAM_FAILURES = frozenset({S.FAILED, S.TIMED_OUT, S.LOST})


def channel_names(job: registry.Job | None, event: str) -> tuple[str, ...]:
    """The channels that hear of ``event`` for this job (its ``notify=``, else the settings)."""
    kind = KIND[enums.Event(event)]
    own = job.notify_for(kind) if job is not None else None
    names = own if own is not None else conf.settings.NOTIFICATIONS.get(kind) or ()
    return tuple(dict.fromkeys(str(name) for name in names))


def channel(name: str) -> Channel:
    """The channel called ``name``: built in, defined under ``NOTIFICATIONS["channels"]``
    (``{"pager": {"class": "myproj.alerts.Pager", ...options}}``) or a dotted path."""
    return _channel(name, repr(conf.settings.NOTIFICATIONS))


@functools.lru_cache(maxsize=64)
def _channel(name: str, _settings_key: str) -> Channel:
    settings = conf.settings.NOTIFICATIONS
    defined = (settings.get("channels") or {}).get(name)
    if isinstance(defined, dict):
        path, options = str(defined.get("class", "")), {k: v for k, v in defined.items() if k != "class"}
    elif name in BUILT_IN:
        path, options = BUILT_IN[name], settings.get(name) or {}
    elif "." in name:
        path, options = name, settings.get(name) or {}
    else:
        raise exceptions.UnknownChannel(name=name)
    try:
        cls = import_string(path)
    except ImportError as error:
        raise exceptions.UnknownChannel(f"({error})", name=name) from None
    if not (isinstance(cls, type) and issubclass(cls, Channel)):
        raise exceptions.UnknownChannel(f"({path} is not a cron_celery.notifiers.base.Channel)", name=name)
    return cls(name, dict(options) if isinstance(options, dict) else {})


def deliverable(job: registry.Job | None, event: str) -> tuple[str, ...]:
    names = channel_names(job, event)
    if "sentry" in names and not notifiers_sentry.active():
        names = tuple(name for name in names if name != "sentry")
    return names


def problems() -> list[str]:
    """Configuration problems, one sentence each (for the system checks)."""
    settings = conf.settings.NOTIFICATIONS
    found: list[str] = []
    names: set[str] = set()
    for kind in ("on_failure", "on_recovery", "on_success"):
        value = settings.get(kind) or []
        if isinstance(value, str) or not isinstance(value, list | tuple):
            found.append(f"NOTIFICATIONS[{kind!r}] must be a list of channel names, not {value!r}.")
            continue
        names.update(str(name) for name in value)
    for job in registry.all_jobs():
        for _kind, listed in job.notify or ():
            names.update(listed)
    for name in sorted(names):
        try:
            target = channel(name)
        except exceptions.UnknownChannel as error:
            found.append(str(error))
            continue
        found += [f"Channel {name!r}: {problem}." for problem in target.problems()]
    return found
