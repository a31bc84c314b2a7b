"""Counters of finished executions, kept by the database as executions end (part of ``0001_initial``;
never edit it, a change is a new migration).

- ``cron_celery_tally``: per job, final status and duration bucket, a count and the seconds added up:
  a metrics scrape reads one row per key instead of the history (``cron_celery.metrics``).
- ``cron_celery_hour`` and ``cron_celery_durations``: the dashboard's 7-day figures, executions by hour
  of their slots and successes' durations by day (``cron_celery.dashboard``), for slots inside
  ``HORIZON``; deleted executions are taken out of them again.

An execution is counted once, when it reaches a final status, whichever statement wrote it. Inserts are
counted per statement: a statement of many final rows (a catch-up's MISSED slots) adds each key once.
"""

#: The histogram's upper bounds in seconds: the same as ``cron_celery.metrics.BUCKETS``.
BOUNDS = "ARRAY[0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600]::float8[]"
FINAL = "('SUCCEEDED', 'FAILED', 'TIMED_OUT', 'LOST', 'SKIPPED', 'MISSED', 'REVOKED')"
#: The tally bucket of a duration: how many bounds lie below it (-1: no duration, it never started).
BUCKET = ("CASE WHEN {e}.started IS NULL OR {e}.ended IS NULL THEN -1 ELSE (SELECT count(*) FROM unnest("
          + BOUNDS + ") AS bound WHERE bound < extract(epoch FROM {e}.ended - {e}.started)) END")
SECONDS = "coalesce(extract(epoch FROM {e}.ended - {e}.started), 0)"
#: Rollup rows are kept for slots of the last 8 days: the dashboard reads 7, the tidy pass drops older ones.
HORIZON = "now() - interval '8 days'"
#: A success's duration bucket in the rollups: 32 a doubling from one millisecond (``cron_celery.dashboard``).
DURATION_BUCKET = ("floor(32 * ln(greatest(extract(epoch FROM {e}.ended - {e}.started)::float8, 0.001) / 0.001)"
                   " / ln(2))::smallint")
TIMED = "{e}.status = 'SUCCEEDED' AND {e}.started IS NOT NULL AND {e}.ended IS NOT NULL"


def hours(rows: str) -> str:
    """The hour rows' increments from ``rows`` (a FROM item with job_id, status, slot)."""
    return (f"SELECT e.job_id, date_trunc('hour', e.slot, 'UTC') AS hour, count(*) AS ended, "
            f"count(*) FILTER (WHERE e.status <> 'SKIPPED') AS finished, "
            f"count(*) FILTER (WHERE e.status = 'SUCCEEDED') AS succeeded "
            f"FROM {rows} AS e WHERE e.status IN {FINAL} AND e.slot >= {HORIZON} GROUP BY 1, 2 ORDER BY 1, 2")


def durations(rows: str) -> str:
    """The duration rows' increments from ``rows`` (job_id, status, slot, started, ended)."""
    return (f"SELECT e.job_id, (e.slot AT TIME ZONE 'UTC')::date AS day, {DURATION_BUCKET.format(e='e')} AS bucket, "
            f"count(*) AS count FROM {rows} AS e WHERE {TIMED.format(e='e')} AND e.slot >= {HORIZON} "
            f"GROUP BY 1, 2, 3 ORDER BY 1, 2, 3")


def add(rows: str) -> str:
    """Count ``rows`` that are final into the tallies and the rollups, one upsert per key."""
    return f"""
    INSERT INTO cron_celery_tally AS t (job_id, status, bucket, count, seconds)
    SELECT e.job_id, e.status, {BUCKET.format(e="e")}, count(*), sum({SECONDS.format(e="e")})
    FROM {rows} AS e WHERE e.status IN {FINAL} GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
    ON CONFLICT (job_id, status, bucket) DO UPDATE
        SET count = t.count + EXCLUDED.count, seconds = t.seconds + EXCLUDED.seconds;
    INSERT INTO cron_celery_hour AS h (job_id, hour, ended, finished, succeeded) {hours(rows)}
    ON CONFLICT (job_id, hour) DO UPDATE SET ended = h.ended + EXCLUDED.ended,
        finished = h.finished + EXCLUDED.finished, succeeded = h.succeeded + EXCLUDED.succeeded;
    INSERT INTO cron_celery_durations AS d (job_id, day, bucket, count) {durations(rows)}
    ON CONFLICT (job_id, day, bucket) DO UPDATE SET count = d.count + EXCLUDED.count;
    """


NEW_ROW = "(SELECT NEW.job_id AS job_id, NEW.status AS status, NEW.slot AS slot, NEW.started AS started, " \
          "NEW.ended AS ended)"

FORWARD = f"""
CREATE FUNCTION cron_celery_count_final() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    {add(NEW_ROW)}
    RETURN NULL;
END $$;
CREATE TRIGGER cron_celery_counted_update
    AFTER UPDATE OF status ON cron_celery_cronexecution FOR EACH ROW
    WHEN (NEW.status IN {FINAL} AND OLD.status NOT IN {FINAL})
    EXECUTE FUNCTION cron_celery_count_final();

CREATE FUNCTION cron_celery_count_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM added WHERE status IN {FINAL}) THEN
        {add("added")}
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER cron_celery_counted_inserts
    AFTER INSERT ON cron_celery_cronexecution REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION cron_celery_count_inserted();

CREATE FUNCTION cron_celery_uncount_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE cron_celery_hour AS h SET ended = h.ended - g.ended, finished = h.finished - g.finished,
        succeeded = h.succeeded - g.succeeded
    FROM ({hours("gone")}) AS g WHERE h.job_id = g.job_id AND h.hour = g.hour;
    UPDATE cron_celery_durations AS d SET count = d.count - g.count
    FROM ({durations("gone")}) AS g WHERE d.job_id = g.job_id AND d.day = g.day AND d.bucket = g.bucket;
    RETURN NULL;
END $$;
CREATE TRIGGER cron_celery_uncounted_deletes
    AFTER DELETE ON cron_celery_cronexecution REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION cron_celery_uncount_deleted();
"""

BACKWARD = """
DROP FUNCTION IF EXISTS cron_celery_uncount_deleted() CASCADE;
DROP FUNCTION IF EXISTS cron_celery_count_inserted() CASCADE;
DROP FUNCTION IF EXISTS cron_celery_count_final() CASCADE;
"""
