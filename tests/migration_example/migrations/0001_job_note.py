# Keeps the rule: not atomic, lock_timeout set first and reset last both ways, the index built
# concurrently, every statement safe to run again.

from django.db import migrations

JOB, EXE = "cron_celery_cronjob", "cron_celery_cronexecution"


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("cron_celery", "0001_initial")]

    operations = [
        migrations.RunSQL("SET lock_timeout = '2s'", "RESET lock_timeout"),
        migrations.RunSQL(f"ALTER TABLE {JOB} ADD COLUMN IF NOT EXISTS example_note text NULL",
                          f"ALTER TABLE {JOB} DROP COLUMN IF EXISTS example_note"),
        migrations.RunSQL(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS cron_example_slot ON {EXE} (slot)",
                          "DROP INDEX CONCURRENTLY IF EXISTS cron_example_slot"),
        migrations.RunSQL("RESET lock_timeout", "SET lock_timeout = '2s'"),
    ]
