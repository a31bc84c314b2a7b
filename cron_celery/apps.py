from __future__ import annotations

import logging

from django.apps import AppConfig

#: Third-party loggers that say nothing an operator needs at INFO (pottery announces each Lua
#: script it registers): set to WARNING unless the project's LOGGING gave them a level.
QUIET_LOGGERS = ("pottery",)


def quiet_loggers() -> None:
    for name in QUIET_LOGGERS:
        found = logging.getLogger(name)
        if found.level == logging.NOTSET:
            found.setLevel(logging.WARNING)


class CronCeleryConfig(AppConfig):
    name = "cron_celery"
    verbose_name = "Cron jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from cron_celery import alerts, checks, reconciler
        from cron_celery.alerts import sentry, signals
        from cron_celery.declaring import registry
        from cron_celery.run import events, shutdown

        # The listeners of a run's start and end, in the order they hear of it.
        for listener in (alerts.OUTBOX, signals.SIGNALS, sentry.CRONS):
            events.subscribe(listener)
        quiet_loggers()
        checks.register()
        checks.connect()
        shutdown.connect()
        reconciler.connect()
        # Declare every job now, so a duplicate name or code stops start-up at once.
        registry.autodiscover()
        from cron_celery import conf
        from cron_celery.reconciler import retention

        if conf.settings.RETENTION_DAYS:
            retention.declare_job()
