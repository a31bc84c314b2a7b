"""The only place cron_celery reads Django settings.

Everything in the package asks ``conf.settings.X``; the values come from the
``CRON_CELERY`` dictionary in the project's settings, with the defaults below. The
dictionary is re-read whenever Django's ``setting_changed`` signal fires (tests use
``override_settings``), otherwise it is parsed once per process.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.dispatch import receiver

LOCK_DEFAULTS: dict[str, Any] = {"MASTERS": None, "TTL": 60, "PREFIX": None}
NOTIFICATION_DEFAULTS: dict[str, Any] = {
    "on_failure": [], "on_recovery": [], "on_success": [], "timeout": 10, "max_attempts": 5,
}
HEALTH_DEFAULTS: dict[str, Any] = {"BEAT_STALE_SECONDS": 90, "OVERDUE_SECONDS": 120}
RECONCILE_DEFAULTS: dict[str, Any] = {
    "INTERVAL": 30, "PENDING_GRACE": 300, "REPUBLISH_LIMIT": 3, "MISSED_GRACE": 120, "BATCH": 500,
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """Typed view of ``settings.CRON_CELERY``. Each field is documented in docs/configuration.md."""

    #: Seconds a claimed execution's database lease lasts; renewed every third of it.
    LEASE_SECONDS: int = 60
    #: Default execution pattern for jobs that do not declare one.
    DEFAULT_PATTERN: str = "standard"
    #: Default overlap policy for jobs that do not declare one.
    DEFAULT_OVERLAP: str = "skip"
    #: Default timezone of a job's slots; ``None`` means Django's ``TIME_ZONE``.
    DEFAULT_TIMEZONE: str | None = None
    #: Longest ``message`` stored on an execution (characters); longer text is truncated.
    MESSAGE_MAX_CHARS: int = 10_000
    #: Longest ``traceback`` stored on an execution (characters).
    TRACEBACK_MAX_CHARS: int = 50_000
    #: Largest JSON-encoded return value stored in ``result`` (characters).
    RESULT_MAX_CHARS: int = 100_000
    #: Import every installed app's ``tasks`` module at start-up to find jobs.
    AUTODISCOVER: bool = True
    #: Seconds the beat leader's lease lasts; renewed three times per lease.
    BEAT_LEASE_SECONDS: int = 30
    #: Most due jobs planned, recorded and published in one batch (a tick goes on to the next
    #: batch while jobs are due, for up to a third of the leader lease).
    BEAT_BATCH: int = 1000
    #: Most overdue slots of one job run per cycle under catch-up ``all``.
    CATCH_UP_LIMIT: int = 1000
    #: Redlock settings: ``MASTERS`` (Redis URLs; ``None`` = the Celery broker when it is
    #: Redis), ``TTL`` (seconds, renewed every third of it while a run lasts) and ``PREFIX``
    #: (the start of every Redis key; ``None`` = ``cron_celery:<database name>``).
    LOCK: dict[str, Any] = dataclasses.field(default_factory=lambda: dict(LOCK_DEFAULTS))
    #: Retries of a job that declares none (``max_retries``); 0 = a failure is final.
    DEFAULT_MAX_RETRIES: int = 0
    #: Soft and hard time limits (seconds) of a job that declares none; ``None`` = no limit.
    DEFAULT_SOFT_TIME_LIMIT: float | None = None
    DEFAULT_TIME_LIMIT: float | None = None
    #: Jitter (seconds) of a job that declares none: its slots are sent a fixed offset below
    #: this after the slot, cut to a tenth of its declared schedule's shortest interval; 0 = none.
    DEFAULT_JITTER: float = 0
    #: Seconds after it was due by which a run of a job that declares no ``start_deadline`` must
    #: have started, else one LATE alert; ``None`` = no deadline.
    DEFAULT_START_DEADLINE: float | None = None
    #: The reconciler: ``INTERVAL`` (seconds between passes on each worker; 0 turns the
    #: built-in timer off), ``PENDING_GRACE`` (seconds a dispatched execution may wait for a
    #: worker before its message is sent again), ``REPUBLISH_LIMIT`` (how many times),
    #: ``MISSED_GRACE`` (seconds a due slot may go undispatched before it is recorded
    #: MISSED) and ``BATCH`` (most rows one step of a pass handles).
    RECONCILE: dict[str, Any] = dataclasses.field(default_factory=lambda: dict(RECONCILE_DEFAULTS))
    #: Alerts: which channels hear of which events (``on_failure``, ``on_recovery``,
    #: ``on_success``), each channel's options under its name, ``timeout`` (seconds per
    #: delivery) and ``max_attempts``. See docs/notifications.md.
    NOTIFICATIONS: dict[str, Any] = dataclasses.field(default_factory=lambda: dict(NOTIFICATION_DEFAULTS))
    #: Where the admin is served (``https://ops.example.com``): alerts link to the execution.
    ADMIN_BASE_URL: str = ""
    #: Deprecated: one Bearer token with the scopes read, run and force; use ``API_TOKENS``.
    API_TOKEN: str = dataclasses.field(default="", repr=False)
    #: Named Bearer tokens for the endpoints, each with its scopes:
    #: ``{"prometheus": {"token": "...", "scopes": ["read"]}}`` (see ``tokens``); empty =
    #: staff sessions only.
    API_TOKENS: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)
    #: Health: a leading beat unseen for ``BEAT_STALE_SECONDS``, or a job whose next slot is
    #: ``OVERDUE_SECONDS`` late, makes the health endpoint answer 503.
    HEALTH: dict[str, Any] = dataclasses.field(default_factory=lambda: dict(HEALTH_DEFAULTS))
    #: Days of history to keep (the built-in daily retention job); ``None`` = keep all.
    RETENTION_DAYS: int | None = None
    #: Which statuses the retention job deletes (never PENDING, RUNNING or RETRYING).
    RETENTION_STATUSES: tuple[str, ...] = ("SUCCEEDED", "SKIPPED")
    #: Days an alert row is kept once it is settled (sent, or given up); ``None`` = keep all.
    #: The reconciler deletes older ones once an hour, whatever ``RETENTION_DAYS`` says.
    ALERT_RETENTION_DAYS: int | None = 90
    #: Days a schedule change (the audit log, ``audit``) is kept; ``None`` = keep all. The
    #: reconciler deletes older ones once an hour, in batches, whatever ``RETENTION_DAYS`` says.
    AUDIT_RETENTION_DAYS: int | None = 730
    #: Prepare the statements every run sends (its claim and final write) once per database session;
    #: False sends them as plain text every time (see ``statements``).
    PREPARED_STATEMENTS: bool = True
    #: Limits shared by several jobs: ``{"warehouse": 2}`` lets at most two runs of all the jobs
    #: declared with ``concurrency_group="warehouse"`` be live at once (see ``groups``).
    CONCURRENCY_GROUPS: dict[str, int] = dataclasses.field(default_factory=dict)
    #: django-celery-beat's periodic tasks that are no cron job's, tracked as jobs (see ``tracking``):
    #: ``False`` (none: sent untracked, as ``DatabaseScheduler`` sends them), ``True`` (every one),
    #: a list of task names and periodic task names, or a callable (or its dotted path) taking a
    #: ``PeriodicTask`` and answering whether to track it.
    TRACK_PERIODIC_TASKS: Any = False
    #: The catch-up policy of tracked periodic tasks after the beat was down (``none``, ``latest``
    #: or ``all``): ``none`` records the slots it missed MISSED, as ``DatabaseScheduler`` skips them.
    TRACKED_CATCH_UP: str = "none"


FIELDS = {field.name: field for field in dataclasses.fields(Settings)}
_cached: Settings | None = None


def raw() -> dict[str, Any]:
    """The ``CRON_CELERY`` dictionary as the project wrote it (empty when absent)."""
    value = getattr(django_settings, "CRON_CELERY", None)
    return dict(value) if isinstance(value, dict) else {}


def unknown_keys() -> list[str]:
    return sorted(key for key in raw() if key not in FIELDS)


def load() -> Settings:
    """Parse ``CRON_CELERY``; unknown keys are ignored here and reported by ``checks``."""
    values = {key: value for key, value in raw().items() if key in FIELDS}
    if isinstance(values.get("LOCK"), dict):
        values["LOCK"] = {**LOCK_DEFAULTS, **values["LOCK"]}
    if isinstance(values.get("NOTIFICATIONS"), dict):
        values["NOTIFICATIONS"] = {**NOTIFICATION_DEFAULTS, **values["NOTIFICATIONS"]}
    if isinstance(values.get("HEALTH"), dict):
        values["HEALTH"] = {**HEALTH_DEFAULTS, **values["HEALTH"]}
    if isinstance(values.get("RECONCILE"), dict):
        values["RECONCILE"] = {**RECONCILE_DEFAULTS, **values["RECONCILE"]}
    return Settings(**values)


def get() -> Settings:
    global _cached
    if _cached is None:
        _cached = load()
    return _cached


class _Proxy:
    """``conf.settings.LEASE_SECONDS`` reads the current value."""

    def __getattr__(self, name: str) -> Any:
        return getattr(get(), name)


settings: Settings = _Proxy()  # type: ignore[assignment]


@receiver(setting_changed)
def _reset(*, setting: str, **kwargs: Any) -> None:
    global _cached
    if setting in {"CRON_CELERY", "TIME_ZONE"}:
        _cached = None


def default_timezone() -> str:
    """The timezone of a job that names none: ``DEFAULT_TIMEZONE``, else Django's ``TIME_ZONE``, else UTC."""
    return str(settings.DEFAULT_TIMEZONE or getattr(django_settings, "TIME_ZONE", None) or "UTC")


def celery_db_reuse_max() -> int | None:
    """Celery's ``CELERY_DB_REUSE_MAX``: how many tasks a worker reuses a DB connection for."""
    value = getattr(django_settings, "CELERY_DB_REUSE_MAX", None)
    if value is None:
        from celery import current_app

        value = current_app.conf.get("CELERY_DB_REUSE_MAX") or current_app.conf.get(
            "db_reuse_max"
        )
    return int(value) if value else None


def celery_broker_url() -> str:
    from celery import current_app

    return str(current_app.conf.broker_url or getattr(django_settings, "CELERY_BROKER_URL", "") or "")


def lock_masters() -> list[str]:
    """Redis URLs of the Redlock masters: ``LOCK["MASTERS"]``, else the broker if it is Redis."""
    configured = get().LOCK.get("MASTERS")
    if configured:
        return [str(url) for url in configured]
    broker = celery_broker_url()
    return [broker] if broker.startswith(("redis://", "rediss://")) else []


def lock_prefix() -> str:
    """The start of every Redis key cron_celery writes: ``LOCK["PREFIX"]``, else
    ``cron_celery:<database name>``, so that projects (or staging and production) sharing a
    Redis do not hold each other's job locks or beat lease."""
    configured = get().LOCK.get("PREFIX")
    if configured:
        return str(configured)
    # A project without a database (DATABASES = {}, or only other aliases) names no default one.
    default = (getattr(django_settings, "DATABASES", None) or {}).get("default") or {}
    return f"cron_celery:{default.get('NAME', '')}"


def celery_visibility_timeout() -> float | None:
    """Seconds before a Redis or SQS broker redelivers an unacknowledged message (None for
    brokers without one, such as RabbitMQ)."""
    from celery import current_app

    url = celery_broker_url()
    if not url.startswith(("redis://", "rediss://", "sqs://", "sentinel://")):
        return None
    options = current_app.conf.broker_transport_options or {}
    return float(options.get("visibility_timeout", 3600))
