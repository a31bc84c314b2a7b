# A run writes its execution row twice (the claim inserts it, the final write rewrites it, and
# that update changes indexed columns, so every index of the table gets a new entry each time).
# Seven of its sixteen indexes served no query and only cost those writes (about a quarter of the
# WAL a run writes):
# - the three ``varchar_pattern_ops`` twins Django adds beside ``db_index=True`` on a CharField
#   (for LIKE 'x%'; nothing here filters executions that way, and the admin's search is icontains);
# - ``job_id`` alone and ``task_code`` alone: the unique (job, slot, run_number), (job, status) and
#   (task_code, execution_date) indexes lead with them;
# - ``task_name`` and ``celery_task_id`` alone: only searched with icontains, which no b-tree index
#   serves; the package never looks an execution up by its Celery task id.
# Dropping an index takes a brief exclusive lock on the table: ``lock_timeout`` bounds how long the
# migration waits for it (and so how long it holds up the claims queued behind it); when it runs
# out the migration fails and can be run again.

from django.db import migrations, models

EXE = "cron_celery_cronexecution"
DROPPED = {
    "cron_celery_cronexecution_celery_task_id_5fae1482": "celery_task_id",
    "cron_celery_cronexecution_celery_task_id_5fae1482_like": "celery_task_id varchar_pattern_ops",
    "cron_celery_cronexecution_task_code_df32618a": "task_code",
    "cron_celery_cronexecution_task_code_df32618a_like": "task_code varchar_pattern_ops",
    "cron_celery_cronexecution_task_name_684de7d4": "task_name",
    "cron_celery_cronexecution_task_name_684de7d4_like": "task_name varchar_pattern_ops",
    "cron_celery_cronexecution_job_id_b8dc483b": "job_id",
}

FORWARD = "SET LOCAL lock_timeout = '10s';\n" + "".join(f"DROP INDEX IF EXISTS {name};\n" for name in DROPPED)
BACKWARD = "".join(f"CREATE INDEX IF NOT EXISTS {name} ON {EXE} ({columns});\n" for name, columns in DROPPED.items())


class Migration(migrations.Migration):
    dependencies = [("cron_celery", "0021_schedule_audit")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(FORWARD, BACKWARD)],
            state_operations=[
                migrations.AlterField(
                    model_name="cronexecution", name="job",
                    field=models.ForeignKey(db_index=False, on_delete=models.deletion.CASCADE,
                                            related_name="executions", to="cron_celery.cronjob"),
                ),
                migrations.AlterField(model_name="cronexecution", name="task_code",
                                      field=models.CharField(max_length=50)),
                migrations.AlterField(model_name="cronexecution", name="task_name",
                                      field=models.CharField(max_length=100)),
                migrations.AlterField(model_name="cronexecution", name="celery_task_id",
                                      field=models.CharField(blank=True, max_length=255)),
            ],
        ),
    ]
