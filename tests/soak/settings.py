"""Django settings of the soak's processes: every address comes from the environment that the
soak (``tests.soak.run``) gives each process, so a worker may reach PostgreSQL, the broker and
the lock masters through proxies of its own."""

from __future__ import annotations

import os
from urllib.parse import unquote, urlparse

from tests.soak import spec

# The soak's own process (the person, the admin edits, the checks) must not wait on the lock its
# nemesis holds (``pg-lock-restart``): the nemesis ends that lock from the same loop.
_harness_options = {"options": "-c lock_timeout=2000"} if os.environ.get("CRON_SOAK_HARNESS") else {}
_db = urlparse(os.environ.get("CRON_SOAK_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/cc_soak"))
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db.path.lstrip("/") or "cc_soak",
        "USER": unquote(_db.username or "postgres"),
        "PASSWORD": unquote(_db.password or ""),
        "HOST": _db.hostname or "127.0.0.1",
        "PORT": str(_db.port or 5432),
        "CONN_MAX_AGE": 60,
        "OPTIONS": {"connect_timeout": 3, **_harness_options},
    }
}

SECRET_KEY = "soak-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_celery_beat",
    "cron_celery",
    "tests.soak",
]

CELERY_BROKER_URL = os.environ.get("CRON_SOAK_BROKER_URL", "redis://127.0.0.1:6379/15")
CELERY_RESULT_BACKEND = None
CELERY_TASK_DEFAULT_QUEUE = "cron-soak"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_DB_REUSE_MAX = 1000
#: A worker that dies holding messages gives them back after this many seconds.
VISIBILITY_TIMEOUT = 12.0
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": VISIBILITY_TIMEOUT, "unacked_restore_interval": 1,
                                   "socket_connect_timeout": 3}

LEASE_SECONDS = 4
CRON_CELERY = {
    "LEASE_SECONDS": LEASE_SECONDS,
    "BEAT_LEASE_SECONDS": 6,
    "LOCK": {"MASTERS": [url for url in os.environ.get("CRON_SOAK_LOCK_MASTERS", "").split(",") if url] or None,
             "TTL": LEASE_SECONDS, "PREFIX": "cron_celery:soak"},
    "CONCURRENCY_GROUPS": dict(spec.GROUP_LIMITS),
    "TRACK_PERIODIC_TASKS": [spec.TRACKED_TASK],
    "RECONCILE": {"INTERVAL": 1, "PENDING_GRACE": 3, "MISSED_GRACE": 6, "REPUBLISH_LIMIT": 3},
    "NOTIFICATIONS": {"on_failure": ["soak"], "on_recovery": ["soak"], "timeout": 2, "max_attempts": 100,
                      "channels": {"soak": {"class": "tests.soak.channel.FileChannel"}}},
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"cron_celery": {"handlers": ["console"], "level": "INFO"}},
}
