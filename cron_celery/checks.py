"""Django system checks with stable ids (``cron_celery.E001`` ...), run at start-up."""

from __future__ import annotations

from typing import Any

from django.core import checks

from cron_celery import conf

TAG = "cron_celery"


def register() -> None:
    checks.register(check_settings, TAG)
    checks.register(check_connection_reuse, TAG)


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
    for key in ("LEASE_SECONDS", "MESSAGE_MAX_CHARS", "TRACEBACK_MAX_CHARS", "RESULT_MAX_CHARS"):
        value = getattr(values, key)
        minimum = 3 if key == "LEASE_SECONDS" else 100
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
