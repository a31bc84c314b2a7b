"""Settings of ``bench/beat_scale.py``: the benchmark settings (its database, ``BENCH_DB``) with the
admin of ``bench/history_settings.py``, so that the dashboard's pages can be requested at each size."""

from __future__ import annotations

from bench import history_settings as with_admin
from bench.settings import *  # noqa: F403
from bench.settings import BENCH_DB, DATABASES

INSTALLED_APPS = with_admin.INSTALLED_APPS
MIDDLEWARE = with_admin.MIDDLEWARE
ROOT_URLCONF = with_admin.ROOT_URLCONF
TEMPLATES = with_admin.TEMPLATES
# history_settings names its own database in the entry it shares with bench.settings: ours again.
DATABASES["default"]["NAME"] = BENCH_DB
