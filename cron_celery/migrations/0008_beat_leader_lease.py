# The beat leader's lease row in PostgreSQL (used when no Redis quorum answers).

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('cron_celery', '0007_operations'),
    ]

    operations: list[migrations.operations.base.Operation] = []
