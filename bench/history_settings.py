"""Settings of ``bench/history.py``: the benchmark settings plus the admin and the endpoints."""

from __future__ import annotations

import os

from bench.settings import *  # noqa: F403
from bench.settings import CRON_CELERY, DATABASES, INSTALLED_APPS

DATABASES["default"]["NAME"] = os.environ.get("BENCH_HISTORY_DB", "cron_celery_history")
INSTALLED_APPS = [
    "django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes", "django.contrib.sessions",
    "django.contrib.messages", *INSTALLED_APPS,
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "bench.urls"
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request", "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
CRON_CELERY = {**CRON_CELERY, "API_TOKENS": {  # type: ignore[dict-item]
    "bench": {"token": "bench-read-token-not-a-secret-0123456789", "scopes": ["read"]}}}
