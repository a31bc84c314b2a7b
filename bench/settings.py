"""Django settings of the benchmarks (``bench/overhead.py``, ``bench/beat_scale.py``) and the worker.

All the variants use this one module, so they share the database connection settings;
only the result backend changes, chosen by ``BENCH_RESULT_BACKEND`` in the environment
of the worker (unset: none; ``django-db``: django-celery-results).
"""

from __future__ import annotations

import os
from urllib.parse import unquote, urlparse

DATABASE_URL = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/cron_celery")
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")

#: The benchmark's own database; ``overhead.py`` creates and migrates it. Only the host,
#: port and credentials of DATABASE_URL are used, never its database.
BENCH_DB = os.environ.get("BENCH_DB", "cron_celery_bench")

#: Persistent connections: Django keeps a connection for this many seconds ...
CONN_MAX_AGE = 600
#: ... and Celery's Django fixup closes it only every this many tasks (not around each).
#: ``BENCH_DB_REUSE_MAX=0`` unsets it (``overhead.py --also-without-reuse`` does, for
#: its extra variants only).
CELERY_DB_REUSE_MAX = int(os.environ.get("BENCH_DB_REUSE_MAX") or 1000) or None

_db = urlparse(DATABASE_URL)
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": BENCH_DB,
        "USER": unquote(_db.username or "postgres"),
        "PASSWORD": unquote(_db.password or ""),
        "HOST": _db.hostname or "127.0.0.1",
        "PORT": str(_db.port or 5432),
        "CONN_MAX_AGE": CONN_MAX_AGE,
    }
}
#: ``BENCH_SYNCHRONOUS_COMMIT=off`` (the worker's environment in ``overhead.py --also-commit-off``):
#: every connection of the process commits without waiting for its WAL to be flushed. Only
#: PostgreSQL's own values are taken; unset or empty: the server's setting.
SYNCHRONOUS_COMMIT = os.environ.get("BENCH_SYNCHRONOUS_COMMIT", "")
if SYNCHRONOUS_COMMIT:
    if SYNCHRONOUS_COMMIT not in ("on", "off", "local", "remote_write", "remote_apply"):
        raise ValueError(f"BENCH_SYNCHRONOUS_COMMIT={SYNCHRONOUS_COMMIT!r} is not a synchronous_commit value")
    DATABASES["default"]["OPTIONS"] = {"options": f"-c synchronous_commit={SYNCHRONOUS_COMMIT}"}

SECRET_KEY = "bench-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django_celery_results",
    # cron_celery's models link to its periodic tasks; ``beat_scale.py`` runs its scheduler.
    "django_celery_beat",
    "cron_celery",
    "bench",
]

CELERY_BROKER_URL = REDIS_URL
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_RESULT_BACKEND = os.environ.get("BENCH_RESULT_BACKEND") or None
# Nothing is meant to reach the default queue: every message names its own queue. A
# unique default keeps stray messages out of anybody else's "celery" queue all the same.
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("BENCH_DEFAULT_QUEUE", "cron-celery-bench-default")
CELERY_WORKER_PREFETCH_MULTIPLIER = 4
#: celery-once (variant (iv) of ``overhead.py``): its locks live in the broker's Redis.
CELERY_ONCE = {
    "backend": "celery_once.backends.Redis",
    "settings": {"url": REDIS_URL, "default_timeout": 60 * 60},
}

CRON_CELERY = {"LEASE_SECONDS": 60}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"cron_celery": {"handlers": ["console"], "level": "WARNING"}},
}
