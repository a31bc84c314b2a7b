"""Prometheus metrics, read from the database at each scrape (any web process can serve
them; nothing is kept in the workers' memory). Needs ``prometheus-client`` (the
``prometheus`` extra).

A scrape costs the same at a thousand executions or ten million: the counters and the
duration histogram come from ``Tally`` (one row per job, final status and duration bucket,
kept by a trigger as executions end), the open executions from the ``(job, status)`` index,
job by job, and the rest from the job rows. Purging history does not lower the counters.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from django.db import connection
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from cron_celery import conf, enums, models
from cron_celery.decisions import beat_needed, leadership, oneoffs

JOB = models.CronJob._meta.db_table
EXE = models.CronExecution._meta.db_table
TALLY = models.Tally._meta.db_table
BEAT = models.BeatHeartbeat._meta.db_table
ALERT = models.Alert._meta.db_table
#: Upper bounds (seconds) of the duration histogram's buckets (``migrations/_initial/counting.py``
#: has the same; ``tests/test_endpoints.py`` checks they agree).
BUCKETS = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
#: Statuses an execution leaves again: shown as a gauge, not counted.
OPEN = (enums.Status.PENDING, enums.Status.RUNNING, enums.Status.RETRYING)
#: The final statuses ``cron_executions_total`` serves for every job, at 0 until one happens.
ZERO_STATUSES = (enums.Status.SUCCEEDED, enums.Status.FAILED, enums.Status.TIMED_OUT, enums.Status.LOST)


class DatabaseCollector(Collector):
    def collect(self) -> Iterator[Any]:
        read = _read(float(conf.settings.HEALTH["OVERDUE_SECONDS"]))
        yield from _per_job(read)
        yield from _system(read)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Read:
    """What one scrape reads, in a handful of statements of O(jobs) rows each."""

    jobs: list[tuple[Any, ...]]
    waiting: dict[int, bool]
    tallies: list[tuple[Any, ...]]
    opened: list[tuple[Any, ...]]
    beat_age: Any
    needs_beat: Any
    undelivered: list[tuple[Any, ...]]
    passed: tuple[Any, ...] | None
    unanswered: tuple[Any, ...] | None


def _read(late: float) -> _Read:
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT id, name, fenced_count, extract(epoch FROM last_success_at), consecutive_failures,
                   (NOT paused AND due_at < now() - make_interval(secs => %s)), paused
            FROM {JOB} ORDER BY name
            """,
            [late],
        )
        jobs = cursor.fetchall()
        # One-off runs not sent yet, through their partial index: late ones make the job overdue
        # (as on /cron/health/).
        cursor.execute(
            f"""
            SELECT e.job_id, bool_or(e.due_at < now() - make_interval(secs => %s))
            FROM {EXE} AS e WHERE {oneoffs.UNSENT} GROUP BY e.job_id
            """,
            [late],
        )
        waiting = dict(cursor.fetchall())
        cursor.execute(f"SELECT job_id, status, bucket, count, seconds FROM {TALLY}")
        tallies = cursor.fetchall()
        # Job by job through the (job, status) index: the few open executions, not the history.
        cursor.execute(
            f"""
            SELECT j.id, o.status, o.n, o.resent FROM {JOB} AS j CROSS JOIN LATERAL (
                SELECT status, count(*) AS n, sum(republished) AS resent FROM {EXE}
                WHERE job_id = j.id AND status = ANY(%s) GROUP BY status) AS o
            """,
            [list(OPEN)],
        )
        opened = cursor.fetchall()
        cursor.execute(f'SELECT (SELECT extract(epoch FROM now() - max(seen_at)) FROM {BEAT} WHERE "leading"), '
                       f'{beat_needed.SQL}')
        beat_age, needs_beat = cursor.fetchone()
        # PENDING through its partial index (the few not delivered yet); FAILED through its own,
        # with when each channel last gave one up (the status change sets updated_at).
        cursor.execute(
            f"""
            SELECT channel, 'PENDING', count(*), NULL FROM {ALERT} WHERE status = 'PENDING' GROUP BY channel
            UNION ALL
            SELECT channel, 'FAILED', count(*), extract(epoch FROM max(updated_at))
            FROM {ALERT} WHERE status = 'FAILED' GROUP BY channel
            """
        )
        undelivered = cursor.fetchall()
        # When the last reconciler pass that finished every step ended (``reconciler.run_pass``).
        cursor.execute(f"SELECT extract(epoch FROM now() - lease_until) FROM {leadership.LEASE} WHERE name = %s",
                       [leadership.RECONCILED])
        passed = cursor.fetchone()
        # When a pass last could not ask the broker where the stranded messages are (it left them alone).
        cursor.execute(f"SELECT extract(epoch FROM lease_until) FROM {leadership.LEASE} WHERE name = %s",
                       [leadership.BROKER_UNANSWERED])
        unanswered = cursor.fetchone()
    return _Read(jobs=jobs, waiting=waiting, tallies=tallies, opened=opened, beat_age=beat_age,
                 needs_beat=needs_beat, undelivered=undelivered, passed=passed, unanswered=unanswered)


def _per_job(read: _Read) -> Iterator[Any]:
    """The families with a series per job: executions by status, open ones, lost, fenced, last success,
    overdue, failures in a row, paused, durations, re-sends."""
    jobs, waiting, tallies, opened = read.jobs, read.waiting, read.tallies, read.opened
    executions = CounterMetricFamily("cron_executions", "Executions that ended, by job and final status",
                                     labels=["cron_job", "status"])
    open_now = GaugeMetricFamily("cron_executions_open", "Executions pending, running or retrying now",
                                 labels=["cron_job", "status"])
    lost = CounterMetricFamily("cron_lost", "Executions that ended LOST", labels=["cron_job"])
    fenced = CounterMetricFamily("cron_fenced", "Outcomes not recorded: the run had been taken over",
                                 labels=["cron_job"])
    last_success = GaugeMetricFamily("cron_last_success_timestamp_seconds", "When the job last succeeded",
                                     labels=["cron_job"])
    overdue = GaugeMetricFamily("cron_overdue", "1 when the job's next slot (unpaused) or a one-off run of it "
                                "is late beyond the health limit",
                                labels=["cron_job"])
    failures = GaugeMetricFamily("cron_consecutive_failures", "Failures in a row", labels=["cron_job"])
    paused = GaugeMetricFamily("cron_paused", "1 while the job is paused", labels=["cron_job"])
    durations = HistogramMetricFamily("cron_execution_duration_seconds", "Duration of finished executions",
                                      labels=["cron_job"])
    names = {job_id: name for job_id, name, *_ in jobs}
    for job_id, name, fenced_count, success_at, in_a_row, late_now, is_paused in jobs:
        paused.add_metric([name], 1.0 if is_paused else 0.0)
        fenced.add_metric([name], fenced_count)
        if success_at is not None:
            last_success.add_metric([name], float(success_at))
        overdue.add_metric([name], 1.0 if late_now or waiting.get(job_id) else 0.0)
        failures.add_metric([name], in_a_row)
    by_status: dict[tuple[str, str], int] = {}
    per_job: dict[str, tuple[list[int], float]] = {}
    for job_id, status, bucket, count, seconds in tallies:
        name = names.get(job_id, str(job_id))
        by_status[(name, status)] = by_status.get((name, status), 0) + count
        if bucket >= 0:
            counts_by_bucket, total = per_job.setdefault(name, ([0] * (len(BUCKETS) + 1), 0.0))
            counts_by_bucket[bucket] += count  # the first bucket whose bound is >= the duration
            per_job[name] = (counts_by_bucket, total + float(seconds))
    # Success and each failure start at 0 for every job: a series that appears at 1 is no
    # increase to rate() or increase(), so a job's first failure would not show.
    for name in names.values():
        for status in ZERO_STATUSES:
            by_status.setdefault((name, status), 0)
    for (name, status), count in sorted(by_status.items()):
        executions.add_metric([name, status], count)
    for name in sorted(names.values()):
        lost.add_metric([name], by_status.get((name, enums.Status.LOST), 0))
    resent = dict.fromkeys(names.values(), 0)
    for job_id, status, count, sent in opened:
        open_now.add_metric([names.get(job_id, str(job_id)), status], count)
        if status != enums.Status.RUNNING:
            name = names.get(job_id, str(job_id))
            resent[name] = resent.get(name, 0) + int(sent or 0)
    resends = GaugeMetricFamily("cron_reconciler_resent", "Times the reconciler sent the job's executions "
                                "still pending or retrying again (at most RECONCILE['REPUBLISH_LIMIT'] each)",
                                labels=["cron_job"])
    for name, sent in sorted(resent.items()):
        resends.add_metric([name], sent)
    for name, (counts_by_bucket, seconds) in sorted(per_job.items()):
        cumulative, running = [], 0
        for bound, count in zip((*map(str, BUCKETS), "+Inf"), counts_by_bucket, strict=True):
            running += count
            cumulative.append((bound, running))
        durations.add_metric([name], cumulative, seconds)
    yield from (executions, open_now, lost, fenced, last_success, overdue, failures, paused, durations, resends)


def _system(read: _Read) -> Iterator[Any]:
    """The families of the whole system: the beat, the alerts not delivered, the reconciler."""
    beat_age, needs_beat, undelivered, passed, unanswered = (read.beat_age, read.needs_beat, read.undelivered,
                                                             read.passed, read.unanswered)
    beat = GaugeMetricFamily("cron_beat_heartbeat_age_seconds", "Seconds since the leading beat was seen")
    if beat_age is not None:
        beat.add_metric([], float(beat_age))
    yield beat
    needed = GaugeMetricFamily("cron_beat_needed", "1 while an unpaused job has a slot to send (not one past its "
                               "window's end) or an edit to take in, or a one-off run waits to be sent: a beat "
                               "must lead")
    needed.add_metric([], 1.0 if needs_beat else 0.0)
    yield needed
    alerts = GaugeMetricFamily("cron_alerts_undelivered",
                               "Alerts not delivered: PENDING (being tried now) or FAILED (given up, "
                               "kept for ALERT_RETENTION_DAYS)", labels=["channel", "status"])
    gave_up = GaugeMetricFamily("cron_alerts_last_failed_timestamp_seconds",
                                "When an alert on the channel was last given up", labels=["channel"])
    for channel, status, count, last in sorted(undelivered):
        alerts.add_metric([channel, status], count)
        if last is not None:
            gave_up.add_metric([channel], float(last))
    yield alerts
    yield gave_up
    last_pass = GaugeMetricFamily("cron_reconciler_last_pass_age_seconds",
                                  "Seconds since the last reconciler pass that finished every step ended")
    if passed is not None:
        last_pass.add_metric([], max(0.0, float(passed[0])))
    yield last_pass
    blind = GaugeMetricFamily("cron_reconciler_broker_unanswered_timestamp_seconds",
                              "When a reconciler pass last could not ask the broker where the stranded "
                              "executions' messages are (it left them alone)")
    if unanswered is not None:
        blind.add_metric([], float(unanswered[0]))
    yield blind
    interval = GaugeMetricFamily("cron_reconciler_interval_seconds",
                                 "RECONCILE['INTERVAL']: how often each worker runs a pass (0: its timer is off)")
    interval.add_metric([], float(conf.settings.RECONCILE["INTERVAL"]))
    yield interval




def render() -> tuple[bytes, str]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector())
    return generate_latest(registry), CONTENT_TYPE_LATEST
