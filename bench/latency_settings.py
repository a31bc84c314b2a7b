"""Settings of ``bench/latency.py`` and of its beats and workers: the benchmark settings with a
database of its own, the run's lock masters and the module that declares its jobs.

The database is ``cron_celery_latency`` (``BENCH_LATENCY_DB``), not ``cron_celery_bench``: the
script empties its tables before each scheduler, which must not meet another benchmark (such as
``beat_scale.py``) working in the shared one at the same time.

``bench/latency.py`` sets, in the environment of every process it starts:

  ``LATENCY_MASTERS``  the Redis URLs of its three lock masters, comma-separated (cron_celery's
                       Redlock: the beat leader's lease and each run's job lock);
  ``LATENCY_PREFIX``   the start of every key cron_celery writes there (``LOCK["PREFIX"]``);
  ``LATENCY_*``        the jobs to declare (read by ``bench/latency_jobs.py``).
"""

from __future__ import annotations

import os

from bench.settings import *  # noqa: F403
from bench.settings import CRON_CELERY, DATABASES, LOGGING

LATENCY_DB = os.environ.get("BENCH_LATENCY_DB", "cron_celery_latency")
DATABASES["default"]["NAME"] = LATENCY_DB

_masters = [url for url in os.environ.get("LATENCY_MASTERS", "").split(",") if url]
CRON_CELERY = {**CRON_CELERY, "LOCK": {"MASTERS": _masters or None,  # type: ignore[dict-item]
                                       "PREFIX": os.environ.get("LATENCY_PREFIX") or None}}
# Imported by every worker and beat at start-up (Celery's ``imports``): declares the jobs.
CELERY_IMPORTS = ("bench.latency_jobs",)
# The beat's one line per dispatch round ("dispatched N slot(s) of M job(s) in T ms"): the
# script reads the rounds' sizes and times back from the leader's log.
LOGGING = {**LOGGING, "formatters": {"stamped": {"format": "%(created).3f %(name)s %(message)s"}},
           "handlers": {**LOGGING["handlers"],  # type: ignore[dict-item]
                        "stamped": {"class": "logging.StreamHandler", "formatter": "stamped"}},
           "loggers": {**LOGGING["loggers"],  # type: ignore[dict-item]
                       "cron_celery.beat": {"handlers": ["stamped"], "level": "INFO", "propagate": False}}}
