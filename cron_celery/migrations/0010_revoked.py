# Revoked runs: the execution status REVOKED (also a job's last status).

from django.db import migrations, models

STATUSES = [
    ('PENDING', 'Pending'), ('RUNNING', 'Running'), ('RETRYING', 'Retrying'), ('SUCCEEDED', 'Succeeded'),
    ('FAILED', 'Failed'), ('TIMED_OUT', 'Timed out'), ('LOST', 'Lost'), ('SKIPPED', 'Skipped'),
    ('MISSED', 'Missed'), ('REVOKED', 'Revoked'),
]


class Migration(migrations.Migration):

    dependencies = [
        ('cron_celery', '0009_schedule_problem'),
    ]

    operations = [
        migrations.AlterField(
            model_name='cronexecution',
            name='status',
            field=models.CharField(choices=STATUSES, default='PENDING', max_length=20),
        ),
        migrations.AlterField(
            model_name='cronjob',
            name='last_status',
            field=models.CharField(blank=True, choices=STATUSES, max_length=20),
        ),
    ]
