# The metrics endpoint reads, at every scrape, how many alerts each channel gave up on and when it
# last did; this partial index keeps that to the failed rows. Building it takes a lock that holds up
# writes to the outbox (and so the final writes that add alerts): ``lock_timeout`` bounds the wait
# for it; when it runs out the migration fails and can be run again.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("cron_celery", "0022_fewer_execution_indexes")]

    operations = [
        migrations.RunSQL("SET LOCAL lock_timeout = '10s'", migrations.RunSQL.noop),
        migrations.AddIndex(
            model_name="alert",
            index=models.Index(condition=models.Q(status="FAILED"), fields=["channel", "updated_at"],
                               name="cron_alert_failed"),
        ),
    ]
