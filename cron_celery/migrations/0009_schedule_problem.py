# Why an admin edit of a job's schedule could not be applied.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('cron_celery', '0008_beat_leader_lease'),
    ]

    operations: list[migrations.operations.base.Operation] = []
