"""The soak's Celery app (``celery -A tests.soak.celery_app worker|beat``)."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.soak.settings")

app = Celery("cron_celery_soak")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
