# TOO_FAST alerts grouped into incidents like failures (issue 35, item 13): each job row keeps how many
# successes in a row were too fast and when that incident was last alerted; the outbox learns the
# recovery event. Two columns added to the jobs table, one nullable and one with a constant default:
# PostgreSQL writes neither into the existing rows (no rewrite), so the only wait is for the brief
# ACCESS EXCLUSIVE lock on cron_celery_cronjob, bounded by lock_timeout, set first and reset last in both
# directions (docs/migrating.md). When it runs out the migration fails, and it can be run again: both
# columns come in one ALTER TABLE, IF NOT EXISTS (and go IF EXISTS). The event's new choice changes no column.

from django.db import migrations, models

JOB = "cron_celery_cronjob"


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("cron_celery", "0024_removed_jobs")]

    operations = [
        migrations.RunSQL("SET lock_timeout = '5s'", "RESET lock_timeout"),
        migrations.RunSQL(
            f"ALTER TABLE {JOB} ADD COLUMN IF NOT EXISTS too_fast_in_a_row integer DEFAULT 0 NOT NULL, "
            "ADD COLUMN IF NOT EXISTS too_fast_alerted_at timestamp with time zone NULL",
            f"ALTER TABLE {JOB} DROP COLUMN IF EXISTS too_fast_alerted_at, DROP COLUMN IF EXISTS too_fast_in_a_row",
            state_operations=[
                migrations.AddField(
                    model_name="cronjob",
                    name="too_fast_in_a_row",
                    field=models.IntegerField(
                        db_default=0,
                        help_text="Successes in a row faster than min_runtime (a failure leaves the count alone)"),
                ),
                migrations.AddField(
                    model_name="cronjob",
                    name="too_fast_alerted_at",
                    field=models.DateTimeField(
                        blank=True, null=True,
                        help_text="When the open too-fast incident was last alerted; empty = none alerted"),
                ),
            ],
        ),
        migrations.AlterField(
            model_name="alert",
            name="event",
            field=models.CharField(choices=[
                ("FAILED", "Failed"), ("TIMED_OUT", "Timed out"), ("LOST", "Lost"), ("MISSED", "Missed"),
                ("RECOVERED", "Recovered"), ("SUCCEEDED", "Succeeded"), ("UPSTREAM", "Upstream failed"),
                ("LATE", "Late start"), ("LONG_RUNNING", "Running too long"), ("TOO_FAST", "Finished too fast"),
                ("TOO_FAST_RECOVERED", "Long enough again")], max_length=20),
        ),
        migrations.RunSQL("RESET lock_timeout", "SET lock_timeout = '5s'"),
    ]
