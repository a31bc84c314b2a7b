# Alerts: the outbox, the per-job alert policy and the Sentry check-in id.

import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('cron_celery', '0004_retries_and_attempts'),
    ]

    operations = [
        migrations.AddField(
            model_name='cronexecution',
            name='sentry_checkin_id',
            field=models.CharField(blank=True, db_default='', max_length=64),
        ),
        migrations.AddField(
            model_name='cronjob',
            name='alert_after',
            field=models.IntegerField(db_default=1, help_text='Consecutive failures before the first alert'),
        ),
        migrations.AddField(
            model_name='cronjob',
            name='alert_repeat',
            field=models.IntegerField(blank=True, help_text='Seconds between repeated alerts of one incident; empty = once', null=True),
        ),
        migrations.AddField(
            model_name='cronjob',
            name='alerted_at',
            field=models.DateTimeField(blank=True, help_text='When the open incident was last alerted; empty = no alerted incident', null=True),
        ),
        migrations.CreateModel(
            name='Alert',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('event', models.CharField(choices=[('FAILED', 'Failed'), ('TIMED_OUT', 'Timed out'), ('LOST', 'Lost'), ('MISSED', 'Missed'), ('RECOVERED', 'Recovered'), ('SUCCEEDED', 'Succeeded')], max_length=20)),
                ('channel', models.CharField(max_length=200)),
                ('status', models.CharField(choices=[('PENDING', 'Pending'), ('SENT', 'Sent'), ('FAILED', 'Failed')], default='PENDING', max_length=10)),
                ('attempts', models.IntegerField(default=0)),
                ('last_error', models.TextField(blank=True)),
                ('created_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('updated_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('sent_at', models.DateTimeField(blank=True, null=True)),
                ('execution', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='alerts', to='cron_celery.cronexecution')),
                ('job', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='alerts', to='cron_celery.cronjob')),
            ],
            options={
                'ordering': ['-created_at'],
                'indexes': [models.Index(condition=models.Q(('status', 'PENDING')), fields=['updated_at'], name='cron_alert_pending')],
                'constraints': [models.UniqueConstraint(fields=('execution', 'event', 'channel'), name='cron_alert_once')],
            },
        ),
    ]
