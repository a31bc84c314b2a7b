# A job's catch-up window (catch_up_window=, declared in code): a slot the beat missed that is older than
# it is recorded MISSED whatever the job's catch-up policy says. One nullable column on the jobs table,
# which changes only the catalog; the executions table is not touched.

from django.db import migrations, models

JOB = "cron_celery_cronjob"


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("cron_celery", "0004_one_off_upstream_blocker")]

    operations = [
        migrations.RunSQL("SET lock_timeout = '2s'", "RESET lock_timeout"),
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(f"ALTER TABLE {JOB} ADD COLUMN IF NOT EXISTS catch_up_window double precision NULL",
                                  f"ALTER TABLE {JOB} DROP COLUMN IF EXISTS catch_up_window"),
            ],
            state_operations=[
                migrations.AddField(
                    model_name="cronjob", name="catch_up_window",
                    field=models.FloatField(
                        blank=True, null=True,
                        help_text="Seconds: a slot the beat missed that is older than this is recorded MISSED "
                                  "whatever catch_up says; empty = no window. Declared in code"),
                ),
            ],
        ),
        migrations.RunSQL("RESET lock_timeout", "SET lock_timeout = '2s'"),
    ]
