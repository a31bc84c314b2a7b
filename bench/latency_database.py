"""The tables ``bench/latency.py`` works in: emptying them between phases (only in the script's
own database), the periodic tasks of the DatabaseScheduler side, the signs that the cron_celery
beats are ready and that a window is over, and the samples read from cron_celery's executions.

Every function imports Django lazily: it runs only once the script has set Django up.
"""

from __future__ import annotations

import math
from collections import Counter

from bench import latency_mix
from bench.common import BenchError
from bench.latency_figures import Sample, utc
from bench.latency_redis import Notes


def reset_tables() -> None:
    """Empty cron_celery's and django-celery-beat's tables in the script's own database (only there)."""
    from django.apps import apps
    from django.db import connection

    from bench import latency_settings
    from bench.run import FORBIDDEN_DATABASES

    name = connection.settings_dict["NAME"]
    if name != latency_settings.LATENCY_DB or name in FORBIDDEN_DATABASES:
        raise BenchError(f"refusing to empty tables in {name}")
    tables = [model._meta.db_table for label in ("cron_celery", "django_celery_beat")
              for model in apps.get_app_config(label).get_models() if not model._meta.proxy]
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")


def create_periodic_tasks(n: int, mix: str) -> None:
    """N periodic tasks of the plain task, the mix's schedules, each last run "now": the first
    slot of each is its schedule's next (the 10 s interval: the next multiple of 10 s)."""
    from django.utils import timezone
    from django_celery_beat.models import CrontabSchedule, IntervalSchedule, PeriodicTask, PeriodicTasks

    from bench.latency_jobs import PLAIN_TASK

    crontabs = {}
    for kind, expression in latency_mix.CRON.items():
        minute, hour, day, month, weekday = expression.split()
        crontabs[kind] = CrontabSchedule.objects.create(minute=minute, hour=hour, day_of_month=day,
                                                        month_of_year=month, day_of_week=weekday, timezone="UTC")
    interval = IntervalSchedule.objects.create(every=latency_mix.PERIOD[latency_mix.EVERY_10S],
                                               period=IntervalSchedule.SECONDS)
    now = timezone.now()
    aligned = utc(math.floor(now.timestamp() / 10) * 10.0)
    rows = []
    for i in range(n):
        kind = latency_mix.kind_of(i, mix)
        if kind == latency_mix.EVERY_10S:
            rows.append(PeriodicTask(name=latency_mix.job_name(i, kind), task=PLAIN_TASK, interval=interval,
                                     last_run_at=aligned, enabled=True))
        else:
            rows.append(PeriodicTask(name=latency_mix.job_name(i, kind), task=PLAIN_TASK, crontab=crontabs[kind],
                                     last_run_at=now, enabled=True))
    PeriodicTask.objects.bulk_create(rows, batch_size=2000)
    PeriodicTasks.update_changed()  # bulk_create sends no signal


def cron_ready(n: int) -> bool:
    """The leader has synced the N jobs and ticked (its heartbeat says it leads)."""
    from cron_celery.models import BeatHeartbeat, CronJob

    return (BeatHeartbeat.objects.filter(leading=True).exists()
            and CronJob.objects.filter(code__startswith="LAT-", next_run_at__isnull=False).count() == n)


def beats_seen() -> int:
    from cron_celery.models import BeatHeartbeat

    return BeatHeartbeat.objects.count()


#: Statuses of a row whose body never ran: their ``ended`` is no final write of a run.
UNRUN = ("SKIPPED", "MISSED")
TERMINAL = ("SUCCEEDED", "FAILED", "TIMED_OUT", "LOST", "SKIPPED", "MISSED", "REVOKED")


def cron_window_done(start: float, end: float) -> bool:
    """Every window execution is over, and the beat has recorded a slot past the window."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT count(*) FILTER (WHERE slot < %(end)s AND status <> ALL(%(terminal)s)),
                   count(*) FILTER (WHERE slot >= %(end)s)
            FROM cron_celery_cronexecution WHERE task_code LIKE 'LAT-%%' AND slot >= %(start)s
            """,
            {"start": utc(start), "end": utc(end), "terminal": list(TERMINAL)},
        )
        row = cursor.fetchone()
    assert row is not None
    return int(row[0]) == 0 and int(row[1]) > 0


def cron_samples(start: float, end: float, notes: Notes) -> tuple[list[Sample], dict[str, int]]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT id, slot, created_at, ended, status, trigger, celery_task_id FROM cron_celery_cronexecution
            WHERE task_code LIKE 'LAT-%%' AND slot >= %s AND slot < %s
            """,
            [utc(start), utc(end)],
        )
        rows = cursor.fetchall()
    samples: list[Sample] = []
    statuses: Counter[str] = Counter()
    for execution_id, slot, created_at, ended, status, trigger, task_id in rows:
        statuses[f"{status} {trigger}"] += 1
        noted = notes.pub.get(str(task_id))
        samples.append(Sample(slot=slot.timestamp(), recorded=created_at.timestamp(),
                              handed=noted[1] if noted else None, published=notes.published_at(str(task_id)),
                              started=notes.start.get(str(execution_id)),
                              ended=ended.timestamp() if ended is not None and status not in UNRUN else None))
    return samples, dict(statuses)
