"""The Celery app: ``celery -A proj worker`` (run from the example/ directory)."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")

app = Celery("proj")
# Every CELERY_* Django setting configures Celery (CELERY_BROKER_URL -> broker_url, ...).
app.config_from_object("django.conf:settings", namespace="CELERY")
# Imports each installed app's tasks.py, where the jobs are declared.
app.autodiscover_tasks()
