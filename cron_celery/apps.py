from __future__ import annotations

import logging
import traceback
from pathlib import Path

from django.apps import AppConfig

#: Third-party loggers that say nothing an operator needs at INFO (pottery announces each Lua
#: script it registers): set to WARNING unless the project's LOGGING gave them a level.
QUIET_LOGGERS = ("pottery",)


def quiet_loggers() -> None:
    for name in QUIET_LOGGERS:
        found = logging.getLogger(name)
        if found.level == logging.NOTSET:
            found.setLevel(logging.WARNING)


def refused_declaration(error: BaseException) -> str:
    """What a process that cannot start says when a job is declared wrongly: the error in one line, and
    where in the project's code the declaration is (the last frame outside cron_celery and Python's import
    machinery), instead of a traceback through ``django.setup()``."""
    package = str(Path(__file__).resolve().parent)
    frames = [frame for frame in traceback.extract_tb(error.__traceback__)
              if not frame.filename.startswith(package) and "importlib" not in frame.filename
              and "/django/" not in frame.filename]
    where = f"\n  in {frames[-1].filename}, line {frames[-1].lineno}: {frames[-1].line}" if frames else ""
    return f"cron_celery: a job is declared wrongly, so this process does not start:\n  {error}{where}"


class CronCeleryConfig(AppConfig):
    name = "cron_celery"
    verbose_name = "Cron jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from cron_celery import alerts, checks, reconciler
        from cron_celery.alerts import delivery, schedule_alerts, sentry, signals
        from cron_celery.decisions import tracked
        from cron_celery.declaring import registry
        from cron_celery.run import backfill, events, shutdown
        from cron_celery.tracking import rows, worker

        # Their Celery tasks (an alert's delivery, a schedule problem's, a backfill's rest) register as
        # they are imported: every worker must know them, whatever else its settings install.
        assert delivery.deliver_alert.name and schedule_alerts.deliver_schedule_problem.name
        assert backfill.publish_backfill.name
        # The listeners of a run's start and end, in the order they hear of it.
        for listener in (alerts.OUTBOX, signals.SIGNALS, sentry.CRONS):
            events.subscribe(listener)
        quiet_loggers()
        checks.register()
        checks.connect()
        shutdown.connect()
        reconciler.connect()
        # Tracked periodic tasks: their jobs found from their rows, their tasks wrapped on every worker.
        registry.set_loader(tracked.load_job)
        worker.connect()
        rows.connect()
        # Declare every job now, so a duplicate name or code stops start-up at once, in a few lines.
        from cron_celery import exceptions

        try:
            registry.autodiscover()
        except (exceptions.ImproperlyDeclared, exceptions.DuplicateJob) as error:
            raise SystemExit(refused_declaration(error)) from None
        from cron_celery import conf
        from cron_celery.reconciler import retention

        if conf.settings.RETENTION_DAYS:
            retention.declare_job()
