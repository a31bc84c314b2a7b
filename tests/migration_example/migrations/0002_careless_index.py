# Breaks the rule: atomic, no lock_timeout, an index built under the table's lock.

from django.db import migrations

EXE = "cron_celery_cronexecution"


class Migration(migrations.Migration):
    dependencies = [("cron_celery_example", "0001_job_note")]

    operations = [
        migrations.RunSQL(f"CREATE INDEX cron_example_careless ON {EXE} (due_at)",
                          "DROP INDEX cron_example_careless"),
    ]
