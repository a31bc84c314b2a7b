"""The Celery app of the benchmark: ``celery -A bench.celery_app worker``."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")

app = Celery("cron_celery_bench")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
