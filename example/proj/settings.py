"""Settings of the example project, read from the environment.

DATABASE_URL   PostgreSQL (default postgres://postgres@127.0.0.1:5432/cron_celery_demo)
REDIS_URL      the Celery broker (default redis://127.0.0.1:6379/0)
CELERY_TASK_DEFAULT_QUEUE   the queue the jobs are sent to and the worker reads (default cron-celery-demo)
SENTRY_DSN     report errors to Sentry (off when unset)
ALERT_EMAIL_TO, SLACK_WEBHOOK_URL, ALERT_WEBHOOK_URL   alert channels (each off when unset)
EMAIL_BACKEND, EMAIL_FILE_PATH, EMAIL_HOST, EMAIL_PORT, DEFAULT_FROM_EMAIL   how email leaves
DJANGO_SECRET_KEY, DJANGO_DEBUG, DJANGO_ALLOWED_HOSTS, TIME_ZONE, CRON_CELERY_LOG_LEVEL
"""

from __future__ import annotations

import os
from urllib.parse import unquote, urlparse

DATABASE_URL = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/cron_celery_demo")
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")

_db = urlparse(DATABASE_URL)
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(_db.path.lstrip("/")) or "cron_celery_demo",
        "USER": unquote(_db.username or "postgres"),
        "PASSWORD": unquote(_db.password or ""),
        "HOST": _db.hostname or "127.0.0.1",
        "PORT": str(_db.port or 5432),
        # Keep connections open between requests and tasks (see CELERY_DB_REUSE_MAX).
        "CONN_MAX_AGE": 60,
    }
}

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "") == "1"
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1").split(",")
USE_TZ = True
TIME_ZONE = os.environ.get("TIME_ZONE", "UTC")
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
    "reports",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
ROOT_URLCONF = "proj.urls"
STATIC_URL = "static/"
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

# Celery. No result backend: every run is recorded in CronExecution instead.
CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = None
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("CELERY_TASK_DEFAULT_QUEUE", "cron-celery-demo")
CELERY_TIMEZONE = TIME_ZONE
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Jobs acknowledge late; take one message at a time so a busy process does not hoard them.
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Reuse a worker's database connection for 1000 tasks instead of reconnecting every task.
CELERY_DB_REUSE_MAX = 1000
# Redis delivers an unacknowledged message again after this long: keep it above every
# job's time_limit (nightly-batch: 1 hour) and above twice its longest retry wait.
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 7200}

STATIC_ROOT = os.environ.get("STATIC_ROOT") or None

CRON_CELERY: dict[str, object] = {
    "LEASE_SECONDS": 60,
    # Three independent Redis masters for the Redlock job locks (compose.yaml runs them);
    # unset: the broker's Redis.
    "LOCK": {"MASTERS": [url for url in os.environ.get("CRON_LOCK_MASTERS", "").split(",") if url] or None,
             "TTL": 60},
    # One token per consumer, each with only the scopes it needs (32+ characters each):
    # monitoring reads status and health; Prometheus scrapes metrics (and sees no job's messages or
    # parameters); a deploy pipeline may POST run/.
    "API_TOKENS": {name: {"token": os.environ[variable], "scopes": scopes} for name, variable, scopes in (
        ("monitor", "CRON_TOKEN_MONITOR", ["read"]), ("prometheus", "CRON_TOKEN_PROMETHEUS", ["metrics"]),
        ("deploy", "CRON_TOKEN_DEPLOY", ["run"]),
    ) if os.environ.get(variable)},
    "ADMIN_BASE_URL": os.environ.get("CRON_ADMIN_BASE_URL", ""),
    "RETENTION_DAYS": int(os.environ.get("CRON_RETENTION_DAYS", "0")) or None,
}
# Email leaves by SMTP (EMAIL_HOST:EMAIL_PORT); the demo sets the file backend instead, so
# the alerts that would be mailed land in EMAIL_FILE_PATH.
EMAIL_BACKEND = os.environ.get("EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend")
EMAIL_FILE_PATH = os.environ.get("EMAIL_FILE_PATH", "")
EMAIL_HOST = os.environ.get("EMAIL_HOST", "localhost")
EMAIL_PORT = int(os.environ.get("EMAIL_PORT", "25"))
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "cron@example.com")

_channels: list[str] = []
_notifications: dict[str, object] = {}
if os.environ.get("ALERT_EMAIL_TO"):
    _channels.append("email")
    _notifications["email"] = {"recipients": os.environ["ALERT_EMAIL_TO"].split(",")}
if os.environ.get("SLACK_WEBHOOK_URL"):
    _channels.append("slack")
    _notifications["slack"] = {"webhook_url": os.environ["SLACK_WEBHOOK_URL"]}
if os.environ.get("ALERT_WEBHOOK_URL"):
    _channels.append("webhook")
    _notifications["webhook"] = {"url": os.environ["ALERT_WEBHOOK_URL"],
                                 "secret": os.environ.get("ALERT_WEBHOOK_SECRET", "")}
if os.environ.get("SENTRY_DSN"):
    _channels.append("sentry")
if _channels:
    CRON_CELERY["NOTIFICATIONS"] = {"on_failure": _channels, "on_recovery": _channels, **_notifications}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "[%(asctime)s: %(levelname)s/%(processName)s] %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "cron_celery": {
            "handlers": ["console"],
            "level": os.environ.get("CRON_CELERY_LOG_LEVEL", "WARNING"),
            "propagate": False,
        },
    },
}

SENTRY_DSN = os.environ.get("SENTRY_DSN", "")
if SENTRY_DSN:
    import sentry_sdk

    # The Django and Celery integrations are enabled automatically.
    sentry_sdk.init(dsn=SENTRY_DSN, environment=os.environ.get("SENTRY_ENVIRONMENT", "example"))
