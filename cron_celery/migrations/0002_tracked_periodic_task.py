# A person's choice, in the admin, of whether one of django-celery-beat's periodic tasks is tracked as a job
# and with which catch-up policy (TrackedPeriodicTask). A new table: neither the jobs nor the executions
# table is touched, so it takes no lock on either (docs/migrating.md).

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('cron_celery', '0001_initial'),
        ('django_celery_beat', '0018_improve_crontab_helptext'),
    ]

    operations = [
        migrations.CreateModel(
            name='TrackedPeriodicTask',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('track', models.BooleanField(blank=True, help_text='Yes: tracked as a job (an execution per slot, sent and run once); no: sent untracked; empty: as TRACK_PERIODIC_TASKS says', null=True, verbose_name='tracked by cron_celery')),
                ('catch_up', models.CharField(blank=True, choices=[('none', 'None'), ('latest', 'Latest'), ('all', 'All')], help_text='Slots the beat missed while it was down: none (recorded MISSED), latest or all; empty: TRACKED_CATCH_UP', max_length=10)),
                ('periodic_task', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='cron_tracking', to='django_celery_beat.periodictask')),
            ],
            options={
                'verbose_name': 'tracking by cron_celery',
                'verbose_name_plural': 'tracking by cron_celery',
            },
        ),
    ]
