"""The Celery app of the test project (what ``proj/celery.py`` is in a real one)."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

if os.environ.get("CRON_TEST_SENTRY_DSN"):  # fault tests: Sentry's own Celery integration, beat monitors on
    import sentry_sdk
    from sentry_sdk.integrations.celery import CeleryIntegration

    sentry_sdk.init(dsn=os.environ["CRON_TEST_SENTRY_DSN"], default_integrations=False,
                    auto_enabling_integrations=False, integrations=[CeleryIntegration(monitor_beat_tasks=True)],
                    _experiments={"transport_compression_level": 0})

app = Celery("cron_celery_tests")
app.config_from_object("django.conf:settings", namespace="CELERY")
if os.environ.get("CRON_TEST_BEAT_SCHEDULE"):  # fault tests: beat_schedule entries, {name: [task, seconds, args]}
    import json

    entries = json.loads(os.environ["CRON_TEST_BEAT_SCHEDULE"])
    app.conf.beat_schedule = {name: {"task": task, "schedule": float(seconds), "args": args}
                              for name, (task, seconds, args) in entries.items()}
app.autodiscover_tasks()
