"""Settings for the test suite: real PostgreSQL and Redis, from DATABASE_URL / REDIS_URL."""

from __future__ import annotations

import json
import os
import uuid
from urllib.parse import unquote, urlparse

DATABASE_URL = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/cron_celery")
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")

_db = urlparse(DATABASE_URL)
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        # Worker subprocesses of a test are pointed at the test database by name.
        "NAME": os.environ.get("CRON_CELERY_TEST_DB") or _db.path.lstrip("/") or "cron_celery",
        "USER": unquote(_db.username or "postgres"),
        "PASSWORD": unquote(_db.password or ""),
        "HOST": _db.hostname or "127.0.0.1",
        "PORT": str(_db.port or 5432),
        "CONN_MAX_AGE": 60,
    }
}

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_celery_beat",
    "cron_celery",
    "tests.jobsapp",
    "tests.otherapp",  # an app of someone else's: plain tasks, tracked as periodic tasks
]
if os.environ.get("CRON_TEST_MIGRATION_EXAMPLE"):  # tests/test_migration_rules.py's child processes only
    INSTALLED_APPS.append("tests.migration_example")
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.urls"
STATIC_URL = "/static/"  # the browser tests' live server serves the admin's CSS
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

# One queue per test session (inherited by worker subprocesses through the environment),
# so the suite never consumes or leaves messages in anybody else's queues.
# A fault test may point its workers at another broker (RabbitMQ) while locks stay on Redis.
CELERY_BROKER_URL = os.environ.get("CRON_TEST_BROKER_URL") or REDIS_URL
CELERY_RESULT_BACKEND = None
CELERY_TASK_DEFAULT_QUEUE = os.environ.setdefault(
    "CRON_CELERY_TEST_QUEUE", f"cron-celery-test-{uuid.uuid4().hex[:8]}"
)
CELERY_DB_REUSE_MAX = 1000
# One job is routed by the settings alone (tests/jobsapp/jobs_routing.py, tests/faults/test_routing.py).
CELERY_TASK_ROUTES = {"tests.jobsapp.jobs_routing.routed_by_settings": {
    "queue": f"{CELERY_TASK_DEFAULT_QUEUE}-q-routed", "priority": 3}}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
if os.environ.get("CRON_TEST_ACKS_LATE"):  # fault tests: every task acknowledged late, or early
    CELERY_TASK_ACKS_LATE = os.environ["CRON_TEST_ACKS_LATE"] == "1"
if os.environ.get("CRON_TEST_VISIBILITY_TIMEOUT"):  # fault tests: redeliver unacked messages soon
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": float(os.environ["CRON_TEST_VISIBILITY_TIMEOUT"]),
                                       "unacked_restore_interval": 1, "unacked_restore_throttle": 1}
    # Deliberately shorter than the test jobs' time limits and retry waits, which the checks
    # would otherwise refuse (and workers refuse to start on a check error).
    SILENCED_SYSTEM_CHECKS = ["cron_celery.E009", "cron_celery.E010"]

# Worker subprocesses of fault tests get their lock masters and timings from the environment.
CRON_CELERY = {
    "LEASE_SECONDS": int(os.environ.get("CRON_TEST_LEASE_SECONDS", "60")),
    "BEAT_LEASE_SECONDS": int(os.environ.get("CRON_TEST_BEAT_LEASE_SECONDS", "30")),
    "LOCK": {
        "MASTERS": [url for url in os.environ.get("CRON_TEST_LOCK_MASTERS", "").split(",") if url] or None,
        "TTL": float(os.environ.get("CRON_TEST_LOCK_TTL", "60")),
    },
    # Off in the test process (tests call run_pass themselves); fault tests turn it on in
    # their worker processes.
    "RECONCILE": {
        "INTERVAL": float(os.environ.get("CRON_TEST_RECONCILE_INTERVAL", "0")),
        "PENDING_GRACE": float(os.environ.get("CRON_TEST_PENDING_GRACE", "300")),
        "MISSED_GRACE": float(os.environ.get("CRON_TEST_MISSED_GRACE", "120")),
    },
    # The warehouse jobs (tests/jobsapp/jobs_buffer.py) share two places.
    "CONCURRENCY_GROUPS": {"warehouse": 2},
}
if os.environ.get("CRON_TEST_TRACK"):  # tracked periodic tasks: true, or a JSON list of names
    CRON_CELERY["TRACK_PERIODIC_TASKS"] = json.loads(os.environ["CRON_TEST_TRACK"])
if os.environ.get("CRON_TEST_SENTRY_DSN"):  # fault tests: check-ins go to the test's own Sentry endpoint
    CRON_CELERY["NOTIFICATIONS"] = {"on_failure": ["sentry"]}
if os.environ.get("CRON_TEST_WEBHOOK_URL"):  # fault tests: alerts go to the test's own HTTP server
    CRON_CELERY["NOTIFICATIONS"] = {"on_failure": ["webhook"], "on_recovery": ["webhook"],
                                    "webhook": {"url": os.environ["CRON_TEST_WEBHOOK_URL"], "secret": "fault"}}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"cron_celery": {"handlers": ["console"], "level": os.environ.get("CRON_TEST_LOG_LEVEL", "WARNING")}},
}
