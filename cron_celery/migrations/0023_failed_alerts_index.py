# The metrics endpoint counts the alerts given up on (FAILED) by channel at every scrape; this partial
# index keeps that to the failed rows (few) however long the outbox's history is.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("cron_celery", "0022_fewer_execution_indexes")]

    operations = [
        migrations.AddIndex(
            model_name="alert",
            index=models.Index(condition=models.Q(status="FAILED"), fields=["channel"], name="cron_alert_failed"),
        ),
    ]
