# Timing alerts: a job's start_deadline, max_runtime and min_runtime (declared in code), the alert
# events LATE, LONG_RUNNING and TOO_FAST, and on each execution whether its LATE or LONG_RUNNING
# alert was recorded (once per execution). The two partial indexes hold only the executions not
# started (or running) and not alerted yet, so the reconciler's checks cost what is in flight, not
# what the history holds. An alert row keeps what a timing alert was decided on (facts).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('cron_celery', '0018_windows_and_one_offs'),
    ]

    operations = [
        migrations.AddField(
            model_name='alert',
            name='facts',
            field=models.JSONField(blank=True, db_default=models.Value({}, output_field=models.JSONField()), help_text='What a timing alert was decided on: when a late run was due (due), when a long attempt started (started), how long a fast body took (runtime, seconds); empty for the others'),
        ),
        migrations.AddField(
            model_name='cronexecution',
            name='late_alerted',
            field=models.BooleanField(db_default=False, help_text="Its LATE alert was recorded (it had not started by the job's start_deadline)"),
        ),
        migrations.AddField(
            model_name='cronexecution',
            name='long_alerted',
            field=models.BooleanField(db_default=False, help_text="Its LONG_RUNNING alert was recorded (still running past the job's max_runtime)"),
        ),
        migrations.AddField(
            model_name='cronjob',
            name='max_runtime',
            field=models.FloatField(blank=True, help_text='Seconds a run may take before one LONG_RUNNING alert (it is not stopped); empty = no bound. Declared in code', null=True),
        ),
        migrations.AddField(
            model_name='cronjob',
            name='min_runtime',
            field=models.FloatField(blank=True, help_text='A success faster than this many seconds alerts TOO_FAST; empty = no bound. Declared in code', null=True),
        ),
        migrations.AddField(
            model_name='cronjob',
            name='start_deadline',
            field=models.FloatField(blank=True, help_text='Seconds after it was due by which a run must have started, else one LATE alert; empty = no deadline. Declared in code', null=True),
        ),
        migrations.AlterField(
            model_name='alert',
            name='event',
            field=models.CharField(choices=[('FAILED', 'Failed'), ('TIMED_OUT', 'Timed out'), ('LOST', 'Lost'), ('MISSED', 'Missed'), ('RECOVERED', 'Recovered'), ('SUCCEEDED', 'Succeeded'), ('UPSTREAM', 'Upstream failed'), ('LATE', 'Late start'), ('LONG_RUNNING', 'Running too long'), ('TOO_FAST', 'Finished too fast')], max_length=20),
        ),
        migrations.AddIndex(
            model_name='cronexecution',
            index=models.Index(condition=models.Q(('late_alerted', False), ('status', 'PENDING')), fields=['job'], name='cron_exec_late_unalerted'),
        ),
        migrations.AddIndex(
            model_name='cronexecution',
            index=models.Index(condition=models.Q(('long_alerted', False), ('status', 'RUNNING')), fields=['job'], name='cron_exec_long_unalerted'),
        ),
    ]
