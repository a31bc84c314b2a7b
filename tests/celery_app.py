"""The Celery app of the test project (what ``proj/celery.py`` is in a real one)."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

app = Celery("cron_celery_tests")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
