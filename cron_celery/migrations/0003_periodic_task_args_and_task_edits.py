# An edit of a periodic task's args or task now reaches its job as an edit of its kwargs does: the trigger
# that marks the job for the beat to read its periodic task again (cron_celery_periodic_task_edited) fires
# on them too. A tracked periodic task's args are the values its runs are called with, and its task is
# checked against the Celery app's. Only the trigger on django-celery-beat's periodic task table changes:
# the jobs and the executions tables are not touched.

from django.db import migrations

EDITS = ("old.enabled IS DISTINCT FROM new.enabled", "old.crontab_id IS DISTINCT FROM new.crontab_id",
         "old.interval_id IS DISTINCT FROM new.interval_id", "old.solar_id IS DISTINCT FROM new.solar_id",
         "old.clocked_id IS DISTINCT FROM new.clocked_id", "old.start_time IS DISTINCT FROM new.start_time",
         "old.expires IS DISTINCT FROM new.expires", "old.one_off IS DISTINCT FROM new.one_off",
         "old.kwargs IS DISTINCT FROM new.kwargs")
NEW_EDITS = (*EDITS, "old.args IS DISTINCT FROM new.args", "old.task IS DISTINCT FROM new.task")


def trigger(edits: tuple[str, ...]) -> str:
    return f"""
    DROP TRIGGER IF EXISTS cron_celery_periodic_task_edited ON django_celery_beat_periodictask;
    CREATE TRIGGER cron_celery_periodic_task_edited AFTER UPDATE ON django_celery_beat_periodictask
        FOR EACH ROW WHEN ({' OR '.join(f'({edit})' for edit in edits)})
        EXECUTE FUNCTION cron_celery_periodic_task_edited();
    """


class Migration(migrations.Migration):

    dependencies = [
        ('cron_celery', '0002_tracked_periodic_task'),
    ]

    operations = [
        migrations.RunSQL(trigger(NEW_EDITS), reverse_sql=trigger(EDITS)),
    ]
