"""The dashboard's 7-day figures from rollups (issue 16 item 7), and the counting triggers'
cost per statement: every figure is checked against the executions themselves, on the real
database, through the statements the product runs (a claim and its final write, a bulk insert,
a purge, the hourly tidy) and through the admin page."""

from __future__ import annotations

import datetime as dt
import math
import random
import statistics
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from hypothesis import given, settings
from hypothesis import strategies as st

from cron_celery import models
from cron_celery.migrations._initial import counting
from cron_celery.models import CronJob, Durations, Hour, Status, Trigger
from cron_celery.reconciler import retention
from cron_celery.run import runs
from cron_celery.web import dashboard
from tests.conftest import make_job

EXE = models.CronExecution._meta.db_table
TALLY = models.Tally._meta.db_table
DASHBOARD = "/admin/cron_celery/cronjob/"
ROLLUPS = counting


def sql(statement: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(statement, params or [])
        return list(cursor.fetchall()) if cursor.description else []


def insert(job_id: int, count: int, *, every: str = "1 minute", ago: str = "1 minute",
           durations_ms: list[float] | None = None, status_of: str = "'SUCCEEDED'") -> None:
    """``count`` finished executions of one job in one statement: slots ``ago`` before now and
    then one ``every`` further back; each took ``durations_ms[i]`` (default 1-9 s); ``status_of``
    is an SQL expression of ``g`` (0-based) for each row's status."""
    durations = durations_ms or [1000.0 * (1 + g % 9) for g in range(count)]
    sql(
        f"""
        INSERT INTO {EXE} (job_id, task_code, task_name, slot, execution_date, run_number, status, trigger,
            skip_reason, forced, created_at, started, ended, completed, success, message, error_code, traceback,
            retry_count, celery_task_id, worker, fence)
        SELECT %s, 'J', 'j', s.at, s.at::date, 1, s.status, 'BEAT', '', false, now(),
               s.at - make_interval(secs => d.ms / 1000.0), s.at, true, s.status = 'SUCCEEDED', 'done', '', '', 0,
               '', 'w', 0
        FROM generate_series(0, %s - 1) AS g,
             LATERAL (SELECT date_trunc('second', now()) - %s::interval - g * %s::interval AS at,
                             ({status_of.replace("%", "%%")})::text AS status) AS s,
             LATERAL (SELECT (%s::float8[])[g + 1] AS ms) AS d
        """,
        [job_id, count, ago, every, durations],
    )


def truth(job_id: int) -> dict[str, Any]:
    """What the rollups must hold, recounted from the job's executions within the horizon."""
    hours = sql(f"SELECT date_trunc('hour', slot, 'UTC'), count(*), count(*) FILTER (WHERE status <> 'SKIPPED'), "
                f"count(*) FILTER (WHERE status = 'SUCCEEDED') FROM {EXE} WHERE job_id = %s "
                f"AND status IN {ROLLUPS.FINAL} AND slot >= {ROLLUPS.HORIZON} GROUP BY 1", [job_id])
    buckets = sql(f"SELECT (slot AT TIME ZONE 'UTC')::date, {ROLLUPS.DURATION_BUCKET.format(e=EXE)}, count(*) "
                  f"FROM {EXE} WHERE job_id = %s AND {ROLLUPS.TIMED.format(e=EXE)} AND slot >= {ROLLUPS.HORIZON} "
                  f"GROUP BY 1, 2", [job_id])
    return {"hours": {row[0]: tuple(row[1:]) for row in hours}, "durations": {row[:2]: row[2] for row in buckets}}


def rollups(job_id: int) -> dict[str, Any]:
    """The rollups as kept, leaving out rows that purges brought to zero."""
    return {"hours": {h.hour: (h.ended, h.finished, h.succeeded)
                      for h in Hour.objects.filter(job_id=job_id) if h.ended},
            "durations": {(d.day, d.bucket): d.count for d in Durations.objects.filter(job_id=job_id) if d.count}}


def week_of(job_id: int) -> dashboard.Week:
    job = dashboard.with_figures(CronJob.objects.filter(id=job_id)).get()
    return dashboard.week(job.week)  # type: ignore[attr-defined]


def exact_week(job_id: int) -> tuple[int, int, float | None]:
    (row,) = sql(f"SELECT count(*) FILTER (WHERE completed AND status <> 'SKIPPED'), "
                 f"count(*) FILTER (WHERE status = 'SUCCEEDED'), percentile_cont(0.5) WITHIN GROUP "
                 f"(ORDER BY extract(epoch FROM ended - started)) FILTER (WHERE status = 'SUCCEEDED' "
                 f"AND started IS NOT NULL) FROM {EXE} WHERE job_id = %s AND slot >= now() - interval '7 days'",
                 [job_id])
    return int(row[0]), int(row[1]), None if row[2] is None else float(row[2])


@pytest.mark.django_db(transaction=True)
def test_one_statement_of_many_final_rows_counts_each_key_once():
    """Before (a row-level insert trigger, as the counting began) a statement inserting 2,000 final rows
    of one job wrote its tally row 2,000 times in one transaction, each write walking the earlier
    versions: the cost grew with the square of the rows. Now each (job, status, bucket) is
    written once per statement, read from PostgreSQL's per-transaction statistics."""
    _, job_id = make_job()

    def written(table: str) -> int:
        rows = sql("SELECT n_tup_ins + n_tup_upd FROM pg_stat_xact_user_tables WHERE relname = %s", [table])
        return int(rows[0][0]) if rows else 0

    with transaction.atomic():
        # Counted as a difference: PostgreSQL 15 shows in these "transaction" statistics the writes
        # of this connection's earlier transactions too until it flushes them (at most once a second),
        # so the test before this one would be counted in.
        before = {table: written(table) for table in (TALLY, Hour._meta.db_table)}
        insert(job_id, 2000, every="1 second", durations_ms=[20.0] * 2000,
               status_of="CASE WHEN g % 10 = 0 THEN 'FAILED' ELSE 'SUCCEEDED' END")
        writes, hours = (written(table) - before[table] for table in (TALLY, Hour._meta.db_table))
    assert writes == 2  # FAILED and SUCCEEDED, both in the 0-0.1 s bucket
    assert hours == len(truth(job_id)["hours"]) <= 2  # 2,000 seconds of slots: one or two hours
    assert sum(models.Tally.objects.filter(job_id=job_id).values_list("count", flat=True)) == 2000


@pytest.mark.django_db(transaction=True)
def test_the_rollups_are_the_history_through_claims_inserts_purges_and_the_tidy():
    job, job_id = make_job(pattern="always", overlap="allow")
    insert(job_id, 300, every="17 minutes", durations_ms=[random.Random(1).uniform(1, 5000) for _ in range(300)],
           status_of="CASE WHEN g % 7 = 0 THEN 'FAILED' WHEN g % 11 = 0 THEN 'SKIPPED' ELSE 'SUCCEEDED' END")
    # A run through the product's own claim and final write (the row-level update trigger), and
    # one open execution, which no rollup counts.
    slot = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(seconds=30)
    assert runs.execute(job, slot, lambda run: "ok", trigger=Trigger.MANUAL).status == Status.SUCCEEDED
    assert runs.execute(job, slot + dt.timedelta(seconds=1), lambda run: {"error": True},
                        trigger=Trigger.MANUAL).status == Status.FAILED
    sql(f"UPDATE {EXE} SET status = 'RUNNING', completed = false WHERE id = (SELECT min(id) FROM {EXE} "
        f"WHERE job_id = %s)", [job_id])  # never happens to a final row; this one is simply open now
    # An old slot (a backfill of last month) is outside the horizon and kept out of the rollups.
    insert(job_id, 3, ago="40 days")
    expected = truth(job_id)
    assert rollups(job_id)["durations"] == expected["durations"]
    # The row made open again was counted when it ended (counters only go up on a change to final).
    opened = sum(row[0] for row in expected["hours"].values())
    assert sum(row[0] for row in rollups(job_id)["hours"].values()) == opened + 1

    sql(f"DELETE FROM {Hour._meta.db_table} WHERE job_id = %s", [job_id])  # recount from scratch:
    sql(f"INSERT INTO {Hour._meta.db_table} (job_id, hour, ended, finished, succeeded) "
        f"{ROLLUPS.hours(EXE)}".replace("GROUP BY", f"AND e.job_id = {job_id} GROUP BY"))  # the migration's seed
    assert rollups(job_id) == expected

    # A purge of the last three days' successes takes them out of the figures again.
    purged = retention.purge(dt.datetime.now(dt.UTC) - dt.timedelta(days=2), ("SUCCEEDED",), batch_size=50)
    assert purged.executions > 0
    assert rollups(job_id) == truth(job_id)

    # The hourly tidy drops rollups of slots older than ROLLUP_DAYS, and nothing else.
    kept = rollups(job_id)
    old = dt.datetime.now(dt.UTC) - dt.timedelta(days=models.ROLLUP_DAYS, hours=2)
    Hour.objects.create(job_id=job_id, hour=old.replace(minute=0, second=0, microsecond=0), ended=5, finished=5)
    Durations.objects.create(job_id=job_id, day=old.date() - dt.timedelta(days=1), bucket=300, count=5)
    assert retention.tidy(batch=1000).rollups == 2
    assert rollups(job_id) == kept == truth(job_id)


@pytest.mark.django_db(transaction=True)
def test_a_quiet_jobs_week_is_exact_and_a_busy_jobs_is_read_from_the_rollups(admin_client):
    """A job with at most EXACT_UP_TO ended executions in the week shows exactly what its rows
    say; a busier one shows the same success rate and a median within a bucket (about 2 %),
    marked "≈", and the page reads at most the chart's 30 of its executions."""
    _, quiet = make_job()
    _, busy = make_job()
    quiet_ms = [random.Random(2).lognormvariate(6, 1) for _ in range(200)]
    busy_ms = [random.Random(3).lognormvariate(3, 0.8) for _ in range(5000)]
    insert(quiet, 200, every="40 minutes", durations_ms=quiet_ms,
           status_of="CASE WHEN g % 9 = 0 THEN 'FAILED' WHEN g % 13 = 0 THEN 'SKIPPED' ELSE 'SUCCEEDED' END")
    insert(busy, 5000, every="1 minute", durations_ms=busy_ms,
           status_of="CASE WHEN g % 50 = 0 THEN 'TIMED_OUT' ELSE 'SUCCEEDED' END")
    assert week_of(quiet) == dashboard.Week(*exact_week(quiet), estimated=False)
    busy_week, (finished, succeeded, median) = week_of(busy), exact_week(busy)
    assert (busy_week.finished, busy_week.succeeded, busy_week.estimated) == (finished, succeeded, True)
    assert median is not None and busy_week.median is not None
    assert abs(busy_week.median - median) / median < 2 ** (1 / dashboard.PER_DOUBLING) - 1

    page = admin_client.get(DASHBOARD)
    html = page.content.decode()
    assert f"{100 * succeeded / finished:.0f} % of {finished}" in html
    assert f"≈ {busy_week.median * 1000:.0f} ms" in html
    quiet_median = exact_week(quiet)[2]
    assert quiet_median is not None and f"{quiet_median:.1f} s" in html

    with CaptureQueriesContext(connection) as captured:
        dashboard.with_figures(CronJob.objects.filter(id__in=[busy, quiet])).count()
        list(dashboard.with_figures(CronJob.objects.filter(id__in=[busy, quiet])))
    (listing,) = [query["sql"] for query in captured.captured_queries if "json_build_array" in query["sql"]]
    sql(f"ANALYZE {EXE}")  # as autovacuum would have by now: the chart then reads its 30 rows by the index
    (plan,) = sql(f"EXPLAIN (ANALYZE, FORMAT JSON) {listing}")
    read = sum(node.get("Actual Rows", 0) * node.get("Actual Loops", 1)
               for node in plan_nodes(plan[0][0]["Plan"]) if node.get("Relation Name") == EXE)
    assert read <= 2 * dashboard.BARS + 200  # the two charts and the quiet job's week, none of the busy week


def plan_nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [node, *(found for child in node.get("Plans", []) for found in plan_nodes(child))]


@pytest.mark.django_db
def test_the_database_puts_each_duration_in_the_bucket_the_dashboard_reads_it_from():
    durations = [0.0, 0.0004, 0.001, 0.0011, 0.05, 0.999, 1.0, 1.5, 61.0, 3600.0, 86400.0 * 3]
    (row,) = sql(f"SELECT array_agg({ROLLUPS.DURATION_BUCKET.format(e='x')} ORDER BY n) FROM "
                 f"unnest(%s::float8[]) WITH ORDINALITY AS u(s, n), "
                 f"LATERAL (SELECT now() AS started, now() + make_interval(secs => u.s) AS ended) AS x",
                 [durations])
    for seconds, bucket in zip(durations, row[0], strict=True):
        low, high = dashboard.bucket_bounds(bucket)
        assert low <= seconds < high or math.isclose(seconds, low, rel_tol=1e-9), (seconds, bucket, low, high)


def python_bucket(seconds: float) -> int:
    return max(0, math.floor(dashboard.PER_DOUBLING * math.log2(max(seconds, dashboard.SMALLEST) / dashboard.SMALLEST)))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(min_value=0.0, max_value=7 * 86400.0, allow_nan=False), min_size=1, max_size=400))
def test_the_estimated_median_lies_within_the_buckets_of_the_true_middle_values(durations: list[float]) -> None:
    counts: dict[int, int] = {}
    for seconds in durations:
        counts[python_bucket(seconds)] = counts.get(python_bucket(seconds), 0) + 1
    estimate = dashboard.estimated_median(sorted(counts.items()))
    ordered = sorted(durations)
    middle = [ordered[(len(ordered) - 1) // 2], ordered[len(ordered) // 2]]
    bounds = [dashboard.bucket_bounds(python_bucket(seconds)) for seconds in middle]
    assert estimate is not None
    low, high = sum(b[0] for b in bounds) / 2, sum(b[1] for b in bounds) / 2
    assert low * (1 - 1e-12) <= estimate <= high * (1 + 1e-12)
    true = statistics.median(durations)
    width = 2 ** (1 / dashboard.PER_DOUBLING)
    if min(middle) >= dashboard.SMALLEST * width:  # past the first bucket: within one bucket's width
        assert true / width * (1 - 1e-9) <= estimate <= true * width * (1 + 1e-9)
    assert dashboard.estimated_median([]) is None
