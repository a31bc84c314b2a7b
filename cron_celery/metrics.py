"""Prometheus metrics, read from the database at each scrape (any web process can serve
them; nothing is kept in the workers' memory). Needs ``prometheus-client`` (the
``metrics`` extra). Counters are derived from the execution table, so purging old rows
lowers them: Prometheus treats that as a counter reset.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.db import connection
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from cron_celery import conf, enums, models

JOB = models.CronJob._meta.db_table
EXE = models.CronExecution._meta.db_table
BEAT = models.BeatHeartbeat._meta.db_table
#: Upper bounds (seconds) of the duration histogram's buckets.
BUCKETS = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)


class DatabaseCollector(Collector):
    def collect(self) -> Iterator[Any]:
        late = float(conf.settings.HEALTH["OVERDUE_SECONDS"])
        executions = CounterMetricFamily("cron_executions", "Executions by job and status", labels=["job", "status"])
        lost = CounterMetricFamily("cron_lost", "Executions that ended LOST", labels=["job"])
        fenced = CounterMetricFamily("cron_fenced", "Outcomes not recorded: the run had been taken over",
                                     labels=["job"])
        last_success = GaugeMetricFamily("cron_last_success_timestamp_seconds", "When the job last succeeded",
                                         labels=["job"])
        overdue = GaugeMetricFamily("cron_overdue", "1 when the job's next slot is late beyond the health limit",
                                    labels=["job"])
        failures = GaugeMetricFamily("cron_consecutive_failures", "Failures in a row", labels=["job"])
        durations = HistogramMetricFamily("cron_execution_duration_seconds", "Duration of finished executions",
                                          labels=["job"])
        with connection.cursor() as cursor:
            cursor.execute(
                f"""
                SELECT name, fenced_count, extract(epoch FROM last_success_at), consecutive_failures,
                       (NOT paused AND next_run_at < now() - make_interval(secs => %s))
                FROM {JOB} ORDER BY name
                """,
                [late],
            )
            for name, fenced_count, success_at, in_a_row, late_now in cursor.fetchall():
                fenced.add_metric([name], fenced_count)
                if success_at is not None:
                    last_success.add_metric([name], float(success_at))
                overdue.add_metric([name], 1.0 if late_now else 0.0)
                failures.add_metric([name], in_a_row)
            cursor.execute(f"SELECT job_id, status, count(*) FROM {EXE} GROUP BY job_id, status")
            counts = cursor.fetchall()
            cursor.execute(
                f"""
                SELECT job_id, (SELECT count(*) FROM unnest(%s::float8[]) AS bound
                                WHERE bound < extract(epoch FROM ended - started)),
                       count(*), sum(extract(epoch FROM ended - started))
                FROM {EXE} WHERE started IS NOT NULL AND ended IS NOT NULL GROUP BY 1, 2
                """,
                [list(BUCKETS)],
            )
            spans = cursor.fetchall()
            cursor.execute(f"SELECT id, name FROM {JOB}")
            names = dict(cursor.fetchall())
            cursor.execute(f'SELECT extract(epoch FROM now() - max(seen_at)) FROM {BEAT} WHERE "leading"')
            beat_age = cursor.fetchone()[0]
        lost_by_job: dict[str, float] = {}
        for job_id, status, count in counts:
            name = names.get(job_id, str(job_id))
            executions.add_metric([name, status], count)
            if status == enums.Status.LOST:
                lost_by_job[name] = count
        for name in names.values():
            lost.add_metric([name], lost_by_job.get(name, 0))
        per_job: dict[str, tuple[list[int], float]] = {}
        for job_id, bucket, count, total in spans:
            name = names.get(job_id, str(job_id))
            counts_by_bucket, seconds = per_job.setdefault(name, ([0] * (len(BUCKETS) + 1), 0.0))
            counts_by_bucket[int(bucket)] += count  # the first bucket whose bound is >= the duration
            per_job[name] = (counts_by_bucket, seconds + float(total or 0))
        for name, (counts_by_bucket, seconds) in sorted(per_job.items()):
            cumulative, running = [], 0
            for bound, count in zip((*map(str, BUCKETS), "+Inf"), counts_by_bucket, strict=True):
                running += count
                cumulative.append((bound, running))
            durations.add_metric([name], cumulative, seconds)
        yield from (executions, lost, fenced, last_success, overdue, failures, durations)
        beat = GaugeMetricFamily("cron_beat_heartbeat_age_seconds", "Seconds since the leading beat was seen")
        if beat_age is not None:
            beat.add_metric([], float(beat_age))
        yield beat


def render() -> tuple[bytes, str]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector())
    return generate_latest(registry), CONTENT_TYPE_LATEST
