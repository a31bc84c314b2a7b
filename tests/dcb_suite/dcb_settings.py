"""Django settings for django-celery-beat's own test suite, run by tests/test_dcb_suite.py.

They are the settings of django-celery-beat's test project (``t/proj/settings.py`` in its sdist,
imported from the unpacked sdist, never copied here) with two changes:

- the database is this machine's PostgreSQL (``DATABASE_URL`` gives host, port and user;
  ``CRON_DCB_DATABASE`` the name of the test database), not the project's SQLite file;
- ``CRON_DCB_MODE`` other than ``shipped`` (``installed``, ``tracked``, ``none-chosen``) installs
  cron_celery after django_celery_beat (its migrations add its tables and its triggers on
  django_celery_beat's tables) and turns ``CRON_CELERY["TRACK_PERIODIC_TASKS"]`` on: ``True`` (every
  periodic task that is no cron job's), or in the mode ``none-chosen`` a list naming no periodic task of
  theirs. Which scheduler their tests use is the plugin's part (dcb_plugin.py).
"""

from __future__ import annotations

import importlib
import os
from typing import Any
from urllib.parse import unquote, urlparse

_theirs = importlib.import_module("t.proj.settings")
globals().update({name: value for name, value in vars(_theirs).items() if name.isupper()})

MODE = os.environ.get("CRON_DCB_MODE", "shipped")
_db = urlparse(os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"))

DATABASES: dict[str, dict[str, Any]] = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        # pytest-django creates (and at the end drops) the TEST name; NAME is only where it connects first.
        "NAME": "postgres",
        "USER": unquote(_db.username or "postgres"),
        "PASSWORD": unquote(_db.password or ""),
        "HOST": _db.hostname or "127.0.0.1",
        "PORT": str(_db.port or 5432),
        "TEST": {"NAME": os.environ["CRON_DCB_DATABASE"]},
    }
}

INSTALLED_APPS: list[str] = list(_theirs.INSTALLED_APPS)
if MODE != "shipped":
    INSTALLED_APPS.insert(INSTALLED_APPS.index("django_celery_beat") + 1, "cron_celery")
    CRON_CELERY: dict[str, Any] = {
        "TRACK_PERIODIC_TASKS": ["a-periodic-task-none-of-their-tests-makes"] if MODE == "none-chosen" else True,
    }
