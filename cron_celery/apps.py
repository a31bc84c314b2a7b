from __future__ import annotations

from django.apps import AppConfig


class CronCeleryConfig(AppConfig):
    name = "cron_celery"
    verbose_name = "Cron jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from cron_celery import (
            alerts,
            backfill,  # noqa: F401 - declares its task (cron_celery.publish_backfill)
            checks,
            events,
            reconciler,
            registry,
            sentry,
            shutdown,
            signals,
        )

        # The listeners of a run's start and end, in the order they hear of it.
        for listener in (alerts.OUTBOX, signals.SIGNALS, sentry.CRONS):
            events.subscribe(listener)
        checks.register()
        checks.connect()
        shutdown.connect()
        reconciler.connect()
        # Declare every job now, so a duplicate name or code stops start-up at once.
        registry.autodiscover()
        from cron_celery import conf, retention

        if conf.settings.RETENTION_DAYS:
            retention.declare_job()
