"""What the beat scale benchmark works in besides its scheduler: the Redis queue its messages go to
(one of its own, nobody consuming it) and the bench database's periodic-task and cron_celery tables."""

from __future__ import annotations

import os
from typing import Any

import redis

from bench import kombu_keys
from bench.common import BenchError

QUEUE = f"beat-scale-{os.getpid()}"
PRIORITY_SEP = "\x06\x16"  # kombu's Redis transport names priority lists "queue\x06\x16<n>"


def purge_queue(client: redis.Redis) -> None:
    client.delete(QUEUE, *(f"{QUEUE}{PRIORITY_SEP}{p}" for p in (3, 6, 9)))


def drop_queue(client: redis.Redis) -> int:
    """Delete the queue's lists and bindings; members naming it in shared sets are removed."""
    purge_queue(client)
    return kombu_keys.sweep(client, QUEUE)


# ----------------------------------------------------------------------------- database


def reset_tables() -> None:
    """Empty the periodic-task and cron_celery tables of the bench database (and only it)."""
    from django.conf import settings
    from django.db import connection

    from bench import settings as bench_settings

    if connection.settings_dict["NAME"] != bench_settings.BENCH_DB or settings.DATABASES["default"]["NAME"] != \
            bench_settings.BENCH_DB:
        raise BenchError(f"refusing to empty tables outside {bench_settings.BENCH_DB}")
    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE cron_celery_cronexecution, cron_celery_cronjob, django_celery_beat_periodictask,"
            " django_celery_beat_crontabschedule, django_celery_beat_periodictasks RESTART IDENTITY CASCADE"
        )


def pg_version() -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        row = cursor.fetchone()
    return str(row[0]) if row else "?"


def crontab(minute: str = "*", hour: str = "*") -> Any:
    from django_celery_beat.models import CrontabSchedule

    return CrontabSchedule.objects.create(minute=minute, hour=hour, day_of_month="*", month_of_year="*",
                                          day_of_week="*", timezone="UTC")
