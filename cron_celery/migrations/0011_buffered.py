# Buffered slots.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('cron_celery', '0010_revoked'),
    ]

    operations: list[migrations.operations.base.Operation] = []
