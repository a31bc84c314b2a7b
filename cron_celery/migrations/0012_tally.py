# Counters of finished executions kept as they happen, so a metrics scrape reads one row per job,
# status and duration bucket instead of the whole history. A trigger counts every execution that
# reaches a final status, whichever statement wrote it; the existing history is counted once here.

import django.db.models.deletion
from django.db import migrations, models

#: The histogram's upper bounds in seconds: the same as ``cron_celery.metrics.BUCKETS``.
BOUNDS = "ARRAY[0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600]::float8[]"
FINAL = "('SUCCEEDED', 'FAILED', 'TIMED_OUT', 'LOST', 'SKIPPED', 'MISSED', 'REVOKED')"
# The bucket of a duration is the number of bounds below it (-1: no duration, it never started).
BUCKET = ("CASE WHEN {e}.started IS NULL OR {e}.ended IS NULL THEN -1 ELSE (SELECT count(*) FROM unnest("
          + BOUNDS + ") AS bound WHERE bound < extract(epoch FROM {e}.ended - {e}.started)) END")
SECONDS = "coalesce(extract(epoch FROM {e}.ended - {e}.started), 0)"

TRIGGER = f"""
CREATE FUNCTION cron_celery_count_final() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO cron_celery_tally (job_id, status, bucket, count, seconds)
    VALUES (NEW.job_id, NEW.status, {BUCKET.format(e="NEW")}, 1, {SECONDS.format(e="NEW")})
    ON CONFLICT (job_id, status, bucket) DO UPDATE
        SET count = cron_celery_tally.count + 1, seconds = cron_celery_tally.seconds + EXCLUDED.seconds;
    RETURN NULL;
END $$;
CREATE TRIGGER cron_celery_counted_insert
    AFTER INSERT ON cron_celery_cronexecution FOR EACH ROW
    WHEN (NEW.status IN {FINAL})
    EXECUTE FUNCTION cron_celery_count_final();
CREATE TRIGGER cron_celery_counted_update
    AFTER UPDATE OF status ON cron_celery_cronexecution FOR EACH ROW
    WHEN (NEW.status IN {FINAL} AND OLD.status NOT IN {FINAL})
    EXECUTE FUNCTION cron_celery_count_final();

INSERT INTO cron_celery_tally (job_id, status, bucket, count, seconds)
SELECT e.job_id, e.status, {BUCKET.format(e="e")}, count(*), sum({SECONDS.format(e="e")})
FROM cron_celery_cronexecution AS e WHERE e.status IN {FINAL} GROUP BY 1, 2, 3;
"""

DROP = """
DROP TRIGGER IF EXISTS cron_celery_counted_insert ON cron_celery_cronexecution;
DROP TRIGGER IF EXISTS cron_celery_counted_update ON cron_celery_cronexecution;
DROP FUNCTION IF EXISTS cron_celery_count_final();
"""


class Migration(migrations.Migration):

    dependencies = [
        ('cron_celery', '0011_buffered'),
    ]

    operations = [
        migrations.CreateModel(
            name='Tally',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('status', models.CharField(max_length=20)),
                ('bucket', models.SmallIntegerField(help_text='Durations: the number of histogram bounds below them (-1: never started)')),
                ('count', models.BigIntegerField(default=0)),
                ('seconds', models.FloatField(default=0.0, help_text='The durations added up')),
                ('job', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='tallies', to='cron_celery.cronjob')),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('job', 'status', 'bucket'), name='cron_tally_once')],
            },
        ),
        migrations.RunSQL(TRIGGER, DROP),
    ]
