# Scheduler sync with django-celery-beat: the schedule in effect and the edit triggers.

import django.db.models.deletion
from django.db import migrations, models

# Every edit of a job's periodic task (enabled, which schedule) or of the crontab/interval row
# it uses bumps the job's schedule_version, whatever made it: an admin form, an admin
# action's bulk update, the ORM or raw SQL. Disabling pauses the job at once and clears its
# next slot; the beat reads the new schedule of the bumped jobs only.
TRIGGERS = """
CREATE FUNCTION cron_celery_periodic_task_edited() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE cron_celery_cronjob
       SET schedule_version = schedule_version + 1,
           paused = NOT NEW.enabled,
           next_run_at = CASE WHEN NEW.enabled THEN next_run_at END
     WHERE periodic_task_id = NEW.id;
    RETURN NULL;
END $$;
CREATE TRIGGER cron_celery_periodic_task_edited
    AFTER UPDATE ON django_celery_beat_periodictask FOR EACH ROW
    WHEN (OLD.enabled IS DISTINCT FROM NEW.enabled
          OR OLD.crontab_id IS DISTINCT FROM NEW.crontab_id
          OR OLD.interval_id IS DISTINCT FROM NEW.interval_id
          OR OLD.solar_id IS DISTINCT FROM NEW.solar_id
          OR OLD.clocked_id IS DISTINCT FROM NEW.clocked_id)
    EXECUTE FUNCTION cron_celery_periodic_task_edited();

CREATE FUNCTION cron_celery_crontab_edited() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE cron_celery_cronjob AS job SET schedule_version = job.schedule_version + 1
      FROM django_celery_beat_periodictask AS task
     WHERE task.crontab_id = NEW.id AND job.periodic_task_id = task.id;
    RETURN NULL;
END $$;
CREATE TRIGGER cron_celery_crontab_edited
    AFTER UPDATE ON django_celery_beat_crontabschedule FOR EACH ROW
    WHEN (OLD IS DISTINCT FROM NEW)
    EXECUTE FUNCTION cron_celery_crontab_edited();

CREATE FUNCTION cron_celery_interval_edited() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE cron_celery_cronjob AS job SET schedule_version = job.schedule_version + 1
      FROM django_celery_beat_periodictask AS task
     WHERE task.interval_id = NEW.id AND job.periodic_task_id = task.id;
    RETURN NULL;
END $$;
CREATE TRIGGER cron_celery_interval_edited
    AFTER UPDATE ON django_celery_beat_intervalschedule FOR EACH ROW
    WHEN (OLD IS DISTINCT FROM NEW)
    EXECUTE FUNCTION cron_celery_interval_edited();
"""

DROP_TRIGGERS = """
DROP TRIGGER IF EXISTS cron_celery_periodic_task_edited ON django_celery_beat_periodictask;
DROP TRIGGER IF EXISTS cron_celery_crontab_edited ON django_celery_beat_crontabschedule;
DROP TRIGGER IF EXISTS cron_celery_interval_edited ON django_celery_beat_intervalschedule;
DROP FUNCTION IF EXISTS cron_celery_periodic_task_edited();
DROP FUNCTION IF EXISTS cron_celery_crontab_edited();
DROP FUNCTION IF EXISTS cron_celery_interval_edited();
"""


class Migration(migrations.Migration):

    dependencies = [
        ('cron_celery', '0002_schedule_state'),
        ('django_celery_beat', '0018_improve_crontab_helptext'),
    ]

    operations = [
        migrations.AddField(
            model_name='cronjob',
            name='declaration_hash',
            field=models.CharField(blank=True, db_default='', help_text="The code's schedule at the last sync", max_length=64),
        ),
        migrations.AddField(
            model_name='cronjob',
            name='periodic_task',
            field=models.OneToOneField(blank=True, help_text='Where the schedule is edited in the admin', null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='cron_job', to='django_celery_beat.periodictask'),
        ),
        migrations.AddField(
            model_name='cronjob',
            name='schedule',
            field=models.CharField(blank=True, db_default='', help_text="Five-field cron, or 'every Ns' for an interval", max_length=200),
        ),
        migrations.AddField(
            model_name='cronjob',
            name='schedule_seen',
            field=models.BigIntegerField(db_default=0),
        ),
        migrations.AddField(
            model_name='cronjob',
            name='schedule_timezone',
            field=models.CharField(blank=True, db_default='', max_length=64),
        ),
        migrations.AddField(
            model_name='cronjob',
            name='schedule_version',
            field=models.BigIntegerField(db_default=0),
        ),
        migrations.AddIndex(
            model_name='cronjob',
            index=models.Index(condition=models.Q(('schedule_version', models.F('schedule_seen')), _negated=True), fields=['id'], name='cron_job_schedule_edited'),
        ),
            migrations.RunSQL(TRIGGERS, DROP_TRIGGERS),
    ]
