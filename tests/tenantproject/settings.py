"""Settings of the django-tenants project: its own database (CRON_TEST_TENANT_DB), the session's
Redis, and every periodic task tracked."""

from __future__ import annotations

import os

from tests.settings import DATABASES as _TEST_DATABASES
from tests.settings import REDIS_URL

DATABASES = {"default": {**_TEST_DATABASES["default"], "ENGINE": "django_tenants.postgresql_backend",
                         "NAME": os.environ.get("CRON_TEST_TENANT_DB", "cron_celery_tenants")}}
DATABASE_ROUTERS = ("django_tenants.routers.TenantSyncRouter",)
SHARED_APPS = [
    "django_tenants",
    "tests.tenantproject.customers",
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_celery_beat",
    "cron_celery",
]
TENANT_APPS = ["django.contrib.contenttypes", "tests.tenantproject.notes"]
INSTALLED_APPS = SHARED_APPS + [app for app in TENANT_APPS if app not in SHARED_APPS]
TENANT_MODEL = "customers.Client"
TENANT_DOMAIN_MODEL = "customers.Domain"

SECRET_KEY = "tests-only-not-secret"
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
MIDDLEWARE: list[str] = []

CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = None
CELERY_DB_REUSE_MAX = 1000
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("CRON_CELERY_TEST_QUEUE", "cron-celery-tenants")
CELERY_BEAT_SCHEDULER = "cron_celery.beat.Scheduler"

CRON_CELERY = {
    "TRACK_PERIODIC_TASKS": True,
    "LEASE_SECONDS": 10,
    "LOCK": {"TTL": 10},
    "BEAT_LEASE_SECONDS": 3,
}
LOGGING = {"version": 1, "disable_existing_loggers": False,
           "handlers": {"console": {"class": "logging.StreamHandler"}},
           "loggers": {"cron_celery": {"handlers": ["console"], "level": "INFO"}}}
