# Rollups for the dashboard's 7-day figures: per job, finished executions by hour of slots and
# successes' durations by day, kept by the same triggers as the tallies (0012) so the dashboard
# reads O(jobs) small rows however often a job runs. Deleted executions are taken out again.
#
# The tallies' insert trigger becomes a statement-level one: a statement that inserts many final
# rows (a catch-up's MISSED slots, a seeded history) adds each (job, status, bucket) once instead
# of updating one tally row once per inserted row, whose cost grows with the square of the rows
# (every update of a row already updated in the same transaction walks all its earlier versions).

import importlib

import django.db.models.deletion
from django.db import migrations, models

TALLY = importlib.import_module("cron_celery.migrations.0012_tally")
FINAL = TALLY.FINAL
#: Rows are kept for slots of the last 8 days: the dashboard reads 7, the tidy pass drops older ones.
HORIZON = "now() - interval '8 days'"
#: A success's duration bucket: 32 a doubling from one millisecond (``cron_celery.dashboard``).
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
    SELECT e.job_id, e.status, {TALLY.BUCKET.format(e="e")}, count(*), sum({TALLY.SECONDS.format(e="e")})
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

TRIGGERS = f"""
DROP TRIGGER cron_celery_counted_insert ON cron_celery_cronexecution;

CREATE OR REPLACE FUNCTION cron_celery_count_final() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    {add(NEW_ROW)}
    RETURN NULL;
END $$;

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

INSERT INTO cron_celery_hour (job_id, hour, ended, finished, succeeded) {hours("cron_celery_cronexecution")};
INSERT INTO cron_celery_durations (job_id, day, bucket, count) {durations("cron_celery_cronexecution")};
"""

UNDO = f"""
DROP TRIGGER IF EXISTS cron_celery_uncounted_deletes ON cron_celery_cronexecution;
DROP TRIGGER IF EXISTS cron_celery_counted_inserts ON cron_celery_cronexecution;
DROP FUNCTION IF EXISTS cron_celery_uncount_deleted();
DROP FUNCTION IF EXISTS cron_celery_count_inserted();
{TALLY.TRIGGER.split("CREATE TRIGGER cron_celery_counted_update")[0].replace("CREATE FUNCTION",
                                                                                 "CREATE OR REPLACE FUNCTION")}
"""


class Migration(migrations.Migration):

    dependencies = [
        ('cron_celery', '0012_tally'),
    ]

    operations = [
        migrations.CreateModel(
            name='Durations',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('day', models.DateField(help_text="The slots' day (UTC)")),
                ('bucket', models.SmallIntegerField()),
                ('count', models.BigIntegerField(default=0)),
                ('job', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='durations', to='cron_celery.cronjob')),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('job', 'day', 'bucket'), name='cron_durations_once')],
            },
        ),
        migrations.CreateModel(
            name='Hour',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('hour', models.DateTimeField(help_text="The slots' hour (UTC)")),
                ('ended', models.BigIntegerField(default=0, help_text='Executions of these slots in a final status')),
                ('finished', models.BigIntegerField(default=0, help_text='Those not SKIPPED')),
                ('succeeded', models.BigIntegerField(default=0)),
                ('job', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='hours', to='cron_celery.cronjob')),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('job', 'hour'), name='cron_hour_once')],
            },
        ),
        migrations.RunSQL(TRIGGERS, UNDO),
    ]
