# Jitter: a job's slots are sent a fixed offset after the slot (jitter_ms, written from its
# declaration at every start; 0 for every existing job). due_at = next_run_at + that offset is
# what the beat's "is anything due" reads, through its own index; a trigger keeps it, so every
# writer of next_run_at (the beat, schedule edits, the admin, raw SQL) keeps it true. An
# execution of a scheduled slot records when it was due (due_at), empty for the older ones.

from django.db import migrations, models

JOB = "cron_celery_cronjob"

FORWARD = f"""
CREATE FUNCTION cron_celery_job_due() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.due_at := NEW.next_run_at + make_interval(secs => NEW.jitter_ms / 1000.0);
    RETURN NEW;
END $$;
CREATE TRIGGER cron_celery_job_due BEFORE INSERT OR UPDATE OF next_run_at, jitter_ms, due_at ON {JOB}
    FOR EACH ROW EXECUTE FUNCTION cron_celery_job_due();
UPDATE {JOB} SET due_at = next_run_at;
"""

BACKWARD = f"""
DROP TRIGGER IF EXISTS cron_celery_job_due ON {JOB};
DROP FUNCTION IF EXISTS cron_celery_job_due();
"""


class Migration(migrations.Migration):

    dependencies = [
        ('cron_celery', '0015_concurrency_group'),
    ]

    operations = [
        migrations.AddField(
            model_name='cronjob',
            name='jitter_ms',
            field=models.IntegerField(db_default=0, help_text='Each slot is sent this many milliseconds after it (its jitter). Declared in code'),
        ),
        migrations.AddField(
            model_name='cronjob',
            name='due_at',
            field=models.DateTimeField(blank=True, db_index=True, editable=False, help_text='When the next slot is sent: next_run_at + jitter (UTC)', null=True),
        ),
        migrations.AddField(
            model_name='cronexecution',
            name='due_at',
            field=models.DateTimeField(blank=True, help_text='A scheduled slot: when it was due to be sent (the slot plus its jitter)', null=True),
        ),
        migrations.AlterField(
            model_name='cronexecution',
            name='waiting_since',
            field=models.DateTimeField(blank=True, help_text='PENDING or RETRYING with no room (overlap skip, max_concurrency, its concurrency group): when it began to wait (it runs when a run ends)', null=True),
        ),
        migrations.RunSQL(FORWARD, BACKWARD),
    ]
