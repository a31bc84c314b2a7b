# Buffered slots: an execution a person or the catch-up policy asked for waits for the live run
# of its overlap-skip job instead of being skipped; a --force run keeps its force when sent again.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('cron_celery', '0010_revoked'),
    ]

    operations = [
        migrations.AddField(
            model_name='cronexecution',
            name='force',
            field=models.BooleanField(db_default=False, help_text='Sent with --force: runs even while the job is paused, however often it is sent'),
        ),
        migrations.AddField(
            model_name='cronexecution',
            name='waiting_since',
            field=models.DateTimeField(blank=True, help_text='PENDING or RETRYING behind a live run of its overlap-skip job: when it began to wait (it runs when that run ends)', null=True),
        ),
    ]
