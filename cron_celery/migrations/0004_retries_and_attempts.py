# Retries, attempt history and the reconciler.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('cron_celery', '0003_beat_sync'),
    ]

    operations = [
        migrations.AddField(
            model_name='cronexecution',
            name='attempts',
            field=models.JSONField(blank=True, db_default=models.Value([], output_field=models.JSONField()), help_text='Every ended attempt: number, status, times, worker, fence, error'),
        ),
        migrations.AddField(
            model_name='cronexecution',
            name='republished',
            field=models.SmallIntegerField(db_default=0, help_text="How often the reconciler sent this execution's message again"),
        ),
        migrations.AddField(
            model_name='cronjob',
            name='max_retries',
            field=models.IntegerField(db_default=0, help_text='Attempts after the first one; enforced here, not only in the message'),
        ),
        migrations.AlterField(
            model_name='cronexecution',
            name='lease_until',
            field=models.DateTimeField(blank=True, help_text="RUNNING: the lease's end; RETRYING: when the next attempt is due", null=True),
        ),
        migrations.AddIndex(
            model_name='cronexecution',
            index=models.Index(condition=models.Q(('status__in', ['PENDING', 'RUNNING', 'RETRYING'])), fields=['status'], name='cron_exec_open'),
        ),
    ]
