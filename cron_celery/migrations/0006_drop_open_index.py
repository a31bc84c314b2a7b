# The reconciler reads open executions through the (job, status) index instead.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('cron_celery', '0005_alerts'),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name='cronexecution',
            name='cron_exec_open',
        ),
        migrations.AlterField(
            model_name='cronexecution',
            name='attempts',
            field=models.JSONField(blank=True, db_default=models.Value([], output_field=models.JSONField()), help_text='Every attempt once there were two or more: number, status, times, worker, fence, error'),
        ),
    ]
