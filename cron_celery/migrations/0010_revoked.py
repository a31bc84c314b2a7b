# Revoked runs.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('cron_celery', '0009_schedule_problem'),
    ]

    operations: list[migrations.operations.base.Operation] = []
