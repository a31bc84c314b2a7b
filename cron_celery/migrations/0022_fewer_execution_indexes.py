# A run writes its execution row twice (the claim inserts it, the final write rewrites it, and
# that update changes indexed columns, so every index of the table gets a new entry each time).
# Six of its sixteen indexes served no query and only cost those writes (about a quarter of the
# WAL a run writes):
# - the three ``varchar_pattern_ops`` twins Django adds beside ``db_index=True`` on a CharField
#   (for LIKE 'x%'; nothing here filters executions that way, and the admin's search is icontains);
# - ``job_id`` alone and ``task_code`` alone: the unique (job, slot, run_number), (job, status) and
#   (task_code, execution_date) indexes lead with them;
# - ``task_name`` alone: only searched with icontains, which no b-tree index serves.
# The index on ``celery_task_id`` stays, renamed (no rebuild) to the name the model now gives it.

from django.db import migrations, models

EXE = "cron_celery_cronexecution"
OLD_TASK_ID = "cron_celery_cronexecution_celery_task_id_5fae1482"

FORWARD = f"""
DROP INDEX IF EXISTS {OLD_TASK_ID}_like;
DROP INDEX IF EXISTS cron_celery_cronexecution_task_code_df32618a_like;
DROP INDEX IF EXISTS cron_celery_cronexecution_task_name_684de7d4_like;
DROP INDEX IF EXISTS cron_celery_cronexecution_task_code_df32618a;
DROP INDEX IF EXISTS cron_celery_cronexecution_task_name_684de7d4;
DROP INDEX IF EXISTS cron_celery_cronexecution_job_id_b8dc483b;
DO $$ BEGIN
    IF to_regclass('{OLD_TASK_ID}') IS NOT NULL THEN
        ALTER INDEX {OLD_TASK_ID} RENAME TO cron_exec_task_id;
    ELSE
        CREATE INDEX IF NOT EXISTS cron_exec_task_id ON {EXE} (celery_task_id);
    END IF;
END $$;
"""

BACKWARD = f"""
ALTER INDEX cron_exec_task_id RENAME TO {OLD_TASK_ID};
CREATE INDEX {OLD_TASK_ID}_like ON {EXE} (celery_task_id varchar_pattern_ops);
CREATE INDEX cron_celery_cronexecution_task_code_df32618a ON {EXE} (task_code);
CREATE INDEX cron_celery_cronexecution_task_code_df32618a_like ON {EXE} (task_code varchar_pattern_ops);
CREATE INDEX cron_celery_cronexecution_task_name_684de7d4 ON {EXE} (task_name);
CREATE INDEX cron_celery_cronexecution_task_name_684de7d4_like ON {EXE} (task_name varchar_pattern_ops);
CREATE INDEX cron_celery_cronexecution_job_id_b8dc483b ON {EXE} (job_id);
"""


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
                migrations.AddIndex(model_name="cronexecution",
                                    index=models.Index(fields=["celery_task_id"], name="cron_exec_task_id")),
            ],
        ),
    ]
