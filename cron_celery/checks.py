"""Django system checks with stable ids (``cron_celery.E001`` ...), run at start-up."""

from __future__ import annotations

from typing import Any

from django.core import checks

from cron_celery import conf

TAG = "cron_celery"


def register() -> None:
    checks.register(check_settings, TAG)
    checks.register(check_connection_reuse, TAG)
    checks.register(check_lock, TAG)


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    for key in conf.unknown_keys():
        errors.append(checks.Error(
            f"CRON_CELERY has an unknown key {key!r}.",
            hint=f"Known keys: {', '.join(sorted(conf.FIELDS))}. See docs/configuration.md.",
            id="cron_celery.E001",
        ))
    try:
        values = conf.load()
    except TypeError as exc:
        return [*errors, checks.Error(f"CRON_CELERY cannot be read: {exc}", id="cron_celery.E002")]
    minimums = {"LEASE_SECONDS": 3, "BEAT_LEASE_SECONDS": 3, "BEAT_BATCH": 1, "CATCH_UP_LIMIT": 1,
                "MESSAGE_MAX_CHARS": 100, "TRACEBACK_MAX_CHARS": 100, "RESULT_MAX_CHARS": 100}
    for key, minimum in minimums.items():
        value = getattr(values, key)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            errors.append(checks.Error(
                f"CRON_CELERY[{key!r}] must be an integer of at least {minimum}, not {value!r}.",
                id="cron_celery.E002",
            ))
    from cron_celery import models

    for key, enum in (("DEFAULT_PATTERN", models.ExecutionPattern),
                      ("DEFAULT_OVERLAP", models.Overlap)):
        value = getattr(values, key)
        if str(value).lower() not in {m.value for m in enum} | {m.name.lower() for m in enum}:
            errors.append(checks.Error(
                f"CRON_CELERY[{key!r}] is {value!r}; use one of "
                f"{', '.join(m.value for m in enum)}.",
                id="cron_celery.E003",
            ))
    if values.DEFAULT_TIMEZONE is not None:
        import zoneinfo

        try:
            zoneinfo.ZoneInfo(values.DEFAULT_TIMEZONE)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            errors.append(checks.Error(
                f"CRON_CELERY['DEFAULT_TIMEZONE'] {values.DEFAULT_TIMEZONE!r} is not a timezone.",
                hint="Use an IANA name such as 'Europe/Amsterdam'.",
                id="cron_celery.E004",
            ))
    return errors


def check_connection_reuse(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    if conf.celery_db_reuse_max():
        return []
    return [checks.Warning(
        "CELERY_DB_REUSE_MAX is not set: Celery closes the database connection before and "
        "after every task, so each tracked run opens a new PostgreSQL connection.",
        hint="Set CELERY_DB_REUSE_MAX = 1000 (see docs/configuration.md).",
        id="cron_celery.W001",
    )]


def check_lock(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Redlock needs 1 or at least 3 independent masters, and a TTL within the lease."""
    try:
        values = conf.load()
    except TypeError:
        return []  # reported by check_settings
    lock = values.LOCK
    errors: list[checks.CheckMessage] = []
    if not isinstance(lock, dict):
        return [checks.Error("CRON_CELERY['LOCK'] must be a dict with MASTERS and TTL.", id="cron_celery.E005")]
    unknown = sorted(set(lock) - set(conf.LOCK_DEFAULTS))
    if unknown:
        errors.append(checks.Error(f"CRON_CELERY['LOCK'] has unknown keys {unknown}; use MASTERS and TTL.",
                                   id="cron_celery.E005"))
    masters = lock.get("MASTERS")
    if masters is not None:
        if isinstance(masters, str) or not all(
            isinstance(url, str) and url.startswith(("redis://", "rediss://", "unix://")) for url in masters
        ):
            errors.append(checks.Error(
                "CRON_CELERY['LOCK']['MASTERS'] must be a list of Redis URLs (redis://host:port/db).",
                id="cron_celery.E005"))
        elif len(masters) == 2:
            errors.append(checks.Error(
                "CRON_CELERY['LOCK']['MASTERS'] lists 2 Redis masters: a Redlock quorum of 2 out of 2 "
                "stops as soon as either is down, so 2 is less available than 1.",
                hint="Use 1 master, or 3 or more independent ones (an odd number).",
                id="cron_celery.E006"))
    ttl = lock.get("TTL")
    if not isinstance(ttl, int | float) or isinstance(ttl, bool) or ttl < 1:
        errors.append(checks.Error(f"CRON_CELERY['LOCK']['TTL'] must be a number of seconds >= 1, not {ttl!r}.",
                                   id="cron_celery.E007"))
    elif isinstance(values.LEASE_SECONDS, int) and ttl > values.LEASE_SECONDS:
        errors.append(checks.Error(
            f"CRON_CELERY['LOCK']['TTL'] ({ttl} s) is longer than LEASE_SECONDS ({values.LEASE_SECONDS} s): "
            "a crashed worker's lock would outlive its database lease.",
            hint="Keep the lock TTL at or below the lease; both are renewed every third of it.",
            id="cron_celery.E007"))
    return errors
